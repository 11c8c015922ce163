"""allreduce: every rank gets the reduction of all ranks' values."""
from __future__ import annotations

import numpy as np

from . import buffers, packing
from .ops import Op, finish_mean, mpi_op, rules, wire_dtype


validate = None  # nothing to check beyond what every collective checks


def signature(arrays: list[np.ndarray]) -> tuple:
    return tuple([(a.dtype.char, a.shape) for a in arrays])


def run(ctx, arrays: list[np.ndarray], op: Op) -> list[np.ndarray]:
    if len(arrays) == 1:  # no plan, no pack: the caller's array is the send buffer
        a = arrays[0]
        wire, mop = rules(a.dtype, op, ctx.where, "leaf 0 of `value`")
        send = packing.as_dtype(a, wire)
        recv = buffers.empty_like(send)
        ctx.algorithm(recv.nbytes).allreduce(ctx, send, recv, mop)
        if op is Op.MEAN:
            finish_mean(recv, ctx.size)
        return [packing.from_wire(recv, a.dtype)]
    wires = [wire_dtype(a.dtype, op, ctx.where, f"leaf {i} of `value`") for i, a in enumerate(arrays)]
    results: list[np.ndarray] = [None] * len(arrays)  # type: ignore[list-item]
    nbytes = [a.size * w.itemsize for a, w in zip(arrays, wires)]
    for pack in ctx.plan(nbytes, [a.dtype for a in arrays]):
        first = arrays[pack[0]]
        send = packing.pack([arrays[i] for i in pack], wires[pack[0]])
        recv = buffers.empty_like(send)
        ctx.algorithm(recv.nbytes).allreduce(ctx, send, recv, mpi_op(op, first.dtype))
        if op is Op.MEAN:
            finish_mean(recv, ctx.size)
        outs = packing.unpack(recv, [arrays[i].shape for i in pack], [first.dtype] * len(pack))
        for i, out in zip(pack, outs):
            results[i] = out
    return results
