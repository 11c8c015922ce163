"""Topology from MPI: clones, node-local and cross-node communicators, fake nodes, sub-communicators."""
from __future__ import annotations

import os

import numpy as np
import pytest
from mpi4py import MPI

import mpidist

pytestmark = [pytest.mark.mpi, pytest.mark.node_layout, pytest.mark.two_nodes]


def test_clone_and_nodes(comm):
    topo = mpidist.Topology(comm)
    assert topo.comm != comm and MPI.Comm.Compare(topo.comm, comm) == MPI.CONGRUENT
    assert (topo.rank, topo.size) == (comm.Get_rank(), comm.Get_size())
    fake = int(os.environ.get("MPIDIST_LOCAL_SIZE", "0"))
    if fake:
        assert topo.node_of_rank == tuple(r // fake for r in range(topo.size))
        assert topo.local_rank == topo.rank % fake
    else:  # real nodes: ranks on one host share a node
        hosts = comm.allgather(MPI.Get_processor_name())
        assert topo.num_nodes == len(set(hosts))
    assert sum(topo.node_sizes) == topo.size
    assert topo.local_size == topo.node_sizes[topo.node_index]
    # cross communicator: one rank per node with this local rank
    peers = topo.cross.allgather(topo.node_index)
    assert peers == sorted(set(peers))
    assert topo.cross.Get_size() == sum(1 for n in topo.node_sizes if n > topo.local_rank)
    assert (topo.leaders is not None) == (topo.local_rank == 0)
    topo.free()


def test_local_size_argument_overrides_setting(comm):
    topo = mpidist.Topology(comm, local_size=1)
    assert topo.num_nodes == topo.size and topo.local_size == 1
    assert not topo.multi_node
    topo.free()


def test_engine_on_sub_communicator(comm):
    rank, size = comm.Get_rank(), comm.Get_size()
    color = rank % 2
    sub = comm.Split(color, rank)
    engine = mpidist.Engine(sub)
    members = [r for r in range(size) if r % 2 == color]
    out = engine.allreduce(np.array([rank], dtype=np.int64))
    assert out[0] == sum(members)
    assert engine.allgather(np.array([rank])).tolist() == members
    engine.close()
    sub.Free()


@pytest.mark.parametrize("make", ["split", "dup"])
def test_replace_comm_moves_every_collective_to_the_new_communicator(comm, make):
    """Engine.replace_comm: one swap point; afterwards every collective runs on the new communicator."""
    rank, size = comm.Get_rank(), comm.Get_size()
    engine = mpidist.Engine(comm)
    x = np.array([rank, 1], dtype=np.int64)
    assert engine.allreduce(x).tolist() == [sum(range(size)), size]
    assert engine.pipeline.fast.lookup("sum", x) is not None  # the old pipeline cached this call
    old_pipeline, old_clone = engine.pipeline, engine.topology.comm
    if make == "split":
        color = rank % 2
        new = comm.Split(color, rank)
        members = [r for r in range(size) if r % 2 == color]
    else:
        new = comm.Dup()
        members = list(range(size))
    engine.replace_comm(new)
    assert old_pipeline.broken is not None and old_clone.py2f() != engine.topology.comm.py2f()
    assert engine.pipeline is not old_pipeline and engine.broken is None
    assert MPI.Comm.Compare(engine.topology.comm, new) == MPI.CONGRUENT  # a private clone of it
    assert (engine.rank, engine.size) == (members.index(rank), len(members))
    assert engine.pipeline.fast.lookup("sum", x) is None  # nothing derived from the old one survives
    for _ in range(2):  # the general path, then the cached one, both on the new communicator
        assert engine.allreduce(x).tolist() == [sum(members), len(members)]
    packed, scalar = engine.allreduce([x, np.float32(rank)], "max", bytes_per_pack=8)
    assert packed.tolist() == [max(members), 1] and scalar == np.float32(max(members))
    assert type(scalar) is np.float32
    assert engine.allgather(np.array([rank])).tolist() == members
    assert engine.broadcast(np.array([rank]), root=engine.size - 1).tolist() == [members[-1]]
    reduced = engine.reduce(x, "min", root=0)
    assert (reduced.tolist() if engine.rank == 0 else reduced) == ([min(members), 1] if engine.rank == 0 else None)
    expected = np.array_split(np.arange(6.0) * len(members), len(members))[engine.rank]
    assert engine.reduce_scatter(np.arange(6.0), timeout_seconds=30).tolist() == expected.tolist()
    engine.barrier(timeout_seconds=30)
    engine.close()
    new.Free()
    with pytest.raises(mpidist.errors.CommunicatorBrokenError, match="the engine was closed"):
        engine.allreduce(x)


def test_replace_comm_keeps_or_overrides_fake_nodes(comm):
    engine = mpidist.Engine(comm, local_size=1)
    new = comm.Dup()
    engine.replace_comm(new)  # the constructor's local_size stays
    assert engine.topology.num_nodes == engine.size and engine.topology.local_size == 1
    engine.replace_comm(new, local_size=engine.size)  # one fake node holding every rank
    assert engine.topology.num_nodes == 1
    assert engine.allreduce(np.ones(3), algorithm="hierarchical").tolist() == [engine.size] * 3
    engine.close()
    new.Free()


def test_user_messages_do_not_mix_with_engine_traffic(comm):
    """The engine works on a clone: a user's pending point-to-point message stays the user's."""
    rank, size = comm.Get_rank(), comm.Get_size()
    engine = mpidist.Engine(comm)
    send = comm.isend(("user", rank), dest=(rank + 1) % size, tag=0)
    for _ in range(3):
        engine.allreduce(np.ones(8))
        engine.broadcast(np.arange(4), root=size - 1)
    assert comm.recv(source=(rank - 1) % size, tag=0) == ("user", (rank - 1) % size)
    send.wait()
    engine.close()


def test_bad_communicators():
    with pytest.raises(TypeError, match="Topology: `comm` must be an mpi4py intracommunicator or None, got int"):
        mpidist.Topology(3)
    with pytest.raises(ValueError, match="`comm` is MPI.COMM_NULL"):
        mpidist.Topology(MPI.COMM_NULL)
    with pytest.raises(ValueError, match="Topology: `local_size` must be an integer >= 0, got -2"):
        mpidist.Topology(local_size=-2)
