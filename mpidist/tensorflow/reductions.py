"""Reductions of lists of tensors across ranks, with or without an axis, and their arguments.

``reduce_tensors`` is what ``strategy.reduce``, ``extended.reduce_to``/``batch_reduce_to`` and
``ReplicaContext.all_reduce`` come down to: one engine call for the whole list.

With ``axis``, each rank first reduces along it locally; MEAN then divides the global SUM by the
GLOBAL element count along ``axis`` (sums and counts travel in the same engine call), so ranks
whose last batch is short, or empty, weigh exactly as single-process code would. A scalar
reduced along axis 0 counts as one element (Keras's multi-worker path calls
``reduce("MEAN", scalar, axis=0)``, where TensorFlow's own strategies raise).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import tensorflow as tf

from ..cross_device.options import CommunicationOptions, as_options
from ..cross_device.reduce_op import ReduceOp, as_reduce_op
from ..validation import is_integer
from . import buckets, collectives
from .collectives import CallOptions

_LOCAL: dict[ReduceOp, Callable[..., tf.Tensor]] = {
    ReduceOp.SUM: tf.reduce_sum, ReduceOp.MIN: tf.reduce_min, ReduceOp.MAX: tf.reduce_max,
    ReduceOp.PROD: tf.reduce_prod}

def parse_op(op: Any, where: str) -> ReduceOp:
    """``op`` as mpidist's ReduceOp: one, a name in any case, or TensorFlow's ReduceOp."""
    return as_reduce_op(op, where)


def parse_axis(axis: Any, where: str) -> int | tuple[int, ...] | None:
    """None, an int, or a tuple of ints (a list is accepted); anything else is an error."""
    if axis is None:
        return None
    if is_integer(axis):
        return int(axis)
    if isinstance(axis, (list, tuple)) and axis and all(is_integer(a) for a in axis):
        return tuple(int(a) for a in axis)
    raise TypeError(f"{where}: `axis` must be an int, a list/tuple of ints, or None, got {axis!r}")


def _check_axis(t: tf.Tensor, axis: int | tuple[int, ...], where: str, index: int) -> None:
    rank = t.shape.rank
    if rank is None:
        return
    for a in (axis if isinstance(axis, tuple) else (axis,)):
        if not -rank <= a < rank:
            raise ValueError(f"{where}: `axis` {axis!r} is out of range for leaf {index} of `value`, "
                             f"which has rank {rank} (shape {t.shape})")


def normalize_axis(axis: int, rank: int | None, where: str) -> int:
    """A single axis as a non-negative int for a tensor of known ``rank``."""
    if rank is None:
        raise ValueError(f"{where}: `value` must have a known rank to gather along axis {axis}")
    if not -rank <= axis < rank:
        raise ValueError(f"{where}: `axis` {axis} is out of range for a value of rank {rank}")
    return axis + rank if axis < 0 else axis


def _count(t: tf.Tensor, axis: int | tuple[int, ...]) -> tf.Tensor:
    """Number of elements along ``axis`` (int64 scalar), static when the shape is known."""
    axes = axis if isinstance(axis, tuple) else (axis,)
    dims = [t.shape[a] if t.shape.rank is not None else None for a in axes]
    known = [d for d in dims if d is not None]
    if len(known) == len(dims):
        total = 1
        for d in known:
            total *= int(d)
        return tf.constant(total, tf.int64)
    shape = tf.shape(t, out_type=tf.int64)
    index = tf.constant(list(axes), tf.int64)
    index = tf.where(index < 0, index + tf.size(shape, out_type=tf.int64), index)
    return tf.reduce_prod(tf.gather(shape, index))


def reduce_tensors(engine: Any, op: ReduceOp, tensors: Sequence[tf.Tensor], axis: int | tuple[int, ...] | None,
                   options: CallOptions, where: str) -> list[tf.Tensor]:
    """Reduce every tensor over all ranks (and along ``axis`` when given) in ONE engine call."""
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if axis is None:  # in buckets, backprop order first (buckets.py): each its own collective op
        return buckets.run_bucketed(lambda part: collectives.allreduce(engine, part, op, options, where),
                                    tensors, options)
    tensors = [tf.reshape(t, [1]) if t.shape.rank == 0 and axis in (0, -1, (0,), (-1,)) else t for t in tensors]
    for i, t in enumerate(tensors):
        _check_axis(t, axis, where, i)
    if op is ReduceOp.MEAN:
        sums = [tf.reduce_sum(t, axis=axis) for t in tensors]
        counts = [_count(t, axis) for t in tensors]
        reduced = collectives.allreduce(engine, sums + counts, ReduceOp.SUM, options, where)
        n = len(tensors)
        return [tf.math.truediv(s, tf.cast(c, s.dtype)) for s, c in zip(reduced[:n], reduced[n:])]
    local = [_LOCAL[op](t, axis=axis) for t in tensors]
    return collectives.allreduce(engine, local, op, options, where)


def merge_options(base: CommunicationOptions, override: Any, where: str) -> CallOptions:
    """``override`` (ours or TensorFlow's CommunicationOptions, or None) merged over ``base``."""
    merged = base if override is None else base.merge(as_options(override, where))
    return merged.call_options()


def hints_and_options(options: Any, experimental_hints: Any, where: str) -> Any:
    """One options object from ``options`` (CommunicationOptions) and ``experimental_hints``
    (CollectiveHints, the TensorFlow 2.2-2.4 keyword): the hints' fields under the options'
    non-default ones (ours or TensorFlow's objects; None when neither is given)."""
    if experimental_hints is None:
        return options
    hints = as_options(experimental_hints, where)
    return hints if options is None else hints.merge(as_options(options, where))
