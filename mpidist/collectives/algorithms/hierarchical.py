"""Hierarchical algorithms: inside the node, across node leaders (local rank 0), back inside.

Across nodes only one rank per node talks, which pays when the network is the bottleneck and the
node's shared memory is fast. Every step runs through ``ctx.call`` so deadlines hold throughout.
Nodes may have different sizes and need not hold consecutive ranks.
"""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

from .. import buffers
from .flat import displacements

NAME = "hierarchical"  # what the timeline and `mpidist info` call this algorithm


def _root_place(topo, root: int) -> tuple[int, int]:
    node = topo.node_of_rank[root]
    return node, topo.node_ranks[node].index(root)


def allreduce(ctx, send: np.ndarray, recv: np.ndarray, op: MPI.Op) -> None:
    topo, call = ctx.topo, ctx.call
    call(topo.local, "Reduce", send, recv, op, 0)
    if topo.leaders is not None and topo.num_nodes > 1:
        call(topo.leaders, "Allreduce", MPI.IN_PLACE, recv, op)
    call(topo.local, "Bcast", recv, 0)


def bcast(ctx, buf: np.ndarray, root: int) -> None:
    topo, call = ctx.topo, ctx.call
    root_node, root_local = _root_place(topo, root)
    in_root_node = topo.node_index == root_node
    if in_root_node and root_local != 0:
        call(topo.local, "Bcast", buf, root_local)
    if topo.leaders is not None and topo.num_nodes > 1:
        call(topo.leaders, "Bcast", buf, root_node)
    if not in_root_node or root_local == 0:
        call(topo.local, "Bcast", buf, 0)


def reduce(ctx, send: np.ndarray, recv: np.ndarray | None, op: MPI.Op, root: int) -> None:
    topo, call = ctx.topo, ctx.call
    root_node, root_local = _root_place(topo, root)
    partial = buffers.empty_like(send) if topo.local_rank == 0 else None
    call(topo.local, "Reduce", send, partial, op, 0)
    if topo.leaders is not None and topo.num_nodes > 1:
        at_root_leader = topo.node_index == root_node
        call(topo.leaders, "Reduce", MPI.IN_PLACE if at_root_leader else partial,
             partial if at_root_leader else None, op, root_node)
    if topo.node_index != root_node:
        return
    if root_local == 0:
        if topo.rank == root:
            assert recv is not None, "the root passes a receive buffer"
            recv[...] = partial
    elif topo.local_rank == 0:
        call(topo.local, "Send", partial, root_local, 0)
    elif topo.rank == root:
        call(topo.local, "Recv", recv, 0, 0)


def allgatherv(ctx, send: np.ndarray, recv: np.ndarray, counts: np.ndarray) -> None:
    topo, call = ctx.topo, ctx.call
    node_ranks = topo.node_ranks[topo.node_index]
    node_counts = counts[list(node_ranks)]
    displs = displacements(counts)
    ordered = [r for ranks in topo.node_ranks for r in ranks]
    contiguous = ordered == list(range(topo.size))
    if topo.local_rank == 0:
        node_buf = buffers.empty(int(node_counts.sum()), recv.dtype)
        call(topo.local, "Gatherv", send, [node_buf, (node_counts, displacements(node_counts)), MPI.BYTE], 0)
        if topo.num_nodes > 1:
            totals = np.array([counts[list(r)].sum() for r in topo.node_ranks], dtype=counts.dtype)
            whole = recv if contiguous else buffers.empty_like(recv)
            call(topo.leaders, "Allgatherv", node_buf, [whole, (totals, displacements(totals)), MPI.BYTE])
            if not contiguous:
                at = 0
                for r in ordered:
                    recv[displs[r]:displs[r] + counts[r]] = whole[at:at + counts[r]]
                    at += counts[r]
        else:
            recv[...] = node_buf
    else:
        call(topo.local, "Gatherv", send, None, 0)
    call(topo.local, "Bcast", recv, 0)


def reduce_scatter(ctx, send: np.ndarray, recv: np.ndarray, counts: list[int], op: MPI.Op) -> None:
    topo, call = ctx.topo, ctx.call
    blocks = np.asarray(counts, dtype=np.int64)
    ordered = [r for ranks in topo.node_ranks for r in ranks]
    total = buffers.empty_like(send)
    if ordered != list(range(topo.size)):  # nodes not in rank blocks: reduce everything, keep ours
        allreduce(ctx, send, total, op)
        start = int(displacements(blocks)[topo.rank])
        recv[...] = total[start:start + blocks[topo.rank]]
        return
    node_counts = blocks[list(topo.node_ranks[topo.node_index])]
    call(topo.local, "Reduce", send, total if topo.local_rank == 0 else None, op, 0)
    if topo.local_rank == 0:
        totals = np.array([blocks[list(r)].sum() for r in topo.node_ranks], dtype=blocks.dtype)
        node_part = buffers.empty(int(totals[topo.node_index]), send.dtype)
        if topo.num_nodes > 1:
            call(topo.leaders, "Reduce_scatter", total, node_part, totals, op)
        else:
            node_part[...] = total
        call(topo.local, "Scatterv", [node_part, (node_counts, displacements(node_counts))], recv, 0)
    else:
        call(topo.local, "Scatterv", None, recv, 0)
