"""reduce: the root gets the reduction of all ranks' values; other ranks get ``None``."""
from __future__ import annotations

import numpy as np

from . import buffers, packing
from .allreduce import signature  # same agreement fields: dtypes and full shapes
from .ops import Op, finish_mean, mpi_op, wire_dtype

__all__ = ["signature", "validate", "run"]

validate = None  # nothing to check beyond what every collective checks


def run(ctx, arrays: list[np.ndarray], op: Op, root: int) -> list[np.ndarray] | None:
    is_root = ctx.topo.rank == root
    wires = [wire_dtype(a.dtype, op, ctx.where, f"leaf {i} of `value`") for i, a in enumerate(arrays)]
    results: list[np.ndarray] = [None] * len(arrays)  # type: ignore[list-item]
    nbytes = [a.size * w.itemsize for a, w in zip(arrays, wires)]
    for pack in ctx.plan(nbytes, [a.dtype for a in arrays]):
        first = arrays[pack[0]]
        send = packing.pack([arrays[i] for i in pack], wires[pack[0]])
        recv = buffers.empty_like(send) if is_root else None
        ctx.algorithm(send.nbytes).reduce(ctx, send, recv, mpi_op(op, first.dtype), root)
        if recv is None:
            continue
        if op is Op.MEAN:
            finish_mean(recv, ctx.size)
        outs = packing.unpack(recv, [arrays[i].shape for i in pack], [first.dtype] * len(pack))
        for i, out in zip(pack, outs):
            results[i] = out
    return results if is_root else None
