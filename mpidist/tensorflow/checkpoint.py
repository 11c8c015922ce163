"""Checkpoints under an mpidist strategy: written by the chief, restored by every rank.

``tf.train.Checkpoint.save`` does not look at ``should_checkpoint``, and every rank writing the
same path races. ``save`` here is collective (every rank calls it, in the same place):

1. the checkpoint's ``save_counter`` exists on every rank (creating it alone on the chief would
   leave the ranks' counters, and checkpoint numbers, different);
2. sync-on-read variables (Keras metrics) are aggregated over ranks, in one engine call per
   aggregation kind, so the chief saves the global values without a collective of its own
   (TensorFlow reads them through ``strategy.reduce`` while saving);
3. rank 0 writes; the other ranks only advance their ``save_counter``;
4. rank 0 sends the written path (or its error) to every rank: when ``save`` returns, the files
   are complete, and every rank returns the same path (or raises the same error).

``on_chief`` is the general form (any write on the chief, the outcome shared in one allgather:
an error on any rank is raised on every rank). ``mpidist.keras`` routes ``tf.train.Checkpoint.save``
/ ``write``, ``CheckpointManager.save`` and Keras's writing callbacks through it, so user code that
calls them on every rank needs no change.

``restore`` is TensorFlow's ``checkpoint.restore`` on every rank (all ranks read the same files,
so variables come back identical everywhere; sync-on-read SUM variables get 1/size of the saved
total each, so their global value is the saved one).
"""
from __future__ import annotations

import contextvars
import gc
import hashlib
import os
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from ..cross_device.reduce_op import ReduceOp
from . import reductions
from .strategy import MPIStrategy


_WRITING = contextvars.ContextVar("mpidist_chief_writing", default=False)


def chief_writing() -> bool:
    """Whether this code runs inside ``on_chief``'s write on the chief (where no collective may start)."""
    return _WRITING.get()


def _strategy(strategy: Any, where: str) -> MPIStrategy:
    if strategy is None:
        strategy = tf.distribute.get_strategy()
    if not isinstance(strategy, MPIStrategy):
        raise TypeError(f"{where}: `strategy` must be an mpidist strategy (or None inside one's scope), "
                        f"got {type(strategy).__name__}")
    return strategy


def _aggregate_sync_on_read(strategy: MPIStrategy, where: str) -> dict[int, tf.Tensor]:
    ext = strategy.extended
    gc.collect()  # metrics of dropped models: gone on every rank, not only where the collector ran
    groups: dict[ReduceOp, list[Any]] = {}
    for v in ext.live_sync_on_read_variables():
        if v.aggregation in (tf.VariableAggregation.SUM, tf.VariableAggregation.MEAN):
            groups.setdefault(ReduceOp.from_variable_aggregation(v.aggregation), []).append(v)
    ops = (ReduceOp.SUM, ReduceOp.MEAN)  # the same order on every rank
    counts = ext.engine.allgather(np.array([[len(groups.get(op, [])) for op in ops]], dtype=np.int64))
    if any((row != counts[0]).any() for row in counts):
        raise ValueError(f"{where}: ranks hold different sync-on-read variables (metrics): (SUM, MEAN) counts "
                         f"{', '.join(f'rank {r}: {tuple(int(c) for c in row)}' for r, row in enumerate(counts))}; "
                         f"every rank must create the same metrics in the same order")
    found: dict[int, tf.Tensor] = {}
    for op in ops:
        group = groups.get(op, [])
        if group:
            reduced = reductions.reduce_tensors(ext.engine, op, [v.values[0] for v in group], None,
                                                ext.default_call_options, where)
            found.update({id(v): r for v, r in zip(group, reduced)})
    return found


def _record(payload: bytes) -> np.ndarray:
    return np.frombuffer(len(payload).to_bytes(4, "big") + payload, dtype=np.uint8).copy()


def share_outcome(strategy: MPIStrategy, text: str | None, error: BaseException | None, where: str) -> str:
    """Collective: every rank's outcome in one allgather; rank 0's ``text`` returned on every rank.

    Each rank sends its own error (or none); rank 0 also sends ``text`` (a written path). If any
    rank failed, every rank raises: its own exception where it had one, else a RuntimeError
    naming the ranks that failed and why. So no rank is left waiting for a write that failed.
    """
    if error is not None:
        payload = b"E" + f"{type(error).__name__}: {error}".encode()
    else:
        payload = b"P" + ((text or "").encode() if strategy.extended.rank == 0 else b"")
    gathered = bytes(strategy.engine.allgather(_record(payload), options=strategy.extended.default_call_options))
    records, offset = [], 0
    while offset < len(gathered):
        size = int.from_bytes(gathered[offset:offset + 4], "big")
        records.append(gathered[offset + 4:offset + 4 + size])
        offset += 4 + size
    failed = [(rank, r[1:].decode()) for rank, r in enumerate(records) if r[:1] == b"E"]
    if failed:
        if error is not None:
            raise error
        raise RuntimeError(f"{where}: " + "; ".join(f"rank {rank} failed: {message}" for rank, message in failed))
    return records[0][1:].decode()


def on_chief(strategy: MPIStrategy, write_on_chief: Callable[[], Any], where: str, *,
             on_others: Callable[[], Any] | None = None, aggregate: bool = True) -> str:
    """Collective: ``write_on_chief()`` on rank 0, ``on_others()`` elsewhere, then ``share_outcome``.

    With ``aggregate``, sync-on-read variables (Keras metrics) are aggregated first on every rank,
    so the chief reads their global values while writing without a collective of its own. Returns
    ``str(write_on_chief())`` on every rank ("" for None); raises on every rank if any rank failed.
    """
    ext = strategy.extended
    result, error = None, None
    try:
        if aggregate:
            ext.saved_reads = _aggregate_sync_on_read(strategy, where)
        if ext.rank == 0:
            token = _WRITING.set(True)
            try:
                result = write_on_chief()
            finally:
                _WRITING.reset(token)
        elif on_others is not None:
            on_others()
    except Exception as e:  # noqa: BLE001 -- every rank must reach share_outcome, whatever failed
        error = e
    finally:
        ext.saved_reads = {}
    return share_outcome(strategy, None if result is None else str(result), error, where)


def any_rank(strategy: MPIStrategy, flag: bool) -> bool:
    """Collective: whether ``flag`` is true on any rank (one tiny allreduce)."""
    found = strategy.engine.allreduce(np.array([bool(flag)]), "max", options=strategy.extended.default_call_options)
    return bool(found[0])


def same_on_every_rank(strategy: MPIStrategy, path: Any) -> bool:
    """Collective: whether every rank passed the same ``path`` (one allreduce of its hash's bounds).

    Ranks that each name a path of their own write it themselves (nothing is shared, nothing
    races); one path named by every rank is written by the chief alone.
    """
    digest = np.frombuffer(hashlib.sha256(os.fspath(path).encode()).digest()[:8], dtype=np.int64)
    low_high = np.concatenate([digest, -digest])
    found = strategy.engine.allreduce(low_high, "min", options=strategy.extended.default_call_options)
    return bool(found[0] == -found[1])


def save(checkpoint: tf.train.Checkpoint, file_prefix: str, *, strategy: Any = None, options: Any = None) -> str:
    """Collective ``checkpoint.save(file_prefix)``: rank 0 writes; returns the path on every rank."""
    where = "mpidist.tensorflow.checkpoint.save"
    strategy = _strategy(strategy, where)
    if not hasattr(checkpoint, "save_counter"):
        raise TypeError(f"{where}: `checkpoint` must be a tf.train.Checkpoint, got {type(checkpoint).__name__}")
    counter = checkpoint.save_counter  # created on every rank
    return on_chief(strategy, lambda: checkpoint.save(file_prefix, options=options), where,
                    on_others=lambda: counter.assign_add(1))


def write(checkpoint: tf.train.Checkpoint, file_path: str, *, strategy: Any = None, options: Any = None) -> str:
    """Collective ``checkpoint.write(file_path)`` (no save counter): rank 0 writes."""
    where = "mpidist.tensorflow.checkpoint.write"
    strategy = _strategy(strategy, where)
    return on_chief(strategy, lambda: checkpoint.write(file_path, options=options), where)


def save_manager(manager: tf.train.CheckpointManager, checkpoint_number: Any = None, *,
                 strategy: Any = None) -> str:
    """Collective ``manager.save(checkpoint_number)``; rank 0 writes and sweeps old checkpoints.

    Returns the path on every rank ("" when the manager's ``checkpoint_interval`` skipped it).
    """
    where = "mpidist.tensorflow.checkpoint.save_manager"
    strategy = _strategy(strategy, where)
    if not isinstance(manager, tf.train.CheckpointManager):
        raise TypeError(f"{where}: `manager` must be a tf.train.CheckpointManager, got {type(manager).__name__}")
    counter = manager.checkpoint.save_counter
    saved = on_chief(strategy, lambda: manager.save(checkpoint_number) or "", where)
    if strategy.extended.rank != 0 and saved:
        counter.assign_add(1)
    return saved


def restore(checkpoint: tf.train.Checkpoint, save_path: str, *, options: Any = None) -> Any:
    """``checkpoint.restore(save_path)`` on every rank (every rank reads the chief's files)."""
    return checkpoint.restore(save_path, options=options)
