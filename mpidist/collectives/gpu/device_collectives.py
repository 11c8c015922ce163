"""The five collectives on lists of contiguous CuPy arrays, over the transport of the chosen path.

They mirror the host modules (allreduce.py, broadcast.py, ...): the same packing plan (so
``bytes_per_pack`` / ``num_packs`` mean the same), the same results (dtypes, shapes, MEAN
semantics, broadcast returning the root's own arrays at the root, ``None`` off the root for
reduce) and the same pack loop (packing.py, with ``xp=cupy``), but packs are built and unpacked
on the device and the data never leaves it unless the path stages it. Zero-size buffers are
skipped on every rank (sizes are agreed, so all skip alike).

With NCCL alone (the ``nccl`` path), a reduction does not pack: every leaf is its own NCCL call,
and the calls of all leaves are issued as one NCCL group (``ncclGroupStart/End``), which NCCL
launches together, so a nest costs no copy kernels into and out of packs (``bytes_per_pack`` and
``num_packs`` do not apply there). Whatever reads the results (MEAN's division, casts back to the
caller's dtype) is enqueued after the group. Leaves NCCL cannot reduce (PROD of complex) are packed
for the MPI fallback as on the other paths.
"""
from __future__ import annotations

import contextlib
import math
from typing import Any, Callable

import numpy as np

from .. import packing
from ..ops import Op, finish_mean
from ..reduce_scatter import block_rows
from .transports import Env

_UINT8 = np.dtype(np.uint8)
bytes_of = packing.bytes_of


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
    if env.primary.per_leaf:  # one NCCL call per leaf, all in one group (the module docstring)
        rest = [i for i, d in enumerate(dtypes) if chosen[d][0] is not env.primary]
        packs = [[i] for i, d in enumerate(dtypes) if chosen[d][0] is env.primary]
        packs += [[rest[j] for j in p] for p in ctx.plan([nbytes[i] for i in rest], [dtypes[i] for i in rest])]
    else:
        packs = ctx.plan(nbytes, dtypes)
    done: list[tuple[list[int], Any, Any, Any]] = []

    def transfer(pack_: list[int]) -> None:
        transport, rule = chosen[dtypes[pack_[0]]]
        send = packing.pack([arrays[i] for i in pack_], rule.wire, xp=cp)
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
    with env.primary.group() if len(own) > 1 else contextlib.nullcontext():  # no group around one call
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
            finish_mean(recv, env.size, xp=cp)
        shapes = [arrays[i].shape for i in pack_]
        for i, out in zip(pack_, packing.unpack(recv, shapes, [dtypes[pack_[0]]] * len(pack_))):
            results[i] = out
    return results


def allreduce(env: Env, arrays: list[Any], op: Op) -> list[Any]:
    return _reduce_packs(env, arrays, op, None)  # type: ignore[return-value]  # no root: every rank keeps its results


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
        send = packing.as_dtype(a, rule.wire).reshape(-1)
        recv = cp.empty(counts[env.rank], dtype=rule.wire)
        if send.size:
            transport.reduce_scatter(send, recv, counts, rule)
        if rule.finish_mean:
            finish_mean(recv, env.size, xp=cp)
        results.append(packing.from_wire(recv.reshape((rows[env.rank],) + a.shape[1:]), a.dtype))
    return results


RUN: dict[str, Callable[..., list[Any] | None]] = {
    "allreduce": allreduce, "reduce": reduce, "broadcast": broadcast, "allgather": allgather,
    "reduce_scatter": reduce_scatter}
