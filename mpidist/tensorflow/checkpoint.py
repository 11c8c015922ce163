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

``restore`` is TensorFlow's ``checkpoint.restore`` on every rank (all ranks read the same files,
so variables come back identical everywhere; sync-on-read SUM variables get 1/size of the saved
total each, so their global value is the saved one).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from ..cross_device.reduce_op import ReduceOp
from . import reductions
from .strategy import MPIStrategy


def _strategy(strategy: Any, where: str) -> MPIStrategy:
    if strategy is None:
        strategy = tf.distribute.get_strategy()
    if not isinstance(strategy, MPIStrategy):
        raise TypeError(f"{where}: `strategy` must be an mpidist strategy (or None inside one's scope), "
                        f"got {type(strategy).__name__}")
    return strategy


def _aggregate_sync_on_read(strategy: MPIStrategy, where: str) -> dict[int, tf.Tensor]:
    ext = strategy.extended
    groups: dict[ReduceOp, list[Any]] = {}
    for v in ext.live_sync_on_read_variables():
        if v.aggregation in (tf.VariableAggregation.SUM, tf.VariableAggregation.MEAN):
            groups.setdefault(ReduceOp.from_variable_aggregation(v.aggregation), []).append(v)
    ops = (ReduceOp.SUM, ReduceOp.MEAN)  # the same order on every rank
    counts = ext._engine.allgather(np.array([[len(groups.get(op, [])) for op in ops]], dtype=np.int64))
    if any((row != counts[0]).any() for row in counts):
        raise ValueError(f"{where}: ranks hold different sync-on-read variables (metrics): (SUM, MEAN) counts "
                         f"{', '.join(f'rank {r}: {tuple(int(c) for c in row)}' for r, row in enumerate(counts))}; "
                         f"every rank must create the same metrics in the same order")
    found: dict[int, tf.Tensor] = {}
    for op in ops:
        group = groups.get(op, [])
        if group:
            reduced = reductions.reduce_tensors(ext._engine, op, [v._values[0] for v in group], None,
                                                ext._default_call, where)
            found.update({id(v): r for v, r in zip(group, reduced)})
    return found


def _share_outcome(strategy: MPIStrategy, text: str | None, error: BaseException | None, where: str) -> str:
    """Rank 0's path (or error) on every rank, through one allgather (others send nothing)."""
    if strategy.extended._rank == 0:
        payload = (b"E" + f"{type(error).__name__}: {error}".encode()) if error is not None \
            else b"P" + (text or "").encode()
    else:
        payload = b""
    gathered = bytes(strategy.engine.allgather(np.frombuffer(payload, dtype=np.uint8).copy()))
    if gathered[:1] == b"E":
        if error is not None:
            raise error
        raise RuntimeError(f"{where}: rank 0 failed to write the checkpoint: {gathered[1:].decode()}")
    return gathered[1:].decode()


def _save(strategy: MPIStrategy, checkpoint: Any, write_on_chief: Any, on_others: Any, where: str) -> str:
    ext = strategy.extended
    ext._saved_reads = _aggregate_sync_on_read(strategy, where)
    path, error = None, None
    try:
        if ext._rank == 0:
            path = write_on_chief()
        else:
            on_others()
    except Exception as e:  # rank 0's failure must reach the others, which wait for its path
        if ext._rank != 0:
            raise
        error = e
    finally:
        ext._saved_reads = {}
    return _share_outcome(strategy, None if path is None else str(path), error, where)


def save(checkpoint: tf.train.Checkpoint, file_prefix: str, *, strategy: Any = None, options: Any = None) -> str:
    """Collective ``checkpoint.save(file_prefix)``: rank 0 writes; returns the path on every rank."""
    where = "mpidist.tensorflow.checkpoint.save"
    strategy = _strategy(strategy, where)
    if not hasattr(checkpoint, "save_counter"):
        raise TypeError(f"{where}: `checkpoint` must be a tf.train.Checkpoint, got {type(checkpoint).__name__}")
    counter = checkpoint.save_counter  # created on every rank
    return _save(strategy, checkpoint, lambda: checkpoint.save(file_prefix, options=options),
                 lambda: counter.assign_add(1), where)


def write(checkpoint: tf.train.Checkpoint, file_path: str, *, strategy: Any = None, options: Any = None) -> str:
    """Collective ``checkpoint.write(file_path)`` (no save counter): rank 0 writes."""
    where = "mpidist.tensorflow.checkpoint.write"
    strategy = _strategy(strategy, where)
    return _save(strategy, checkpoint, lambda: checkpoint.write(file_path, options=options), lambda: None, where)


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
    saved = _save(strategy, manager.checkpoint, lambda: manager.save(checkpoint_number) or "",
                  lambda: None, where)
    if strategy.extended._rank != 0 and saved:
        counter.assign_add(1)
    return saved


def restore(checkpoint: tf.train.Checkpoint, save_path: str, *, options: Any = None) -> Any:
    """``checkpoint.restore(save_path)`` on every rank (every rank reads the chief's files)."""
    return checkpoint.restore(save_path, options=options)
