"""The host fake of CuPy and NCCL (fake_cupy.py, fake_nccl.py, fake_stream.py) is as strict as
its docstrings say: what test_gpu.py relies on to catch mpidist's mistakes without a GPU."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from mpidist.collectives.gpu import cupy_arrays

pytestmark = [pytest.mark.mpi, pytest.mark.fake_gpu]


@pytest.fixture(scope="module")
def cp():
    import fake_cupy
    cupy_arrays.forget()
    yield fake_cupy.install()
    fake_cupy.uninstall()
    cupy_arrays.forget()


def test_the_fake_refuses_what_a_gpu_would_punish(cp):
    nccl = cp.cuda.nccl
    comm = nccl.NcclCommunicator(1, nccl.get_unique_id(), 0)  # a one-rank communicator on every rank
    x = cp.ones(8, dtype=cp.float32)
    with pytest.raises(RuntimeError, match="not aligned"):
        comm.allReduce(x.data.ptr + 2, x.data.ptr, 4, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, 0)
    y = cp.ones(8, dtype=cp.float32)
    cp.cuda.get_current_stream().synchronize()  # (a pending fill would keep y alive)
    nccl.groupStart()
    comm.allReduce(y.data.ptr, y.data.ptr, 8, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, 0)
    del y  # freed before the group ran its call
    with pytest.raises(RuntimeError, match="freed before the NCCL call ran"):
        nccl.groupEnd()
    with pytest.raises(TypeError, match="Implicit conversion"):
        np.asarray(x)
    with pytest.raises(TypeError):
        x[...] = np.zeros(8, np.float32)  # host data into device memory needs an explicit copy
    with pytest.raises(TypeError):
        cp.ones(3, dtype=cp.int32).__itruediv__(2)  # CuPy casts in place only within a kind


def test_the_fake_stream_keeps_work_pending_until_a_wait(cp):
    """What the host reads through a device pointer (as CUDA-aware MPI does) is stale until it
    waits, whichever way it waits; a missing wait in mpidist therefore fails a test."""
    def raw(a):
        return np.frombuffer((ctypes.c_char * a.nbytes).from_address(a.data.ptr), dtype=a.dtype).copy()

    stream = cp.cuda.get_current_stream()
    x = cp.zeros(4, dtype=cp.float32)
    assert not (raw(x) == 0).any()  # the fill has not run: fresh memory holds 0xA5 bytes
    stream.synchronize()
    np.testing.assert_array_equal(raw(x), 0)
    x += 1
    np.testing.assert_array_equal(raw(x), 0)
    stream.record().synchronize()  # an event
    np.testing.assert_array_equal(raw(x), 1)
    y = x * 2
    assert not (raw(y) == 2).any()
    cp.cuda.Device().synchronize()
    np.testing.assert_array_equal(raw(y), 2)
    nccl = cp.cuda.nccl
    comm = nccl.NcclCommunicator(1, nccl.get_unique_id(), 0)
    z = cp.empty(4, dtype=cp.float32)
    comm.allReduce(y.data.ptr, z.data.ptr, 4, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream.ptr)
    assert not (raw(z) == 2).any()  # the NCCL call is queued, not run
    cp.cuda.runtime.deviceSynchronize()
    np.testing.assert_array_equal(raw(z), 2)
    x += 1
    np.testing.assert_array_equal(x.get(), 2)  # a blocking copy to the host waits first
    x += 1
    while not stream.done:  # polling is waiting too
        pass
    np.testing.assert_array_equal(raw(x), 3)


def test_the_fake_streams_are_ordered_only_by_events(cp):
    """Each stream is a queue of its own: waiting for one leaves another's work pending, unless an
    event (or the null stream's implicit waits, for blocking streams) orders them."""
    def raw(a):
        return np.frombuffer((ctypes.c_char * a.nbytes).from_address(a.data.ptr), dtype=a.dtype).copy()

    one, two = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    with one:
        x = cp.zeros(4, dtype=cp.float32)
        x += 1
    with two:
        y = x * 2  # reads x on another stream, without an event: stale
        two.synchronize()
    assert not (raw(y) == 2).all()
    one.synchronize()
    with one:
        x += 1
        done = one.record()
    with two:
        two.wait_event(done)
        z = x * 2  # ordered after x += 1 by the event
        two.synchronize()
    np.testing.assert_array_equal(raw(z), 4)
    blocking = cp.cuda.Stream()
    with blocking:
        w = cp.ones(4, dtype=cp.float32)
    v = w * 3  # on the null stream: waits for the blocking stream's earlier work
    cp.cuda.Stream.null.synchronize()
    np.testing.assert_array_equal(raw(v), 3)


def test_the_fake_current_stream_and_device_are_per_thread(cp):
    import threading
    side = cp.cuda.Stream(non_blocking=True)
    seen = {}
    with side:
        thread = threading.Thread(target=lambda: seen.update(stream=cp.cuda.get_current_stream(),
                                                             device=cp.cuda.runtime.getDevice()))
        thread.start()
        thread.join()
        assert cp.cuda.get_current_stream() is side
    assert seen["stream"].ptr == 0 and seen["device"] == 0


def test_the_fake_pinned_copies_are_asynchronous_and_counted(cp):
    import cupyx
    import fake_stream
    stream = cp.cuda.Stream(non_blocking=True)
    pinned, pageable = cupyx.empty_pinned(4, dtype=np.float32), np.ones(4, dtype=np.float32)
    pinned[...] = 1
    a, b = cp.empty(4, dtype=cp.float32), cp.empty(4, dtype=cp.float32)
    a.set(pinned, stream=stream)
    b.set(pageable, stream=stream)
    pinned[...] = 7   # before the copy ran: page-locked memory is read when it runs
    pageable[...] = 7  # pageable memory was read at once
    waits = fake_stream.device().waits
    np.testing.assert_array_equal(a.get(stream=stream), 7)
    np.testing.assert_array_equal(b.get(stream=stream), 1)
    assert fake_stream.device().waits == waits + 2  # two blocking copies to the host
    out = cupyx.empty_pinned(4, dtype=np.float32)
    out[...] = 0
    with stream:
        a += 1
        a.get(out=out, blocking=False)
    assert (out == 0).all()  # queued, not run
    stream.synchronize()
    np.testing.assert_array_equal(out, 8)
