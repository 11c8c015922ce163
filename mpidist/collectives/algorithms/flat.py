"""Flat algorithms: the MPI library's own collective on the whole communicator."""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

NAME = "flat"  # what the timeline and `mpidist info` call this algorithm


def displacements(counts: np.ndarray | list[int]) -> list[int]:
    """Offsets of each rank's block (Python ints: cheaper than NumPy for a handful of ranks)."""
    displs, at = [], 0
    for c in (counts.tolist() if isinstance(counts, np.ndarray) else counts):
        displs.append(at)
        at += c
    return displs


def posts_allreduce(nbytes: int, threshold: int, deadline: bool) -> bool:
    """Whether a flat allreduce of ``nbytes`` is ``Iallreduce`` + wait rather than ``Allreduce``:
    always under a deadline, else from ``threshold`` bytes (``rc.iallreduce_threshold``)."""
    return deadline or nbytes >= threshold


def allreduce(ctx, send: np.ndarray, recv: np.ndarray, op: MPI.Op) -> None:
    if send.nbytes >= ctx.iallreduce_from:
        ctx.call.posted(ctx.topo.comm, "Allreduce", send, recv, op)
    else:
        ctx.call(ctx.topo.comm, "Allreduce", send, recv, op)


def bcast(ctx, buf: np.ndarray, root: int) -> None:
    ctx.call(ctx.topo.comm, "Bcast", buf, root)


def reduce(ctx, send: np.ndarray, recv: np.ndarray | None, op: MPI.Op, root: int) -> None:
    ctx.call(ctx.topo.comm, "Reduce", send, recv, op, root)


def allgatherv(ctx, send: np.ndarray, recv: np.ndarray, counts: np.ndarray) -> None:
    ctx.call(ctx.topo.comm, "Allgatherv", send, [recv, (counts, displacements(counts)), MPI.BYTE])


def reduce_scatter(ctx, send: np.ndarray, recv: np.ndarray, counts: list[int], op: MPI.Op) -> None:
    ctx.call(ctx.topo.comm, "Reduce_scatter", send, recv, counts, op)
