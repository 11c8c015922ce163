"""allgather: every rank gets all ranks' values concatenated along axis 0, in rank order.

The first dimension may differ per rank (ragged); the rest of the shape, the dtype and the
structure must agree. Ranks first exchange their first dimensions (one small Allgather).
"""
from __future__ import annotations

import math

import numpy as np

from . import buffers, packing

_BYTE = np.dtype(np.uint8)


def signature(arrays: list[np.ndarray]) -> tuple:
    return tuple([(a.dtype.char, ("?",) + a.shape[1:]) for a in arrays])


def validate(arrays: list[np.ndarray], where: str) -> None:
    for i, a in enumerate(arrays):
        if a.ndim == 0:
            raise ValueError(f"{where}: leaf {i} of `value` is 0-d; expected at least one dimension "
                             f"to concatenate along (reshape scalars to shape (1,))")


def run(ctx, arrays: list[np.ndarray]) -> list[np.ndarray]:
    size, rank = ctx.size, ctx.topo.rank
    mine = np.array([a.shape[0] for a in arrays], dtype=np.int64)
    rows = np.empty((size, len(arrays)), dtype=np.int64)
    ctx.call(ctx.topo.comm, "Allgather", mine, rows)
    row_bytes = [a.dtype.itemsize * math.prod(a.shape[1:]) for a in arrays]
    seg = rows * np.array(row_bytes, dtype=np.int64)   # bytes of leaf i from rank r: seg[r, i]
    results: list[np.ndarray] = [None] * len(arrays)  # type: ignore[list-item]  # each filled below
    if len(arrays) == 1:  # one leaf: no plan, no pack (small arrays are cheaper as Python ints)
        a, counts = arrays[0], seg[:, 0]
        recv = buffers.empty(sum(counts.tolist()), _BYTE)
        ctx.algorithm(recv.nbytes).allgatherv(ctx, packing.bytes_of(a), recv, counts)
        return [recv.view(a.dtype).reshape((sum(rows[:, 0].tolist()),) + a.shape[1:])]
    for pack in ctx.plan(seg.sum(axis=0).tolist(), [0] * len(arrays)):
        if len(pack) == 1:
            i = pack[0]
            a = arrays[i]
            recv = buffers.empty(int(seg[:, i].sum()), _BYTE)
            ctx.algorithm(recv.nbytes).allgatherv(ctx, packing.bytes_of(a), recv, seg[:, i].copy())
            results[i] = recv.view(a.dtype).reshape((int(rows[:, i].sum()),) + a.shape[1:])
            continue
        layouts = [packing.byte_layout(seg[r, pack].tolist()) for r in range(size)]
        counts = np.array([total for _, total in layouts], dtype=np.int64)
        send = buffers.empty(int(counts[rank]), _BYTE)
        for i, at in zip(pack, layouts[rank][0]):
            send[at:at + seg[rank, i]] = packing.bytes_of(arrays[i])
        recv = buffers.empty(int(counts.sum()), _BYTE)
        ctx.algorithm(recv.nbytes).allgatherv(ctx, send, recv, counts)
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        for j, i in enumerate(pack):
            a = arrays[i]
            parts = [recv[starts[r] + layouts[r][0][j]:][:seg[r, i]].view(a.dtype) for r in range(size)]
            results[i] = np.concatenate(parts).reshape((int(rows[:, i].sum()),) + a.shape[1:])
    return results
