"""The five collectives on lists of contiguous CuPy arrays, over the transport of the chosen path.

They mirror the host modules (allreduce.py, broadcast.py, ...): the same packing plan (so
``bytes_per_pack`` / ``num_packs`` mean the same), the same results (dtypes, shapes, MEAN
semantics, broadcast returning the root's own arrays at the root, ``None`` off the root for
reduce), but packs are built and unpacked on the device and the data never leaves it unless the
path stages it. Zero-size buffers are skipped on every rank (sizes are agreed, so all skip alike).

With NCCL, the transfers of a reduction's packs are issued as one NCCL group; whatever reads
their results (MEAN's division, casts back to the caller's dtype) is enqueued after the group.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from .. import packing
from ..ops import Op
from ..reduce_scatter import block_rows
from .nccl import is_bfloat16
from .transports import Env

_UINT8 = np.dtype(np.uint8)


def as_wire(a: Any, wire: np.dtype) -> Any:
    """``a`` in the wire dtype: itself, a uint8 view of bool, or a converted copy."""
    if a.dtype == wire:
        return a
    if a.dtype.kind == "b" and wire == _UINT8:
        return a.view(_UINT8)
    return a.astype(wire)


def from_wire(piece: Any, dtype: np.dtype) -> Any:
    if piece.dtype == dtype:
        return piece
    return piece.view(dtype) if dtype.kind == "b" else piece.astype(dtype)


def pack(cp: Any, arrays: list[Any], wire: np.dtype) -> Any:
    """One 1-D device buffer of ``wire`` holding ``arrays`` back to back (a view for one array)."""
    if len(arrays) == 1:
        return as_wire(arrays[0], wire).reshape(-1)
    out = cp.empty(sum(a.size for a in arrays), dtype=wire)
    at = 0
    for a in arrays:
        out[at:at + a.size] = as_wire(a, wire).reshape(-1)
        at += a.size
    return out


def unpack(buffer: Any, shapes: list[tuple], dtype: np.dtype) -> list[Any]:
    out, at = [], 0
    for shape in shapes:
        n = math.prod(shape)
        out.append(from_wire(buffer[at:at + n].reshape(shape), dtype))
        at += n
    return out


def finish_mean(cp: Any, buffer: Any, count: int) -> None:
    """Turn a SUM into a MEAN over ``count`` ranks, in place (integers truncate toward zero)."""
    if count == 1:
        return
    kind = buffer.dtype.kind
    if kind in "fc" or is_bfloat16(buffer.dtype):
        buffer /= count
    elif kind == "u":
        buffer //= count
    else:
        quotient = cp.abs(buffer) // count
        buffer[...] = cp.where(buffer < 0, -quotient, quotient)


def bytes_of(a: Any) -> Any:
    return a.reshape(-1).view(_UINT8)


def _reduce_packs(env: Env, arrays: list[Any], op: Op, root: int | None) -> list[Any] | None:
    """Allreduce (``root`` None) or reduce to ``root`` of every array, pack by pack."""
    cp, ctx = env.cp, env.ctx
    keep = root is None or env.rank == root
    dtypes = [a.dtype for a in arrays]
    chosen: dict[np.dtype, tuple[Any, Any]] = {}
    for i, d in enumerate(dtypes):
        if d not in chosen:
            chosen[d] = env.rule(d, op, f"leaf {i} of `value`")
    nbytes = [a.size * chosen[d][1].wire.itemsize for a, d in zip(arrays, dtypes)]
    packs = ctx.plan(nbytes, dtypes)
    done: list[tuple[list[int], Any, Any, Any]] = []

    def transfer(pack_: list[int]) -> None:
        transport, rule = chosen[dtypes[pack_[0]]]
        send = pack(cp, [arrays[i] for i in pack_], rule.wire)
        recv = cp.empty_like(send) if keep else None
        if send.size:
            if root is None:
                transport.allreduce(send, recv, rule)
            else:
                transport.reduce(send, recv, rule, root)
        # Keep ``send`` referenced: inside an NCCL group the transfer is only enqueued at the
        # group's end, and CuPy's pool would hand a dropped buffer to the next pack meanwhile.
        done.append((pack_, send, recv, rule))

    own = [p for p in packs if chosen[dtypes[p[0]]][0] is env.primary]
    with env.primary.group():
        for p in own:
            transfer(p)
    for p in packs:
        if chosen[dtypes[p[0]]][0] is not env.primary:
            transfer(p)
    if not keep:
        return None
    results: list[Any] = [None] * len(arrays)
    for pack_, _, recv, rule in done:
        if rule.finish_mean:
            finish_mean(cp, recv, env.size)
        for i, out in zip(pack_, unpack(recv, [arrays[i].shape for i in pack_], dtypes[pack_[0]])):
            results[i] = out
    return results


def allreduce(env: Env, arrays: list[Any], op: Op) -> list[Any]:
    return _reduce_packs(env, arrays, op, None)  # type: ignore[return-value]


def reduce(env: Env, arrays: list[Any], op: Op, root: int) -> list[Any] | None:
    return _reduce_packs(env, arrays, op, root)


def broadcast(env: Env, arrays: list[Any], root: int) -> list[Any]:
    cp, is_root = env.cp, env.rank == root
    results: list[Any] = list(arrays) if is_root else [None] * len(arrays)
    nbytes = [a.nbytes for a in arrays]
    for pack_ in env.ctx.plan(nbytes, [0] * len(arrays)):
        if len(pack_) == 1:
            a = arrays[pack_[0]]
            buf = bytes_of(a) if is_root else cp.empty(a.nbytes, dtype=_UINT8)
            if buf.size:
                env.primary.bcast(buf, root)
            if not is_root:
                results[pack_[0]] = buf.view(a.dtype).reshape(a.shape)
            continue
        offsets, total = packing.byte_layout([nbytes[i] for i in pack_])
        buf = cp.empty(total, dtype=_UINT8)
        if is_root:
            for i, at in zip(pack_, offsets):
                buf[at:at + nbytes[i]] = bytes_of(arrays[i])
        if total:
            env.primary.bcast(buf, root)
        if not is_root:
            for i, at in zip(pack_, offsets):
                results[i] = buf[at:at + nbytes[i]].view(arrays[i].dtype).reshape(arrays[i].shape)
    return results


def allgather(env: Env, arrays: list[Any]) -> list[Any]:
    """Every rank's arrays concatenated along axis 0 (lengths exchanged first, on the host)."""
    cp, ctx = env.cp, env.ctx
    mine = np.array([a.shape[0] for a in arrays], dtype=np.int64)
    rows = np.empty((env.size, len(arrays)), dtype=np.int64)
    ctx.call(ctx.topo.comm, "Allgather", mine, rows)
    results = []
    for i, a in enumerate(arrays):
        counts = rows[:, i] * (a.dtype.itemsize * math.prod(a.shape[1:]))
        recv = cp.empty(int(counts.sum()), dtype=_UINT8)
        if recv.size:
            env.primary.allgatherv(bytes_of(a), recv, counts)
        results.append(recv.view(a.dtype).reshape((int(rows[:, i].sum()),) + a.shape[1:]))
    return results


def reduce_scatter(env: Env, arrays: list[Any], op: Op) -> list[Any]:
    """Reduce, then rank r keeps block r of axis 0 (blocks as numpy.array_split cuts them)."""
    cp, results = env.cp, []
    for i, a in enumerate(arrays):
        transport, rule = env.rule(a.dtype, op, f"leaf {i} of `value`")
        rows = block_rows(a.shape[0], env.size)
        counts = [n * math.prod(a.shape[1:]) for n in rows]  # Python ints, as the host path's
        send = as_wire(a, rule.wire).reshape(-1)
        recv = cp.empty(counts[env.rank], dtype=rule.wire)
        if send.size:
            transport.reduce_scatter(send, recv, counts, rule)
        if rule.finish_mean:
            finish_mean(cp, recv, env.size)
        results.append(from_wire(recv.reshape((rows[env.rank],) + a.shape[1:]), a.dtype))
    return results


RUN = {"allreduce": allreduce, "reduce": reduce, "broadcast": broadcast, "allgather": allgather,
       "reduce_scatter": reduce_scatter}
