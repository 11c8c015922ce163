"""allreduce: every rank gets the reduction of all ranks' values."""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from . import buffers, compression, packing
from .algorithms import flat
from .ops import Op, finish_mean, rules

validate = None  # nothing to check beyond what every collective checks


def signature(arrays: list[np.ndarray]) -> tuple:
    return tuple([(a.dtype.char, a.shape) for a in arrays])


def one(a: np.ndarray, wire: np.dtype, mop: MPI.Op, op: Op, size: int, transfer) -> np.ndarray:
    """Allreduce of one contiguous array: ``transfer(send, recv)`` moves the data."""
    send = packing.as_dtype(a, wire)
    recv = buffers.empty_like(send)
    transfer(send, recv)
    if op is Op.MEAN:
        finish_mean(recv, size)
    return packing.from_wire(recv, a.dtype)


def run(ctx, arrays: list[np.ndarray], op: Op) -> list[np.ndarray]:
    if ctx.compression != "none" and op in compression.OPS:  # float32 leaves go compressed: compression.py
        return compression.run(ctx, arrays, op, lambda rest: reduce_packs(
            ctx, rest, op, lambda algorithm, send, recv, mop: algorithm.allreduce(ctx, send, recv, mop)))
    if len(arrays) == 1:  # no plan, no pack: the caller's array is the send buffer
        a = arrays[0]
        wire, mop = rules(a.dtype, op, ctx.where, "leaf 0 of `value`")
        algorithm = ctx.algorithm(a.size * wire.itemsize)
        return [one(a, wire, mop, op, ctx.size, lambda send, recv: algorithm.allreduce(ctx, send, recv, mop))]
    return reduce_packs(ctx, arrays, op, lambda algorithm, send, recv, mop: algorithm.allreduce(ctx, send, recv, mop))


def recipe(ctx, arrays: list[np.ndarray], op: Op) -> tuple | None:
    """The MPI calls :func:`run` issues for ``arrays``, when all are flat allreduces on the engine's
    communicator: ``((wire dtype, count, MPI op, non-blocking), ...)`` in order; else None.

    What a rank that did not speculate replays to match ranks that did (agreement.py)."""
    if ctx.compression != "none" and op in compression.OPS:  # Alltoallv + Allgatherv: not replayable
        return None
    deadline = ctx.call.deadline is not None
    steps = []
    for wire, count, mop in transfers(ctx, arrays, op):
        nbytes = count * wire.itemsize
        if ctx.algorithm(nbytes) is not flat:
            return None
        steps.append((wire, count, mop, flat.posts_allreduce(nbytes, ctx.iallreduce_from, deadline)))
    return tuple(steps)


def issued_recipe(ctx, issued: list[tuple]) -> tuple | None:
    """The steps a Caller recorded (``Caller.issued``) in :func:`recipe`'s form, or None when any
    was not a flat allreduce of NumPy buffers on the engine's communicator."""
    steps = []
    for comm, name, args, nonblocking in issued:
        send = args[0] if args else None
        if comm is not ctx.topo.comm or name != "Allreduce" or type(send) is not np.ndarray or len(args) != 3:
            return None
        steps.append((send.dtype, send.size, args[2], nonblocking))
    return tuple(steps)


def transfers(ctx, arrays: list[np.ndarray], op: Op) -> list[tuple[np.dtype, int, MPI.Op]]:
    """``(wire dtype, element count, MPI op)`` of each buffer :func:`run` reduces, in order."""
    if len(arrays) == 1:
        wire, mop = rules(arrays[0].dtype, op, ctx.where, "leaf 0 of `value`")
        return [(wire, arrays[0].size, mop)]
    rule = dtype_rules(ctx, arrays, op)
    dtypes = [a.dtype for a in arrays]
    nbytes = [a.size * rule[d][0].itemsize for a, d in zip(arrays, dtypes)]
    out = []
    for pack in ctx.plan(nbytes, dtypes):
        wire, mop = rule[dtypes[pack[0]]]
        out.append((wire, sum([arrays[i].size for i in pack]), mop))
    return out


def dtype_rules(ctx, arrays: list[np.ndarray], op: Op) -> dict[np.dtype, tuple[np.dtype, MPI.Op]]:
    """``(wire dtype, MPI op)`` of each distinct dtype among ``arrays`` (errors name the first leaf)."""
    dtypes = [a.dtype for a in arrays]
    return {d: rules(d, op, ctx.where, f"leaf {dtypes.index(d)} of `value`") for d in set(dtypes)}


def reduce_packs(ctx, arrays: list[np.ndarray], op: Op, transfer, keep: bool = True) -> list[np.ndarray]:
    """Pack by dtype, ``transfer(algorithm, send, recv, mpi_op)`` each pack, finish MEAN, unpack.

    ``keep=False`` (reduce on a non-root rank): no receive buffers, results stay None.
    """
    rule = dtype_rules(ctx, arrays, op)
    dtypes = [a.dtype for a in arrays]
    results: list[np.ndarray] = [None] * len(arrays)  # type: ignore[list-item]  # filled below, unless keep=False
    nbytes = [a.size * rule[d][0].itemsize for a, d in zip(arrays, dtypes)]
    for pack in ([[0]] if len(arrays) == 1 else ctx.plan(nbytes, dtypes)):
        dtype = dtypes[pack[0]]
        wire, mop = rule[dtype]
        send = packing.pack([arrays[i] for i in pack], wire)
        recv = buffers.empty_like(send) if keep else None
        transfer(ctx.algorithm(send.nbytes), send, recv, mop)
        if recv is None:
            continue
        if op is Op.MEAN:
            finish_mean(recv, ctx.size)
        outs = packing.unpack(recv, [arrays[i].shape for i in pack], [dtype] * len(pack))
        for i, out in zip(pack, outs):
            results[i] = out
    return results
