"""NCCL inside each node, MPI across nodes: the transport of the ``nccl+mpi`` and ``nccl-copy+mpi``
paths.

allreduce, nodes of equal size (``nccl+mpi``): NCCL reduce-scatter inside the node (each local rank
holds 1/L of the sum), MPI allreduce of that shard among the ranks with the same local rank on
every node (``Topology.cross``), NCCL all-gather inside the node. Every link carries 1/L of the
data across nodes, and all L ranks of a node use the network at once.

allreduce, ``nccl-copy+mpi`` (nodes of unequal size, or HierarchicalCopyAllReduce): NCCL reduce
to local rank 0, MPI allreduce among node leaders, NCCL broadcast inside the node.

The other collectives are built on that allreduce, trading bandwidth for one well-trodden path:
reduce = allreduce kept at the root; reduce_scatter = allreduce, each rank keeping its block;
allgatherv = allreduce (SUM of bytes) of a zeroed buffer where each rank wrote its own bytes (each
byte has one non-zero contributor, so the sum is exact). broadcast goes root's node -> node
leaders (MPI) -> every node. MPI steps run on device pointers when every rank's MPI is CUDA-aware
and no deadline is set, else staged through page-locked host buffers (transports.py).

A node of one rank skips its NCCL steps (they would only copy): its allreduce is the MPI step alone,
from the send buffer into the receive buffer. When every node has one rank, that step runs on the
engine's communicator (the same ranks, in the same order, as ``Topology.cross`` then), as the
``mpi-staged``/``mpi-device`` paths' flat allreduce does: the same MPI calls, so the agreement can
replay them (agreement.py) and repeats take the cached fast path (fast.py).
"""
from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
from mpi4py import MPI

from ..algorithms import flat
from ..algorithms.flat import displacements
from ..ops import REDUCTIONS, Op
from . import nccl, transports
from .nccl import BYTES, Rule
from .transports import Env


class HierarchicalTransport:
    """See the module docstring. ``copy=True``: the reduce / leaders / broadcast variant."""

    per_leaf = False  # reductions pack leaves (device_collectives.py)

    def __init__(self, env: Env, node: nccl.NodeComm | None, mpi_on_device: bool, copy: bool) -> None:
        self.env, self.node, self.device, self.copy = env, node, mpi_on_device, copy
        self.topo = env.ctx.topo
        self.name = "nccl-copy+mpi" if copy else "nccl+mpi"

    def rule(self, dtype: np.dtype, op: Op, what: str) -> Rule | None:
        # (with hierarchical=True the NCCL version changes nothing: MPI's wire types, MEAN by division;
        # a node of one rank has no NCCL communicator to ask)
        version = self.node.version if self.node is not None else 0
        return nccl.nccl_rule(dtype, op, version, self.env.ctx.where, what, hierarchical=True)

    def _nccl(self) -> nccl.NodeComm:
        """The node's NCCL communicator: only a node of one rank has none, and it skips the NCCL steps."""
        assert self.node is not None, "a node of several ranks has an NCCL communicator"
        return self.node

    def group(self) -> Any:  # MPI steps read NCCL results, so nothing may wait for a group's end
        return contextlib.nullcontext()

    # -- MPI across nodes -------------------------------------------------------------------------

    def _mpi(self, comm: Any, name: str, buf: Any, *args: Any, root_has_data: bool = True) -> None:
        """``comm.<name>`` in place on a device buffer: on device pointers or staged."""
        env = self.env
        if self.device:
            env.wait()
            env.ctx.call(comm, name, *args)
            return
        host = transports.stage_to_host(env, buf) if root_has_data else transports.lend(env, buf)
        env.ctx.call(comm, name, *[host if a is buf else a for a in args])
        transports.stage_to_device(env, host, buf)

    def _cross_allreduce(self, comm: Any, buf: Any, rule: Rule) -> None:
        self._mpi(comm, "Allreduce", buf, MPI.IN_PLACE, buf, REDUCTIONS[rule.red])

    def _alone(self, send: Any, recv: Any, rule: Rule) -> None:
        """This node has one rank: the MPI step alone, ``send`` -> ``recv`` (see the module docstring)."""
        topo, env = self.topo, self.env
        mop = REDUCTIONS[rule.red]
        if topo.num_nodes == topo.size:  # every node one rank: the engine's communicator, as the flat allreduce
            if self.device:
                env.wait()
                flat.allreduce(env.ctx, send, recv, mop)
                return
            hrecv = transports.lend(env, recv, host_writes=False)
            flat.allreduce(env.ctx, transports.stage_to_host(env, send), hrecv, mop)
            transports.stage_to_device(env, hrecv, recv)
            return
        recv[...] = send  # (a node of one rank: its rank leads it)
        self._cross_allreduce(topo.leaders if self.copy else topo.cross, recv, rule)

    # -- the transport methods --------------------------------------------------------------------

    def allreduce(self, send: Any, recv: Any, rule: Rule) -> None:
        topo, stream, cp = self.topo, self.env.stream, self.env.cp
        if topo.local_size == 1:
            self._alone(send, recv, rule)
            return
        if self.copy:
            self._nccl().reduce(send, recv, rule, 0, stream)
            if topo.local_rank == 0:
                self._cross_allreduce(topo.leaders, recv, rule)
            self._nccl().broadcast(recv, 0, stream)
            return
        n, parts = send.size, topo.local_size
        shard = -(-n // parts)
        if shard * parts == n:
            padded, out = send, recv
        else:  # pad to a multiple of the node size; padded slots are reduced among themselves only
            padded = cp.zeros(shard * parts, dtype=rule.wire)
            padded[:n] = send
            out = cp.empty(shard * parts, dtype=rule.wire)
        mine = out[topo.local_rank * shard:(topo.local_rank + 1) * shard]
        self._nccl().reduce_scatter(padded, mine, rule, stream)
        self._cross_allreduce(topo.cross, mine, rule)
        self._nccl().allgather(mine, out, stream)  # in place: my shard already sits at its offset
        if out is not recv:
            recv[...] = out[:n]

    def bcast(self, buf: Any, root: int) -> None:
        topo, stream = self.topo, self.env.stream
        root_node = topo.node_of_rank[root]
        root_local = topo.node_ranks[root_node].index(root)
        in_root_node = topo.node_index == root_node
        if in_root_node and root_local != 0:
            self._nccl().broadcast(buf, root_local, stream)
        if topo.leaders is not None:
            self._mpi(topo.leaders, "Bcast", buf, buf, root_node, root_has_data=in_root_node)
        if (not in_root_node or root_local == 0) and topo.local_size > 1:
            self._nccl().broadcast(buf, 0, stream)

    def reduce(self, send: Any, recv: Any | None, rule: Rule, root: int) -> None:
        self.allreduce(send, recv if recv is not None else self.env.cp.empty_like(send), rule)

    def allgatherv(self, send: Any, recv: Any, counts: np.ndarray) -> None:
        counts_ = [int(c) for c in counts]
        start = displacements(counts_)[self.env.rank]
        mine = self.env.cp.zeros(recv.size, dtype=recv.dtype)
        mine[start:start + counts_[self.env.rank]] = send
        self.allreduce(mine, recv, BYTES)

    def reduce_scatter(self, send: Any, recv: Any, counts: list[int], rule: Rule) -> None:
        start = displacements(counts)[self.env.rank]
        total = self.env.cp.empty_like(send)
        self.allreduce(send, total, rule)
        recv[...] = total[start:start + counts[self.env.rank]]
