"""mpidist.horovod basics, process sets and HOROVOD_* variables, against what MPI says."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import tensorflow as tf
from mpi4py import MPI

import mpidist
import mpidist.horovod.tensorflow as hvd
from mpidist.horovod.tensorflow import environment
from horovod_support import data, run
from mpidist.collectives.timeline import rank_path
from mpidist.timeline import read_trace

pytestmark = [pytest.mark.node_layout, pytest.mark.two_nodes]

@pytest.fixture(scope="module", autouse=True)
def initialized():
    hvd.init()


def test_ranks_and_sizes_match_mpi():
    world = MPI.COMM_WORLD
    assert hvd.is_initialized()
    assert (hvd.rank(), hvd.size()) == (world.Get_rank(), world.Get_size())
    local = mpidist.rc.local_size or None
    node_sizes = hvd.allgather_object(hvd.local_size())
    if local:
        assert hvd.local_size() == min(local, hvd.size() - hvd.rank() // local * local)
        assert hvd.local_rank() == hvd.rank() % local
    assert 0 <= hvd.local_rank() < hvd.local_size()
    nodes = hvd.allgather_object((hvd.cross_rank(), hvd.local_rank()))
    assert len(set(nodes)) == hvd.size()  # (node, local rank) names every rank once
    assert hvd.cross_size() == sum(1 for _, lr in nodes if lr == hvd.local_rank())
    assert hvd.is_homogeneous() == (len(set(node_sizes)) == 1)
    assert int(hvd.rank_op()) == hvd.rank() and int(hvd.size_op()) == hvd.size()
    assert int(hvd.local_rank_op()) == hvd.local_rank() and int(hvd.cross_size_op()) == hvd.cross_size()


def test_build_facts():
    assert hvd.mpi_enabled() and hvd.mpi_built()
    assert not hvd.gloo_enabled() and not hvd.gloo_built()
    assert hvd.cuda_built() == tf.test.is_built_with_cuda()
    assert hvd.mpi_threads_supported() == (MPI.Query_thread() == MPI.THREAD_MULTIPLE)


def test_shutdown_and_init_again():
    hvd.shutdown()
    assert not hvd.is_initialized()
    with pytest.raises(ValueError, match="not been initialized"):
        hvd.allreduce(tf.ones([1]))
    with pytest.raises(ValueError, match="not been initialized"):
        hvd.rank()
    hvd.init()
    assert hvd.allreduce(tf.ones([1]), op=hvd.Sum).numpy()[0] == hvd.size()


@pytest.mark.parametrize("mode", ["eager", "function", "graph"])
def test_process_sets(mode):
    n, me = hvd.size(), hvd.rank()
    if n == 1:
        with pytest.raises(ValueError, match="exists already"):  # the same ranks as the global set
            hvd.add_process_set([0])
        pytest.skip("two process sets need two ranks")
    evens = hvd.add_process_set([r for r in range(n) if r % 2 == 0])
    odds = hvd.add_process_set(hvd.ProcessSet([r for r in range(n) if r % 2 == 1]))
    try:
        mine = evens if me % 2 == 0 else odds
        members = mine.ranks
        assert mine.included() and mine.size() == len(members) and mine.rank() == members.index(me)
        x = data(me, (3,))
        summed, gathered, bcast = run(mode, lambda t: (hvd.allreduce(t, op=hvd.Sum, process_set=mine),
                                                       hvd.allgather(t, process_set=mine),
                                                       hvd.broadcast(t, 0, process_set=mine)), x)
        np.testing.assert_array_equal(summed, np.sum([data(r, (3,)) for r in members], axis=0))
        np.testing.assert_array_equal(gathered, np.concatenate([data(r, (3,)) for r in members]))
        np.testing.assert_array_equal(bcast, data(members[0], (3,)))
        other = odds if mine is evens else evens
        assert not other.included() and other.rank() is None
        with pytest.raises(ValueError, match="not in process set"):
            hvd.allreduce(tf.ones([1]), process_set=other)
    finally:
        assert hvd.remove_process_set(evens)
        assert hvd.remove_process_set(odds)
    assert not hvd.remove_process_set(evens)
    with pytest.raises(ValueError, match="global process set"):
        hvd.remove_process_set(hvd.global_process_set)
    with pytest.raises(ValueError, match="not been registered"):
        hvd.allreduce(tf.ones([1]), process_set=hvd.ProcessSet([0]))


def test_process_set_from_communicator():
    world = MPI.COMM_WORLD
    sub = world.Split(0 if world.Get_rank() == 0 else MPI.UNDEFINED, world.Get_rank())
    if world.Get_size() == 1:
        with pytest.raises(ValueError, match="exists already"):
            hvd.add_process_set(hvd.ProcessSet(sub))
        sub.Free()
        return
    ps = hvd.add_process_set(hvd.ProcessSet(sub))
    try:
        assert ps.ranks == [0]
        assert ps.included() == (hvd.rank() == 0)
    finally:
        hvd.remove_process_set(ps)
        if sub != MPI.COMM_NULL:
            sub.Free()


def test_environment_variables_map_onto_rc(caplog):
    saved = mpidist.rc.as_dict()
    try:
        with caplog.at_level(logging.DEBUG, logger="mpidist"):
            changed = environment.apply({"HOROVOD_FUSION_THRESHOLD": "1048576", "HOROVOD_TIMELINE": "",
                                         "HOROVOD_STALL_CHECK_TIME_SECONDS": "30",
                                         "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "0",
                                         "HOROVOD_HIERARCHICAL_ALLREDUCE": "1", "HOROVOD_CYCLE_TIME": "5"})
        assert changed == {"bytes_per_pack": 1 << 20, "timeline": "", "stall_seconds": 30.0,
                           "stall_abort_seconds": None, "algorithm": "hierarchical"}
        assert mpidist.rc.bytes_per_pack == 1 << 20 and mpidist.rc.algorithm == "hierarchical"
        assert "HOROVOD_CYCLE_TIME" in caplog.text
        np.testing.assert_array_equal(hvd.allreduce(tf.ones([3]), op=hvd.Sum).numpy(), [hvd.size()] * 3)
        assert environment.apply({"HOROVOD_HIERARCHICAL_ALLREDUCE": "1", "MPIDIST_ALGORITHM": "flat"}) == {}
        with pytest.raises(ValueError, match="HOROVOD_FUSION_THRESHOLD"):
            environment.apply({"HOROVOD_FUSION_THRESHOLD": "lots"})
    finally:
        mpidist.rc(**saved)


def test_timeline_start_stop(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tl") / "trace.json")
    hvd.start_timeline(path)
    try:
        assert mpidist.rc.timeline == path
        hvd.allreduce(tf.ones([2]))
    finally:
        hvd.stop_timeline()
    assert mpidist.rc.timeline == ""
    hvd.allreduce(tf.ones([2]))  # the next collective closes the file
    events = read_trace(rank_path(path, hvd.rank()))
    assert any("allreduce" in str(e.get("name", "")) for e in events)


def test_init_on_a_communicator_and_on_a_rank_list():
    world = MPI.COMM_WORLD
    me = world.Get_rank()
    half = world.Split(me % 2, me)
    members = [r for r in range(world.Get_size()) if r % 2 == me % 2]
    hvd.shutdown()
    try:
        hvd.init(comm=half)
        assert (hvd.size(), hvd.rank()) == (len(members), members.index(me))
        np.testing.assert_array_equal(hvd.allreduce(tf.constant(data(me, (3,))), op=hvd.Sum).numpy(),
                                      np.sum([data(r, (3,)) for r in members], axis=0))
        hvd.shutdown()
        hvd.init(comm=list(range(world.Get_size())))
        assert (hvd.size(), hvd.rank()) == (world.Get_size(), me)
    finally:
        hvd.shutdown()
        half.Free()
        hvd.init()
    assert hvd.size() == world.Get_size()
