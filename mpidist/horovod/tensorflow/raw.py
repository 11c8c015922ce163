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

from ...collectives.ops import ReduceOp, finish_mean
from . import joins, runner
from .process_sets import ProcessSet
from .reduce_ops import engine_op


def wire(tensor: Any) -> tuple[tf.Tensor, tf.DType]:
    t = tf.convert_to_tensor(tensor)
    return (tf.cast(t, tf.float32) if t.dtype == tf.bfloat16 else t), t.dtype


def _mean(summed: np.ndarray, size: int) -> np.ndarray:
    """Average from a Sum, as Horovod computes it on CPU: float16 is summed (and rounded) in
    float16, then divided in float32 and rounded again (the engine's float16 MEAN divides the
    float32 sum and rounds once, which differs in the last bit where ``size`` is not a power of 2)."""
    if summed.dtype == np.float16:
        return (summed.astype(np.float32) / np.float32(size)).astype(np.float16)
    out = np.array(summed)
    finish_mean(out, size)
    return out


def raw_allreduce(tensors: Sequence[Any], op: int, process_set: ProcessSet, name: str,
                  exact_average: bool = False) -> list[tf.Tensor]:
    """The reduction itself (one engine call), differentiable.

    Average, three ways (they differ only in the last bit, where the set's size is not a power of
    2): by default as Horovod's ``allreduce`` on CPU, the Sum in the tensor's dtype divided by the
    size (the engine's MEAN, except that float16 is rounded to float16 before the division);
    ``exact_average`` (``grouped_allreduce``): float32 is reduced in float64 and float16 in float32
    and rounded once, so the average of equal values is exactly that value, as Horovod's tests of
    grouped_allreduce expect at any size. The gradient path (tape, optimizers) takes the default."""
    where = "allreduce"
    engine = process_set.require_engine(where)
    red = engine_op(op, where)
    wired = [wire(t) for t in tensors]

    def run(arrays: list[np.ndarray]) -> list[np.ndarray]:
        exact = exact_average and red is ReduceOp.MEAN and any(a.dtype == np.float32 for a in arrays)
        half_mean = not exact_average and red is ReduceOp.MEAN and any(a.dtype == np.float16 for a in arrays)
        sent = [a.astype(np.float64) if a.dtype == np.float32 else a for a in arrays] if exact else arrays
        out = joins.allreduce(engine, sent[0] if len(sent) == 1 else sent, ReduceOp.SUM if half_mean else red)
        out = [out] if len(arrays) == 1 else list(out)
        out = [np.asarray(r).reshape(a.shape).astype(a.dtype, copy=False) for r, a in zip(out, arrays)]
        return [_mean(r, engine.size) for r in out] if half_mean else out

    @tf.custom_gradient
    def reduce(*xs: tf.Tensor) -> Any:
        outs = runner.execute(name, run, xs, [x.dtype for x in xs], [x.shape for x in xs], where, engine)

        def grad(*dys: tf.Tensor) -> list[tf.Tensor]:
            return raw_allreduce(list(dys), op, process_set, name + "_grad")
        return outs, grad

    outs = reduce(*[w for w, _ in wired])
    outs = [outs] if isinstance(outs, tf.Tensor) else list(outs)
    return [tf.cast(o, d) if o.dtype != d else o for o, (_, d) in zip(outs, wired)]
