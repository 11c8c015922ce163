"""reduce_scatter: reduce all ranks' values, then rank r keeps block r of axis 0.

Axis 0 of each leaf is cut into ``size`` blocks as ``numpy.array_split`` does: the first
``n % size`` blocks get one extra row, so any length works.
"""
from __future__ import annotations

import itertools
import math

import numpy as np

from . import buffers, packing
from .allgather import validate
from .allreduce import dtype_rules, signature  # same agreement fields: dtypes and full shapes
from .ops import Op, finish_mean

__all__ = ["signature", "validate", "run", "block_rows"]


def block_rows(n: int, size: int) -> list[int]:
    """Rows of each rank's block when ``n`` rows are cut into ``size`` blocks."""
    q, extra = divmod(n, size)
    return [q + 1 if r < extra else q for r in range(size)]


def run(ctx, arrays: list[np.ndarray], op: Op) -> list[np.ndarray]:
    size, rank = ctx.size, ctx.topo.rank
    rule = dtype_rules(ctx, arrays, op)
    rows = [block_rows(a.shape[0], size) for a in arrays]
    row_elems = [math.prod(a.shape[1:]) for a in arrays]
    results: list[np.ndarray] = [None] * len(arrays)  # type: ignore[list-item]  # each filled below
    nbytes = [a.size * rule[a.dtype][0].itemsize for a in arrays]
    plan = [[0]] if len(arrays) == 1 else ctx.plan(nbytes, [a.dtype for a in arrays])
    for pack in plan:
        wire, mop = rule[arrays[pack[0]].dtype]
        elems = [[rows[i][r] * row_elems[i] for i in pack] for r in range(size)]  # Python ints: few ranks
        counts = [sum(e) for e in elems]
        if len(pack) == 1:  # rank-major already
            send = packing.as_dtype(arrays[pack[0]], wire).reshape(-1)
        else:
            send = buffers.empty(sum(counts), wire)
            at = 0
            starts = [[0] + list(itertools.accumulate(rows[i])) for i in pack]
            for r in range(size):
                for j, i in enumerate(pack):
                    block = arrays[i][starts[j][r]:starts[j][r + 1]].reshape(-1)
                    send[at:at + block.size] = block
                    at += block.size
        recv = buffers.empty(counts[rank], wire)
        ctx.algorithm(send.nbytes).reduce_scatter(ctx, send, recv, counts, mop)
        if op is Op.MEAN:
            finish_mean(recv, size)
        at = 0
        for j, i in enumerate(pack):
            a = arrays[i]
            block = recv[at:at + elems[rank][j]].reshape((rows[i][rank],) + a.shape[1:])
            at += elems[rank][j]
            results[i] = packing.from_wire(block, a.dtype)
    return results
