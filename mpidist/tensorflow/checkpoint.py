"""Checkpoints and saved models under an mpidist strategy: every pattern programs use, no hang.

A save is not a collective the chief waits in, because programs save in three ways (see
mpidist/collectives/notices.py): every rank to one path, every rank to paths of its own (TensorFlow's
multi-worker tutorials), or the chief alone (``if strategy.extended.should_checkpoint``, Horovod's
``if hvd.rank() == 0``). What a save writes needs nothing from the other ranks: mirrored variables
are equal everywhere, so each rank's own values are the global ones. ``save_once`` runs one save:

1. sync-on-read variables (SUM / MEAN) in what is saved are the exception: their saved value is
   the aggregate over ranks, one collective (``aggregate_sync_on_read``). Such a save must be made
   on every rank (each may name its own path); on the chief alone it is an error on every rank
   within seconds, naming this rule: the others' next collective disagrees with it (the agreement
   check reports the label, on every rank), or, when they make none, the aggregation's deadline
   (``SYNC_ON_READ_TIMEOUT``) ends it;
2. the chief writes, then publishes what it wrote (or its error) to the other ranks, never waiting;
3. another rank that saves follows the chief's save at the same point: the same path (every rank
   saving one checkpoint) is not written again, and the call returns once the chief's files are
   complete, with the chief's result (or raising the chief's error); a path of its own is written
   by that rank itself.

``restore`` is TensorFlow's ``checkpoint.restore`` (every rank reads the files; variables come back
equal everywhere). ``mpidist.keras`` routes ``tf.train.Checkpoint.save`` / ``write``,
``CheckpointManager.save``, Keras's saving functions and writing callbacks through ``save_once``,
so programs need no change.
"""
from __future__ import annotations

import contextvars
import os
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from ..collectives import notices
from ..errors import CollectiveMismatchError, DeadlineExceededError
from . import _tf_private, variables
from .strategy import MPIStrategy

SYNC_ON_READ_TIMEOUT = 60.0  # seconds the aggregation of sync-on-read variables in a save may wait
_LABEL = "save of sync-on-read variables: every rank must make it"  # shows in mismatch reports
_SAVING = contextvars.ContextVar("mpidist_saving", default=False)


def inside_save() -> bool:
    """Whether this code runs inside ``save_once`` (nested saves are plain writes of this rank)."""
    return _SAVING.get()


def _strategy(strategy: Any, where: str) -> MPIStrategy:
    if strategy is None:
        strategy = tf.distribute.get_strategy()
    if not isinstance(strategy, MPIStrategy):
        raise TypeError(f"{where}: `strategy` must be an mpidist strategy (or None inside one's scope), "
                        f"got {type(strategy).__name__}")
    return strategy


def key_of(path: Any) -> str:
    """The path as ranks compare it (absolute, unless remote)."""
    path = os.fspath(path)
    return path if "://" in path else os.path.abspath(path)


def sync_on_read_in(strategy: MPIStrategy, trackable: Any) -> list[Any]:
    """The SUM / MEAN sync-on-read variables of ``strategy`` that saving ``trackable`` (or each of a
    list or tuple of trackables) writes."""
    if trackable is None:
        return []
    roots = trackable if isinstance(trackable, (list, tuple)) else [trackable]
    found, seen = [], set()
    for node in (n for root in roots for n in tf.train.TrackableView(root).descendants()):
        for obj in _variables_of(node):
            if (_tf_private.is_sync_on_read(obj) and id(obj) not in seen
                    and _tf_private.owning_strategy(obj) is strategy
                    and obj.aggregation in (tf.VariableAggregation.SUM, tf.VariableAggregation.MEAN)):
                seen.add(id(obj))
                found.append(obj)
    return found


def _variables_of(node: Any) -> tuple[Any, ...]:
    """``node``, and the TensorFlow variable inside it when it is a Keras 3 variable (its public
    ``value`` property: the checkpoint graph holds the Keras variable, the save reads the inner one)."""
    if isinstance(getattr(type(node), "value", None), property):
        return node, node.value
    return (node,)


def aggregate_sync_on_read(strategy: MPIStrategy, variables: list[Any], where: str) -> dict[int, tf.Tensor]:
    """Collective: the aggregate of each variable (one allreduce per aggregation kind), by id."""
    found: dict[int, tf.Tensor] = {}
    for aggregation, op in ((tf.VariableAggregation.SUM, "sum"), (tf.VariableAggregation.MEAN, "mean")):
        group = [v for v in variables if v.aggregation == aggregation]
        if not group:
            continue
        local = [np.asarray(v.values[0].numpy()) for v in group]
        try:
            reduced = strategy.engine.allreduce({_LABEL: local}, op, timeout_seconds=SYNC_ON_READ_TIMEOUT)[_LABEL]
        except (CollectiveMismatchError, DeadlineExceededError) as error:
            names = ", ".join(v.name for v in variables[:4]) + (" ..." if len(variables) > 4 else "")
            raise ValueError(
                f"{where}: what is saved holds sync-on-read variables ({names}), whose saved value is their "
                f"aggregate over every rank: call this save on every rank (each may name its own path), not on "
                f"the chief alone ({type(error).__name__}: {str(error).splitlines()[0]})") from error
        found.update({id(v): tf.constant(r, dtype=v.dtype) for v, r in zip(group, reduced)})
    return found


def save_once(strategy: MPIStrategy, kind: str, path: Any, write: Callable[[], Any], *, trackable: Any = None,
              extra: Callable[[], dict] | None = None,
              on_followed: Callable[[notices.Notice], None] | None = None) -> tuple[Any, notices.Notice | None]:
    """One save of ``kind`` to ``path`` by this rank (see the module docstring).

    ``write()`` writes and returns the result; ``extra()`` (on the chief) adds facts to its notice;
    ``on_followed(notice)`` runs on a rank that did not write because the chief wrote ``path``.
    Returns ``(result, None)`` when this rank wrote, ``(None, notice)`` when it followed the chief.
    """
    engine, ext = strategy.engine, strategy.extended
    key = key_of(path)
    save = notices.begin(engine, kind, key)
    token = _SAVING.set(True)
    try:
        ext.saved_reads = aggregate_sync_on_read(strategy, sync_on_read_in(strategy, trackable), kind)
        with variables.own_variables():  # what a save creates is this rank's own: no collective
            return _write_or_follow(engine, save, key, write, extra, on_followed)
    finally:
        ext.saved_reads = {}
        _SAVING.reset(token)
        notices.finish(engine, save)


def _write_or_follow(engine: Any, save: notices.Save, key: str, write: Callable[[], Any],
                     extra: Callable[[], dict] | None,
                     on_followed: Callable[[notices.Notice], None] | None) -> tuple[Any, notices.Notice | None]:
    """Steps 2 and 3 of the module docstring."""
    if engine.rank == 0:
        try:
            result = write()
        except Exception as error:
            notices.publish(engine, save, key, error=error)
            raise
        notices.publish(engine, save, key, "" if result is None else str(result),
                        extra=extra() if extra is not None else None)
        return result, None
    notice = notices.follow(engine, save, key)
    if notice is None or notice.path != key:
        return write(), None
    if notice.error is not None:
        raise RuntimeError(f"{save.kind}: rank 0 (the chief) failed to write {key}, which every rank saves: "
                           f"rank 0 failed: {notice.error}")
    if on_followed is not None:
        on_followed(notice)
    return None, notice


def save(checkpoint: tf.train.Checkpoint, file_prefix: str, *, strategy: Any = None, options: Any = None) -> str:
    """``checkpoint.save(file_prefix)`` by this rank under ``strategy``; returns the path written
    (the chief's, when every rank saves one prefix: then every rank's ``save_counter`` is the chief's)."""
    where = "mpidist.tensorflow.checkpoint.save"
    strategy = _strategy(strategy, where)
    if not hasattr(checkpoint, "save_counter"):
        raise TypeError(f"{where}: `checkpoint` must be a tf.train.Checkpoint, got {type(checkpoint).__name__}")
    counter = checkpoint.save_counter
    result, notice = save_once(
        strategy, "tf.train.Checkpoint.save", file_prefix, lambda: checkpoint.save(file_prefix, options=options),
        trackable=checkpoint, extra=lambda: {"save_counter": int(counter.numpy())},
        on_followed=lambda n: counter.assign(n.extra["save_counter"]))
    return notice.result if notice is not None else result


def write(checkpoint: tf.train.Checkpoint, file_path: str, *, strategy: Any = None, options: Any = None) -> str:
    """``checkpoint.write(file_path)`` (no save counter) by this rank under ``strategy``."""
    strategy = _strategy(strategy, "mpidist.tensorflow.checkpoint.write")
    result, notice = save_once(strategy, "tf.train.Checkpoint.write", file_path,
                               lambda: checkpoint.write(file_path, options=options), trackable=checkpoint)
    return notice.result if notice is not None else result


def save_manager(manager: tf.train.CheckpointManager, checkpoint_number: Any = None, *, strategy: Any = None,
                 check_interval: bool = True, options: Any = None,
                 on_followed: Callable[[notices.Notice], None] | None = None) -> str | None:
    """``manager.save(checkpoint_number)`` by this rank under ``strategy``: the path, or None when the
    manager's ``checkpoint_interval`` skipped it. A rank that follows the chief into the chief's
    directory takes the chief's save counter; ``on_followed`` brings its manager's state up to date."""
    where = "mpidist.tensorflow.checkpoint.save_manager"
    strategy = _strategy(strategy, where)
    if not isinstance(manager, tf.train.CheckpointManager):
        raise TypeError(f"{where}: `manager` must be a tf.train.CheckpointManager, got {type(manager).__name__}")
    counter = manager.checkpoint.save_counter

    def followed(notice: notices.Notice) -> None:
        counter.assign(notice.extra["save_counter"])
        if on_followed is not None:
            on_followed(notice)

    result, notice = save_once(
        strategy, "tf.train.CheckpointManager.save", manager.directory,
        lambda: manager.save(checkpoint_number, check_interval=check_interval, options=options),
        trackable=manager.checkpoint, extra=lambda: {"save_counter": int(counter.numpy())}, on_followed=followed)
    if notice is not None:
        return notice.result or None
    return result


def restore(checkpoint: tf.train.Checkpoint, save_path: str, *, options: Any = None) -> Any:
    """``checkpoint.restore(save_path)`` on this rank (every rank reads the same files)."""
    return checkpoint.restore(save_path, options=options)
