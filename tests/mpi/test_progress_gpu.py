"""Asynchronous collectives and gradient buckets on CuPy arrays: on a GPU with CuPy, else on the
host fake of CuPy/NCCL (fake_cupy.py), whose streams keep work pending until the host waits, so a
collective run on the progress thread without the caller's stream would read stale memory."""
from __future__ import annotations

import numpy as np
import pytest
from gpu_arrays import NCCL_ALWAYS, REAL_GPU, cp  # noqa: F401 (cp: the module-scoped CuPy fixture)
from reference import make, reduce_all

import mpidist
from mpidist.collectives.gpu import facts as gpu_facts
from mpidist.collectives.options import CallOptions
from mpidist.overlap import GradientBuckets

pytestmark = [pytest.mark.mpi, pytest.mark.node_layout] + ([] if REAL_GPU else [pytest.mark.fake_gpu])


@pytest.mark.parametrize("implementation", ["auto", "ring"])
def test_async_device_arrays_equal_blocking(cp, comm, implementation):
    rank, size = comm.Get_rank(), comm.Get_size()
    engine = mpidist.Engine(comm)
    try:
        host = [make(r, np.float32, (257,), seed=3) for r in range(size)]
        x = cp.asarray(host[rank])
        x *= 2  # queued on the stream, not yet run: the collective must wait for it
        options = mpidist.collectives.CallOptions(implementation=implementation)
        pending = engine.allreduce_async({"x": x, "h": np.arange(3.0)}, "sum", options=options)
        got = pending.wait()
        assert isinstance(got["x"], cp.ndarray)
        expected = reduce_all([2 * h for h in host], "sum")
        np.testing.assert_array_equal(cp.asnumpy(got["x"]), expected)
        np.testing.assert_array_equal(got["h"], np.arange(3.0) * size)
        blocking = engine.allreduce({"x": x, "h": np.arange(3.0)}, "sum", options=options)
        np.testing.assert_array_equal(cp.asnumpy(blocking["x"]), cp.asnumpy(got["x"]))
    finally:
        engine.close()


def test_gradient_buckets_on_device_arrays(cp, comm):
    rank, size = comm.Get_rank(), comm.Get_size()
    shapes = [(64, 32), (32,), (32, 8), (8,)]
    with mpidist.rc.override(framework="numpy"), mpidist.MultiWorkerMirroredStrategy() as strategy:
        like = [cp.zeros(s, dtype=cp.float32) for s in shapes]
        buckets = GradientBuckets(like, "mean", strategy=strategy,
                                  options=mpidist.experimental.CommunicationOptions(bytes_per_pack=1024))
        assert len(buckets.plan) >= 2
        host = [[make(r, np.float32, s, seed=i) for i, s in enumerate(shapes)] for r in range(size)]
        for i in reversed(range(len(shapes))):
            g = cp.asarray(host[rank][i])
            g += 0  # pending work on the stream
            buckets.add(i, g)
        got = buckets.result()
        for i, g in enumerate(got):
            assert isinstance(g, cp.ndarray)
            np.testing.assert_array_equal(cp.asnumpy(g), reduce_all([h[i] for h in host], "mean"))


def test_the_calls_implementation_reaches_the_progress_thread(cp, comm):
    """The implementation travels in the call's options, which the progress thread runs with."""
    engine = mpidist.Engine(comm)
    try:
        state = gpu_facts.state(engine)
        for implementation, nccl in (("ring", False), ("auto", True)):
            pending = engine.allreduce_async(cp.ones(4, dtype=cp.float32),
                                             options=CallOptions(implementation=implementation))
            np.testing.assert_array_equal(cp.asnumpy(pending.wait()), np.full(4, comm.Get_size(), np.float32))
            if implementation == "ring" or NCCL_ALWAYS:  # the fake's NCCL always works
                assert state.last_path.uses_nccl is nccl, state.last_path
    finally:
        engine.close()


@pytest.mark.parametrize("implementation", ["auto", "ring"])
def test_async_runs_on_the_submitters_stream(cp, comm, implementation):
    """CuPy's current stream is per thread: the progress thread must run the collective on the
    stream of the thread that submitted it (here a non-blocking one, which the null stream does not
    wait for), after the work that produced the arrays, and its result is ordered on that stream."""
    rank, size = comm.Get_rank(), comm.Get_size()
    engine = mpidist.Engine(comm)
    mine, other = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    options = mpidist.collectives.CallOptions(implementation=implementation)
    try:
        host = [make(r, np.float32, (1000,), seed=5) for r in range(size)]
        expected = reduce_all([3 * h for h in host], "sum")
        for step in range(3):  # the first call, then the engine's repeats
            with mine:
                x = cp.asarray(host[rank])
                x *= 3  # pending on `mine` until someone waits for it
                pending = engine.allreduce_async([x, x + 0], "sum", options=options)
                with other:  # work on another stream meanwhile: not what the collective must wait for
                    cp.ones(10, dtype=cp.float32) * 2
                got = pending.wait()
                for g in got:
                    assert isinstance(g, cp.ndarray)
                    np.testing.assert_array_equal(g.get(stream=mine), expected)
    finally:
        engine.close()
