"""The GPU path without a GPU: imports stay clean, device arrays are recognized without CuPy, and
asking for the GPU path where CuPy is missing is a clear error. No GPU collective runs here (those
are in tests/mpi/test_gpu.py, skipped without a GPU)."""
from __future__ import annotations

import importlib.util
import subprocess
import sys

import numpy as np
import pytest

import mpidist
from mpidist.collectives import gpu
from mpidist.collectives.gpu import binding, cupy_arrays
from mpidist.collectives.options import CallOptions
from mpidist.errors import GpuUnavailableError

no_cupy = pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="cupy is installed here")
NOT_INSTALLED = "cupy is not installed (pip install cupy-cuda12x)"


class FakeDeviceArray:
    """Detection only: an object that claims CUDA memory. It never reaches a collective's data path."""

    def __init__(self, shape=(3,), typestr="<f4") -> None:
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (0, False), "version": 3}


class CpuTensorLike:
    """Like a PyTorch CPU tensor: the class has the attribute, the instance refuses it."""

    @property
    def __cuda_array_interface__(self):
        raise AttributeError("Can't get __cuda_array_interface__ on non-CUDA tensor")


def test_import_mpidist_and_gpu_modules_never_import_cupy():
    code = ("import sys, numpy as np, mpidist\n"
            "import mpidist.collectives.gpu.dispatch, mpidist.collectives.gpu.transports\n"
            "import mpidist.collectives.gpu.hierarchical, mpidist.collectives.gpu.device_collectives\n"
            "e = mpidist.Engine()\n"
            "assert e.allreduce([np.ones(2), 3.0], 'sum')[1] == 3.0\n"
            "assert not mpidist.collectives.gpu.any_device([np.ones(2), 1, 'x'])\n"
            "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('cupy', 'cupyx', 'cupy_backends'))\n"
            "assert not loaded, loaded\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_detection_by_cuda_array_interface():
    assert cupy_arrays.is_device_array(FakeDeviceArray())
    assert not cupy_arrays.is_device_array(CpuTensorLike())
    for host in (np.ones(3), np.float32(1), 1, 2.5, True, None, "s", [1, 2], {"a": 1}):
        assert not cupy_arrays.is_device_array(host)
    assert cupy_arrays.any_device([np.ones(2), 1.0, FakeDeviceArray()])
    assert not cupy_arrays.any_device([np.ones(2), CpuTensorLike()])


@no_cupy
def test_reasons_without_cupy():
    cupy_arrays.forget()
    assert cupy_arrays.cupy_reason() == NOT_INSTALLED
    assert cupy_arrays.nccl_reason() == NOT_INSTALLED
    assert cupy_arrays.nccl_version() == 0
    with pytest.raises(GpuUnavailableError, match="cupy is not installed"):
        cupy_arrays.load_cupy()


@no_cupy
def test_device_leaf_without_cupy_is_a_clear_error():
    engine = mpidist.Engine()
    try:
        with pytest.raises(GpuUnavailableError) as err:
            engine.allreduce({"w": np.ones(2), "g": FakeDeviceArray()}, "sum")
        assert str(err.value) == ("allreduce: leaf 0 of `value` is a CUDA device array (test_gpu_imports."
                                  "FakeDeviceArray), which needs CuPy, but " + NOT_INSTALLED)
        with pytest.raises(GpuUnavailableError) as err:
            engine.broadcast(FakeDeviceArray(),
                             options=CallOptions(implementation="NCCL", requested_by="NcclAllReduce"))
        assert str(err.value) == "NcclAllReduce: NCCL is not available: " + NOT_INSTALLED
        assert engine.broken is None  # nothing was sent: the engine stays usable
        assert engine.allreduce(np.ones(2)).tolist() == [1.0, 1.0]
    finally:
        engine.close()


@no_cupy
def test_nccl_all_reduce_on_device_buffers_without_cupy():
    ops = mpidist.NcclAllReduce()
    with pytest.raises(GpuUnavailableError) as err:
        ops.reduce("sum", FakeDeviceArray(), destinations=None)
    assert str(err.value) == "NcclAllReduce: NCCL is not available: " + NOT_INSTALLED
    assert ops.reduce("sum", np.ones(2), destinations=None).tolist() == [1.0, 1.0]  # host buffers: MPI


@no_cupy
def test_strategy_with_nccl_implementation_without_cupy():
    with mpidist.rc.override(framework="numpy"), pytest.raises(GpuUnavailableError) as err:
        mpidist.MultiWorkerMirroredStrategy(communication_options=mpidist.experimental.CommunicationOptions(
            implementation=mpidist.experimental.CommunicationImplementation.NCCL))
    assert str(err.value) == "MultiWorkerMirroredStrategy: NCCL is not available: " + NOT_INSTALLED


def test_the_implementation_travels_in_the_options():
    """No context variable: the implementation (and who asked for it) is a field of the call's
    options; a call's choice wins over the defaults it is merged over, and only the implementation
    set leaves the call on the engine's cached path."""
    ring = CallOptions(implementation=mpidist.experimental.CommunicationImplementation.RING)
    assert ring.implementation == "ring" and ring.requested_by is None
    assert not ring.empty and ring.implementation_only
    nccl = CallOptions(implementation="nccl", requested_by="NcclAllReduce")
    merged = ring.merged(nccl)
    assert (merged.implementation, merged.requested_by) == ("nccl", "NcclAllReduce")
    assert (nccl.merged(CallOptions(timeout_seconds=5)).implementation, nccl.resolve().requested_by) == \
        ("nccl", "NcclAllReduce")
    assert not CallOptions(implementation="ring", timeout_seconds=5).implementation_only
    assert CallOptions().empty and CallOptions().implementation_only
    with pytest.raises(ValueError, match="`implementation` must be one of AUTO, RING, NCCL, got 'gloo'"):
        CallOptions(implementation="gloo")
    assert not hasattr(gpu, "implementation") and not hasattr(gpu.paths, "current")


def test_device_for_local_rank():
    assert [binding.device_for(r, 4) for r in range(6)] == [0, 1, 2, 3, 0, 1]
    with pytest.raises(ValueError, match="`n_devices` must be >= 1, got 0"):
        binding.device_for(0, 0)


def test_bind_device_acts_only_when_the_program_uses_cupy(monkeypatch):
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    topo = mpidist.Topology()
    try:
        assert binding.bind_device(topo) is None  # CuPy not imported by the program: nothing done
        with mpidist.rc.override(bind_gpu=False):
            assert binding.bind_device(topo) is None
    finally:
        topo.free()


def test_bind_gpu_setting(monkeypatch):
    monkeypatch.setenv("MPIDIST_BIND_GPU", "0")
    assert mpidist._config.Settings().bind_gpu is False
    monkeypatch.setenv("MPIDIST_BIND_GPU", "maybe")
    with pytest.raises(ValueError, match="`MPIDIST_BIND_GPU` must be a boolean"):
        mpidist._config.Settings()
