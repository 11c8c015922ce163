"""reducescatter and grouped_reducescatter, with Horovod's gradient.

The first dimension is cut into one block per rank, the first ``n % size`` ranks getting one row
more (as Horovod does); rank r keeps the reduction of block r. Ops: Average (the default) and Sum.
Gradient: the allgather of the incoming gradient, times the set's size for Sum (Horovod's
convention, as for allreduce: with the same upstream gradient on every rank, Sum's gradient is
``size`` times Average's);
``prescale_factor``/``postscale_factor`` are TensorFlow multiplications around it.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import tensorflow as tf

from . import joins, runner
from .allreduce import scale
from .compression import Compression
from .gather import raw_allgather
from .process_sets import ProcessSet, global_process_set
from .raw import wire
from .reduce_ops import Average, Sum, engine_op, name_of


def _block(rows: int | None, size: int, rank: int) -> int | None:
    if rows is None:
        return None
    q, extra = divmod(rows, size)
    return q + 1 if rank < extra else q


def _raw(tensors: Sequence[tf.Tensor], op: int, process_set: ProcessSet, name: str) -> list[tf.Tensor]:
    where = "reducescatter"
    engine = process_set.require_engine(where)
    red = engine_op(op, where)
    if op not in (Average, Sum):
        raise NotImplementedError(f"reducescatter: `op` must be hvd.Average or hvd.Sum, got {name_of(op)}")

    def run(arrays: list[np.ndarray]) -> list[np.ndarray]:
        value = arrays[0] if len(arrays) == 1 else arrays
        out = joins.collective(engine, where, lambda: engine.reduce_scatter(value, red))
        return [out] if len(arrays) == 1 else list(out)

    def shape(s: tf.TensorShape) -> tf.TensorShape | None:
        if s.rank is None:
            return None
        return tf.TensorShape([_block(s[0], engine.size, engine.rank)] + s.as_list()[1:])

    @tf.custom_gradient
    def rs(*xs: tf.Tensor) -> Any:
        for x in xs:
            if x.shape.rank == 0:
                raise ValueError("reducescatter: expected a tensor of at least one dimension, got a scalar")
        outs = runner.execute(name, run, xs, [x.dtype for x in xs], [shape(x.shape) for x in xs], where, engine)

        def grad(*dys: tf.Tensor) -> list[tf.Tensor]:
            full = raw_allgather(list(dys), process_set, name + "_grad")
            if op == Sum:
                full = [f * tf.cast(engine.size, f.dtype) for f in full]
            return full
        return outs, grad

    outs = rs(*tensors)
    return [outs] if isinstance(outs, tf.Tensor) else list(outs)


def grouped_reducescatter(tensors: Sequence[Any], device_dense: str = "", compression: Any = Compression.none,
                          op: Any = Average, name: str | None = None,
                          process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list[tf.Tensor]:
    """reducescatter of every tensor in one engine call."""
    with runner.guard(process_set, "reducescatter"):
        return _grouped(list(tensors), compression, Average if op is None else op, name, process_set,
                        prescale_factor, postscale_factor)


def _grouped(tensors: list[Any], compression: Any, op: Any, name: str | None, process_set: ProcessSet,
             prescale_factor: float, postscale_factor: float) -> list[tf.Tensor]:
    if not tensors:
        return []
    wired, ctxs, dtypes = [], [], []
    for t in tensors:
        w, dtype = wire(t)
        c, ctx = compression.compress(w)
        wired.append(scale(c, prescale_factor))
        ctxs.append(ctx)
        dtypes.append(dtype)
    outs = _raw(wired, op, process_set, runner.scope_name(name, "HorovodReducescatter"))
    outs = [compression.decompress(scale(o, postscale_factor), ctx) for o, ctx in zip(outs, ctxs)]
    return [tf.cast(o, d) if o.dtype != d else o for o, d in zip(outs, dtypes)]


def reducescatter(tensor: Any, device_dense: str = "", compression: Any = Compression.none, op: Any = Average,
                  name: str | None = None, process_set: ProcessSet = global_process_set,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> tf.Tensor:
    """Reduce ``tensor`` over the process set; this rank keeps its block of the first dimension."""
    return grouped_reducescatter([tensor], device_dense, compression, op, name, process_set,
                                 prescale_factor, postscale_factor)[0]
