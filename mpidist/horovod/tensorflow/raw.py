"""The raw differentiable allreduce every Horovod collective builds on, and the wire dtype rule.

``raw_allreduce`` is one engine call for a list of tensors, with Horovod's gradient (the allreduce
of the incoming gradient with the same op); ``wire`` sends bfloat16 as float32 (MPI has no
bfloat16) and says which dtype to cast the result back to. allreduce, allgather's gradient and
reducescatter use both; they live here so those modules do not import each other.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import tensorflow as tf

from . import joins, runner
from .process_sets import ProcessSet
from .reduce_ops import engine_op


def wire(tensor: Any) -> tuple[tf.Tensor, tf.DType]:
    t = tf.convert_to_tensor(tensor)
    return (tf.cast(t, tf.float32) if t.dtype == tf.bfloat16 else t), t.dtype


def raw_allreduce(tensors: Sequence[Any], op: int, process_set: ProcessSet, name: str) -> list[tf.Tensor]:
    """The reduction itself (one engine call), differentiable."""
    where = "allreduce"
    engine = process_set.require_engine(where)
    red = engine_op(op, where)
    wired = [wire(t) for t in tensors]

    def run(arrays: list[np.ndarray]) -> list[np.ndarray]:
        out = joins.allreduce(engine, arrays[0] if len(arrays) == 1 else arrays, red)
        out = [out] if len(arrays) == 1 else list(out)
        return [np.asarray(r).reshape(a.shape) for r, a in zip(out, arrays)]

    @tf.custom_gradient
    def reduce(*xs: tf.Tensor) -> Any:
        outs = runner.execute(name, run, xs, [x.dtype for x in xs], [x.shape for x in xs], where, engine)

        def grad(*dys: tf.Tensor) -> list[tf.Tensor]:
            return raw_allreduce(list(dys), op, process_set, name + "_grad")
        return outs, grad

    outs = reduce(*[w for w, _ in wired])
    outs = [outs] if isinstance(outs, tf.Tensor) else list(outs)
    return [tf.cast(o, d) if o.dtype != d else o for o, (_, d) in zip(outs, wired)]
