"""Real nodes (tests/run's "mpi two nodes" launch, tests/two_nodes/run): MPI alone finds the nodes.

That launch sets MPITEST_REAL_NODES=2 and starts 2 ranks on each of two host names (each in a UTS
namespace of its own), with no MPIDIST_LOCAL_SIZE: the topology comes from COMM_TYPE_SHARED, and
hierarchical collectives really cross between the two nodes over TCP. Elsewhere these tests skip.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
from mpi4py import MPI

import mpidist
from mpidist.collectives.algorithms import hierarchical
from reference import OPS, make, reduce_all, valid

NODES = int(os.environ.get("MPITEST_REAL_NODES", "0"))
pytestmark = [pytest.mark.mpi, pytest.mark.two_nodes,
              pytest.mark.skipif(not NODES, reason="needs the real two-node launch of tests/run (MPITEST_REAL_NODES)")]


def test_mpi_alone_finds_the_nodes(comm):
    assert "MPIDIST_LOCAL_SIZE" not in os.environ and not mpidist.rc.local_size  # no fake nodes
    size = comm.Get_size()
    assert size % NODES == 0, (size, NODES)
    hosts = comm.allgather(MPI.Get_processor_name())
    assert len(set(hosts)) == NODES, hosts
    topo = mpidist.Topology(comm)
    try:
        assert topo.num_nodes == NODES and topo.node_sizes == (size // NODES,) * NODES, topo
        assert topo.multi_node
        # the ranks of my node are exactly those on my host
        assert sorted(topo.node_ranks[topo.node_index]) == [r for r, h in enumerate(hosts) if h == hosts[comm.rank]]
    finally:
        topo.free()


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [np.int32, np.float64, np.float32, np.bool_], ids=lambda d: np.dtype(d).name)
def test_hierarchical_allreduce_equals_flat_across_real_nodes(comm, monkeypatch, dtype, op):
    if not valid(dtype, op):
        pytest.skip("not a valid reduction")
    engine = mpidist.Engine(comm)
    calls = []
    original = hierarchical.allreduce
    monkeypatch.setattr(hierarchical, "allreduce", lambda *a, **k: calls.append(1) or original(*a, **k))
    try:
        size = engine.size
        for shape in [(7,), (300, 5), (40_001,)]:  # the last one is split into shards across the nodes
            mine = make(engine.rank, dtype, shape, op)
            flat = engine.allreduce(mine, op, algorithm="flat")
            hier = engine.allreduce(mine, op, algorithm="hierarchical")
            expected = reduce_all([make(r, dtype, shape, op) for r in range(size)], op)
            np.testing.assert_array_equal(hier, flat)
            np.testing.assert_array_equal(flat, expected)
        assert calls, "the hierarchical algorithm was not used"
    finally:
        engine.close()
