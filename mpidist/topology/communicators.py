"""The communicators of one mpidist job, derived from MPI alone (never from launcher variables).

``Topology(comm)`` clones the caller's intracommunicator (so mpidist's traffic can never match the
caller's own messages), then splits it:

- ``local``: the ranks that share this node, from ``Split_type(COMM_TYPE_SHARED)``, or blocks of
  ``rc.local_size`` consecutive ranks when that setting (``MPIDIST_LOCAL_SIZE``) fakes nodes;
- ``cross``: the ranks with this rank's local rank on every node; for local rank 0 it is the
  communicator of node leaders.

Building a Topology is collective over ``comm``. mpidist never initializes or finalizes MPI beyond
what importing mpi4py does.
"""
from __future__ import annotations

import logging
from typing import Any, cast

from mpi4py import MPI

from .._config import rc
from ..validation import check_nonneg_int
from . import launchers

_log = logging.getLogger("mpidist")
_checked_launcher = False


def validate_comm(comm: Any, where: str = "Topology") -> MPI.Intracomm:
    """``comm`` as an intracommunicator; COMM_WORLD when it is None."""
    if comm is None:
        comm = MPI.COMM_WORLD
    if not isinstance(comm, MPI.Comm):
        raise TypeError(f"{where}: `comm` must be an mpi4py intracommunicator or None, "
                        f"got {type(comm).__name__}")
    if comm == MPI.COMM_NULL:
        raise ValueError(f"{where}: `comm` is MPI.COMM_NULL; pass the communicator this rank belongs to")
    if not isinstance(comm, MPI.Intracomm):
        raise TypeError(f"{where}: `comm` must be an intracommunicator, got {type(comm).__name__} "
                        f"(merge an intercommunicator first with comm.Merge())")
    if MPI.Is_finalized():
        raise RuntimeError(f"{where}: MPI is already finalized")
    return comm


class Topology:
    """A private clone of a communicator and its node-local and cross-node parts."""

    def __init__(self, comm: MPI.Intracomm | None = None, *, local_size: int | None = None) -> None:
        global _checked_launcher
        base = validate_comm(comm)
        if not _checked_launcher:
            _checked_launcher = True
            launchers.check_world_size(MPI.COMM_WORLD.Get_size())
        fake = check_nonneg_int(rc.local_size if local_size is None else local_size, "Topology", "local_size")

        self.comm: MPI.Intracomm = base.Clone()
        self.rank: int = self.comm.Get_rank()
        self.size: int = self.comm.Get_size()
        self.faked_nodes: bool = fake > 0
        if fake:
            self.local = self.comm.Split(self.rank // fake, self.rank)
        else:
            self.local = self.comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        self.local_rank: int = self.local.Get_rank()
        self.local_size: int = self.local.Get_size()
        # mpi4py's stub types Split as returning Comm; an Intracomm's split is an Intracomm
        self.cross = cast(MPI.Intracomm, self.comm.Split(self.local_rank, self.rank))

        # Node of every rank, nodes numbered by their lowest rank.
        leader = self.local.bcast(self.rank, root=0)
        leader_of = self.comm.allgather(leader)
        leaders = sorted(set(leader_of))
        self.node_of_rank: tuple[int, ...] = tuple(leaders.index(x) for x in leader_of)
        self.node_index: int = self.node_of_rank[self.rank]
        self.num_nodes: int = len(leaders)
        self.node_ranks: tuple[tuple[int, ...], ...] = tuple(
            tuple(r for r in range(self.size) if self.node_of_rank[r] == n) for n in range(self.num_nodes))
        self.node_sizes: tuple[int, ...] = tuple(len(r) for r in self.node_ranks)
        self.largest_node: int = max(self.node_sizes)
        self.processor_name: str = MPI.Get_processor_name()

    @property
    def is_chief(self) -> bool:
        return self.rank == 0

    @property
    def multi_node(self) -> bool:
        """More than one node and more than one rank on some node: where hierarchy can pay."""
        return 1 < self.num_nodes < self.size

    @property
    def leaders(self) -> MPI.Intracomm | None:
        """The communicator of node leaders (local rank 0), or None on other ranks."""
        return self.cross if self.local_rank == 0 else None

    def describe(self) -> dict[str, Any]:
        return {"rank": self.rank, "size": self.size, "node": self.node_index, "num_nodes": self.num_nodes,
                "local_rank": self.local_rank, "local_size": self.local_size,
                "faked_nodes": self.faked_nodes, "host": self.processor_name}

    def free(self) -> None:
        """Free the communicators this Topology created (collective); the caller's is untouched."""
        for name in ("cross", "local", "comm"):
            c = getattr(self, name, None)
            if c is not None and c != MPI.COMM_NULL and not MPI.Is_finalized():
                c.Free()
            setattr(self, name, None)

    def __repr__(self) -> str:
        return (f"Topology(rank={self.rank}, size={self.size}, node={self.node_index}/{self.num_nodes}, "
                f"local_rank={self.local_rank}/{self.local_size}{', faked' if self.faked_nodes else ''})")
