"""broadcast: every rank gets the root's value. Bytes travel unchanged, whatever the dtype.

At the root the results are the root's own arrays (no copy), as with MPI_Bcast.
"""
from __future__ import annotations

import numpy as np

from . import buffers, packing

_BYTE = np.dtype(np.uint8)


validate = None  # nothing to check beyond what every collective checks


def signature(arrays: list[np.ndarray]) -> tuple:
    return tuple([(a.dtype.char, a.shape) for a in arrays])


def run(ctx, arrays: list[np.ndarray], root: int) -> list[np.ndarray]:
    is_root = ctx.topo.rank == root
    results: list[np.ndarray] = list(arrays) if is_root else [None] * len(arrays)  # type: ignore[list-item]  # filled
    nbytes = [a.nbytes for a in arrays]
    for pack in ctx.plan(nbytes, [0] * len(arrays)):
        if len(pack) == 1:
            i = pack[0]
            buf = packing.bytes_of(arrays[i]) if is_root else buffers.empty(nbytes[i], _BYTE)
            ctx.algorithm(nbytes[i]).bcast(ctx, buf, root)
            if not is_root:
                results[i] = buf.view(arrays[i].dtype).reshape(arrays[i].shape)
            continue
        offsets, total = packing.byte_layout([nbytes[i] for i in pack])
        buf = buffers.empty(total, _BYTE)
        if is_root:
            for i, at in zip(pack, offsets):
                buf[at:at + nbytes[i]] = packing.bytes_of(arrays[i])
        ctx.algorithm(total).bcast(ctx, buf, root)
        if not is_root:
            for i, at in zip(pack, offsets):
                results[i] = buf[at:at + nbytes[i]].view(arrays[i].dtype).reshape(arrays[i].shape)
    return results
