"""allreduce and grouped_allreduce, with Horovod's gradients.

A list of tensors is ONE engine call (the engine packs them). The raw reduction carries a
registered gradient: the allreduce of the incoming gradient with the same op (Horovod's
definition, also for Min/Max/Product); ``prescale_factor``/``postscale_factor`` are TensorFlow
multiplications around it, so their gradient is the same scaling. ``tf.IndexedSlices`` are
allreduced by allgathering values and indices (divided by the set's size for Average), or
densified first by the callers that take ``sparse_as_dense``.
"""
from __future__ import annotations

from typing import Any, Sequence

import tensorflow as tf

from . import runner
from .compression import Compression
from .gather import allgather  # the ragged gather of values and indices
from .process_sets import ProcessSet, global_process_set
from .raw import raw_allreduce
from .reduce_ops import Average, Sum, engine_op, handle_average_backwards_compatibility


def scale(tensor: tf.Tensor, factor: float) -> tf.Tensor:
    """``tensor * factor`` as Horovod scales on CPU: integers in float64 and float16 in float32, cast
    back; nothing when factor is 1."""
    if factor == 1.0:
        return tensor
    if tensor.dtype == tf.float16:
        return tf.cast(tf.cast(tensor, tf.float32) * tf.cast(factor, tf.float32), tf.float16)
    if tensor.dtype.is_floating or tensor.dtype.is_complex:
        return tensor * tf.cast(factor, tensor.dtype)
    return tf.cast(tf.cast(tensor, tf.float64) * factor, tensor.dtype)


def _check_sparse_scaling(prescale: float, postscale: float) -> None:
    if prescale != 1.0 or postscale != 1.0:
        raise NotImplementedError("allreduce: pre/postscale_factor are not supported with tf.IndexedSlices")


def _sparse(tensor: tf.IndexedSlices, op: int, process_set: ProcessSet, name: str) -> tf.IndexedSlices:
    if op not in (Average, Sum):
        raise NotImplementedError("allreduce: the op parameter supports only Sum and Average for "
                                  f"tf.IndexedSlices, got op={op!r}")
    values = allgather(tensor.values, name=name + "_values", process_set=process_set)
    indices = allgather(tensor.indices, name=name + "_indices", process_set=process_set)
    if op == Average:
        values = values / tf.cast(process_set.size(), values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=tensor.dense_shape)


def allreduce(tensor: Any, average: Any = None, device_dense: str = "", device_sparse: str = "",
              compression: Any = Compression.none, op: Any = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, name: str | None = None,
              process_set: ProcessSet = global_process_set, ignore_name_scope: bool = False) -> Any:
    """Reduce ``tensor`` (a tf.Tensor, tf.Variable or tf.IndexedSlices) over the process set."""
    op = handle_average_backwards_compatibility(op, average)
    name = runner.scope_name(name, "HorovodAllreduce")
    if isinstance(tensor, tf.IndexedSlices):
        engine_op(op, "allreduce")  # Adasum: NotImplementedError
        _check_sparse_scaling(prescale_factor, postscale_factor)
        return _sparse(tensor, op, process_set, name)
    with runner.guard(process_set, "allreduce"):
        return _dense([tensor], op, compression, prescale_factor, postscale_factor, process_set, name)[0]


def _dense(tensors: Sequence[Any], op: int, compression: Any, prescale: float, postscale: float,
           process_set: ProcessSet, name: str, exact_average: bool = False) -> list[tf.Tensor]:
    engine_op(op, "allreduce")
    compressed, ctxs = [], []
    for t in tensors:
        c, ctx = compression.compress(tf.convert_to_tensor(t))
        compressed.append(scale(c, prescale))
        ctxs.append(ctx)
    reduced = raw_allreduce(compressed, op, process_set, name, exact_average)
    return [compression.decompress(scale(r, postscale), ctx) for r, ctx in zip(reduced, ctxs)]


def grouped_allreduce(tensors: Sequence[Any], average: Any = None, device_dense: str = "",
                      device_sparse: str = "", compression: Any = Compression.none, op: Any = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0, name: str | None = None,
                      process_set: ProcessSet = global_process_set, ignore_name_scope: bool = False) -> list[Any]:
    """Reduce a list of tensors in one engine call (IndexedSlices each by allgather). Average is
    exact for float32 and float16 (reduced in a wider type, rounded once: raw.raw_allreduce)."""
    return grouped(tensors, average, compression, op, prescale_factor, postscale_factor, name, process_set,
                   exact_average=True)


def grouped(tensors: Sequence[Any], average: Any = None, compression: Any = Compression.none, op: Any = None,
            prescale_factor: float = 1.0, postscale_factor: float = 1.0, name: str | None = None,
            process_set: ProcessSet = global_process_set, exact_average: bool = False) -> list[Any]:
    """grouped_allreduce; ``exact_average``: see raw.raw_allreduce (the gradient path leaves it off:
    its float32 Average travels in float32)."""
    op = handle_average_backwards_compatibility(op, average)
    name = runner.scope_name(name, "HorovodGroupedAllreduce")
    tensors = list(tensors)
    dense = [i for i, t in enumerate(tensors) if not isinstance(t, tf.IndexedSlices)]
    if len(dense) < len(tensors):
        engine_op(op, "allreduce")  # Adasum: NotImplementedError
        _check_sparse_scaling(prescale_factor, postscale_factor)
    out: list[Any] = [None] * len(tensors)
    if dense:
        with runner.guard(process_set, "allreduce"):
            reduced = _dense([tensors[i] for i in dense], op, compression, prescale_factor, postscale_factor,
                             process_set, name, exact_average)
        for i, r in zip(dense, reduced):
            out[i] = r
    for i, t in enumerate(tensors):
        if isinstance(t, tf.IndexedSlices):
            out[i] = _sparse(t, op, process_set, f"{name}_{i}")
    return out





__all__ = ["allreduce", "grouped_allreduce", "grouped", "raw_allreduce", "scale", "Sum", "Average"]
