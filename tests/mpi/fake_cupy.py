"""A stand-in for CuPy (with fake_nccl.py for its NCCL bindings), backed by host memory and MPI: it runs mpidist's GPU
path (dispatch, path choice, packing, NCCL groups, hierarchical NCCL+MPI, staging, CUDA-aware MPI
on "device" pointers) on machines without a GPU, so its logic is tested at every ``-n``.

What it checks, as strictly as real CuPy or stricter:

- device arrays never turn into host arrays by accident: ``numpy.asarray(x)`` raises TypeError, as
  CuPy does, and host values may not be assigned into device arrays; every explicit copy
  (``asarray`` of host data, ``get``, ``set``, ``asnumpy``) is counted in :data:`transfers`;
- in-place arithmetic casts as CuPy does (``same_kind``); ``set``/``get(out=)`` need contiguous
  arrays of the same shape and dtype, as in CuPy;
- every allocation is registered, so that fake_nccl.py can match NCCL's raw pointers to live
  allocations, and tell when a buffer was freed before a grouped NCCL call ran.

What it cannot check: stream ordering (everything here runs at once), CuPy's memory pool, real
CUDA-aware MPI, DLPack with TensorFlow, NCCL's own limits. Those need a GPU (docs/gpu.md).

``install()`` puts ``cupy``, ``cupy.cuda``, ``cupy.cuda.nccl``, ``cupy.cuda.runtime`` and
``cupyx`` into ``sys.modules``; ``uninstall()`` takes them out again.
"""
from __future__ import annotations

import itertools
import sys
import types
import weakref
from typing import Any

import numpy as np
from mpi4py import MPI

transfers = {"to_device": 0, "to_host": 0}   # bytes copied across the (pretend) PCIe bus
_live: dict[int, tuple[int, int]] = {}       # serial -> (start address, nbytes) of live allocations
_serials = itertools.count()
_current_device = [0]


def _allocation(a: np.ndarray) -> np.ndarray:
    """Register ``a`` (a fresh NumPy array) as a device allocation that NCCL calls may point into."""
    serial = next(_serials)
    _live[serial] = (a.ctypes.data, a.nbytes)
    weakref.finalize(a, _live.pop, serial, None)
    return a


def allocation_of(ptr: int, nbytes: int, what: str) -> int | None:
    """The serial number of the live allocation holding ``nbytes`` at ``ptr`` (None for 0 bytes)."""
    if nbytes == 0:
        return None
    for serial, (start, size) in _live.items():
        if start <= ptr and ptr + nbytes <= start + size:
            return serial
    raise RuntimeError(f"fake NCCL: {what} points at {nbytes} bytes at {ptr:#x}, which no live device "
                       f"allocation holds")


def check_alive(serial: int | None, what: str) -> None:
    """Raise if allocation ``serial`` was freed (its address may hold another array by now)."""
    if serial is not None and serial not in _live:
        raise RuntimeError(f"fake NCCL: the buffer of {what} was freed before the NCCL call ran (inside a "
                           f"group, calls run at groupEnd: keep their buffers referenced until then)")


class _Pointer:
    def __init__(self, ptr: int) -> None:
        self.ptr = ptr


class Device:
    def __init__(self, device: int = None) -> None:
        self.id = _current_device[0] if device is None else int(device)
        self._previous: list[int] = []

    @property
    def pci_bus_id(self) -> str:  # one pretend GPU per process: NCCL never sees a shared GPU
        return f"fake:{MPI.COMM_WORLD.Get_rank()}:{self.id}"

    def use(self) -> None:
        _current_device[0] = self.id

    def synchronize(self) -> None:
        pass

    def __enter__(self) -> "Device":
        self._previous.append(_current_device[0])
        _current_device[0] = self.id
        return self

    def __exit__(self, *exc: Any) -> None:
        _current_device[0] = self._previous.pop()


class Stream:
    ptr = 0
    done = True

    def synchronize(self) -> None:
        pass


_STREAM = Stream()


class ndarray:
    """A device array: a NumPy array underneath, reachable only through explicit copies."""

    __slots__ = ("_a", "_device", "__weakref__")

    def __init__(self, a: np.ndarray, device: int | None = None) -> None:
        self._a = a
        self._device = _current_device[0] if device is None else device

    # -- what CuPy arrays have ---------------------------------------------------------------------
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    ndim = property(lambda self: self._a.ndim)
    strides = property(lambda self: self._a.strides)
    itemsize = property(lambda self: self._a.itemsize)
    flags = property(lambda self: self._a.flags)
    data = property(lambda self: _Pointer(self._a.ctypes.data))
    device = property(lambda self: Device(self._device))

    @property
    def __cuda_array_interface__(self) -> dict:
        a = self._a
        return {"shape": a.shape, "typestr": a.dtype.str, "data": (a.ctypes.data, False), "version": 3,
                "strides": None if a.flags.c_contiguous else a.strides}

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise TypeError("Implicit conversion to a NumPy array is not allowed. Please use `.get()` to "
                        "construct a NumPy array explicitly.")

    def __len__(self) -> int:
        return len(self._a)

    def __repr__(self) -> str:
        return f"fake_cupy.ndarray({self._a!r})"

    def _wrap(self, a: Any) -> "ndarray":
        return ndarray(np.asarray(a), self._device)

    def reshape(self, *shape: Any) -> "ndarray":
        return self._wrap(self._a.reshape(*shape))

    def ravel(self) -> "ndarray":
        return self._wrap(self._a.ravel())

    def view(self, dtype: Any) -> "ndarray":
        return self._wrap(self._a.view(dtype))

    def astype(self, dtype: Any, copy: bool = True) -> "ndarray":
        if not copy and np.dtype(dtype) == self.dtype:
            return self
        return self._wrap(_allocation(self._a.astype(dtype)))

    def copy(self) -> "ndarray":
        return self._wrap(_allocation(self._a.copy()))

    def get(self, stream: Any = None, order: str = "C", out: np.ndarray | None = None) -> np.ndarray:
        transfers["to_host"] += self.nbytes
        if out is None:
            return self._a.copy()
        if not isinstance(out, np.ndarray) or out.shape != self.shape or out.dtype != self.dtype \
                or not out.flags.c_contiguous:
            raise ValueError("fake cupy: `out` must be a C-contiguous NumPy array of the same shape and dtype")
        out[...] = self._a
        return out

    def set(self, arr: np.ndarray, stream: Any = None) -> None:
        if not self.flags.c_contiguous:
            raise RuntimeError("Cannot set to non-contiguous array")
        if not isinstance(arr, np.ndarray) or arr.shape != self.shape or arr.dtype != self.dtype:
            raise ValueError("fake cupy: set() needs a NumPy array of the same shape and dtype")
        transfers["to_device"] += arr.nbytes
        self._a[...] = arr

    def __getitem__(self, key: Any) -> "ndarray":
        return self._wrap(self._a[key])

    def __setitem__(self, key: Any, value: Any) -> None:
        self._a[key] = _device_operand(value, "__setitem__")

    # -- arithmetic (what mpidist and the tests use) -----------------------------------------------
    def _binary(self, other: Any, fn: Any) -> "ndarray":
        return self._wrap(_allocation(np.asarray(fn(self._a, _device_operand(other, "arithmetic")))))

    def _inplace(self, other: Any, fn: Any) -> "ndarray":
        fn(self._a, _device_operand(other, "arithmetic"), out=self._a, casting="same_kind")  # as CuPy
        return self

    __add__ = lambda self, o: self._binary(o, np.add)
    __sub__ = lambda self, o: self._binary(o, np.subtract)
    __mul__ = lambda self, o: self._binary(o, np.multiply)
    __rmul__ = lambda self, o: self._binary(o, np.multiply)
    __truediv__ = lambda self, o: self._binary(o, np.true_divide)
    __floordiv__ = lambda self, o: self._binary(o, np.floor_divide)
    __lt__ = lambda self, o: self._binary(o, np.less)
    __gt__ = lambda self, o: self._binary(o, np.greater)
    __eq__ = lambda self, o: self._binary(o, np.equal)
    __iadd__ = lambda self, o: self._inplace(o, np.add)
    __itruediv__ = lambda self, o: self._inplace(o, np.true_divide)
    __ifloordiv__ = lambda self, o: self._inplace(o, np.floor_divide)
    __neg__ = lambda self: self._wrap(_allocation(-self._a))
    __abs__ = lambda self: self._wrap(_allocation(np.abs(self._a)))
    __hash__ = None


def _device_operand(value: Any, what: str) -> Any:
    """The NumPy array under a device operand; Python scalars pass; host arrays are refused."""
    if isinstance(value, ndarray):
        return value._a
    if isinstance(value, (int, float, complex, bool, np.generic)):
        return value
    raise TypeError(f"fake cupy: {what} with a host value of type {type(value).__name__}: "
                    f"copy it to the device explicitly")


def _new(a: np.ndarray) -> ndarray:
    return ndarray(_allocation(a))


def asarray(x: Any, dtype: Any = None) -> ndarray:
    if isinstance(x, ndarray):
        return x if dtype is None or np.dtype(dtype) == x.dtype else x.astype(dtype)
    if hasattr(x, "__cuda_array_interface__") and not isinstance(x, np.ndarray):
        raise TypeError("fake cupy: foreign device arrays are not supported")
    host = np.array(x, dtype=dtype, copy=True, order="C")
    transfers["to_device"] += host.nbytes
    return _new(host)


def ascontiguousarray(x: ndarray) -> ndarray:
    return x if x.flags.c_contiguous else _new(np.ascontiguousarray(x._a))


def asnumpy(x: Any) -> np.ndarray:
    if isinstance(x, ndarray):
        return x.get()
    return np.asarray(x)


def empty(shape: Any, dtype: Any = float) -> ndarray:
    return _new(np.empty(shape, dtype=dtype))


def zeros(shape: Any, dtype: Any = float) -> ndarray:
    return _new(np.zeros(shape, dtype=dtype))


def ones(shape: Any, dtype: Any = float) -> ndarray:
    return _new(np.ones(shape, dtype=dtype))


def full(shape: Any, fill_value: Any, dtype: Any = None) -> ndarray:
    return _new(np.full(shape, fill_value, dtype=dtype))


def empty_like(x: ndarray, dtype: Any = None) -> ndarray:
    return _new(np.empty_like(x._a, dtype=dtype))


def zeros_like(x: ndarray, dtype: Any = None) -> ndarray:
    return _new(np.zeros_like(x._a, dtype=dtype))


def where(condition: ndarray, x: Any, y: Any) -> ndarray:
    return _new(np.where(_device_operand(condition, "where"), _device_operand(x, "where"),
                         _device_operand(y, "where")))


def abs(x: ndarray) -> ndarray:  # noqa: A001 - CuPy's name
    return _new(np.abs(x._a))


def _device_function(fn: Any) -> Any:
    """A NumPy function on device arrays, giving device arrays (``sum``, ``moveaxis``, ...)."""
    def run(x: ndarray, *args: Any, **kwargs: Any) -> ndarray:
        out = fn(_device_operand(x, fn.__name__), *args, **kwargs)
        return ndarray(np.asarray(out)) if np.shares_memory(out, x._a) else _new(np.asarray(out))
    run.__name__ = fn.__name__
    return run


sum, prod, min, max = (_device_function(f) for f in (np.sum, np.prod, np.min, np.max))  # noqa: A001
sign, moveaxis, full_like = (_device_function(f) for f in (np.sign, np.moveaxis, np.full_like))


def from_dlpack(x: Any) -> ndarray:
    raise NotImplementedError("fake cupy: DLPack needs a real GPU")


# -- modules -------------------------------------------------------------------------------------------

NAMES = ("cupy", "cupy.cuda", "cupy.cuda.nccl", "cupy.cuda.runtime", "cupyx")


def _modules() -> dict[str, types.ModuleType]:
    import fake_nccl
    cupy, cuda, runtime, cupyx = (types.ModuleType(n) for n in NAMES if n != "cupy.cuda.nccl")
    nccl = fake_nccl.module()
    me = sys.modules[__name__]
    for name in ("ndarray", "asarray", "ascontiguousarray", "asnumpy", "empty", "zeros", "ones", "full",
                 "empty_like", "zeros_like", "where", "abs", "from_dlpack", "sum", "prod", "min", "max", "sign",
                 "moveaxis", "full_like"):
        setattr(cupy, name, getattr(me, name))
    for name in ("bool_", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
                 "float16", "float32", "float64", "complex64", "complex128"):
        setattr(cupy, name, getattr(np, name))
    cupy.cuda, cupy.fake, cupy.__version__ = cuda, True, "14.0.0"
    cuda.nccl, cuda.runtime, cuda.Device, cuda.Stream = nccl, runtime, Device, Stream
    cuda.is_available = lambda: True
    cuda.get_current_stream = lambda: _STREAM
    runtime.getDeviceCount = lambda: 1
    runtime.deviceSynchronize = lambda: None
    cupyx.empty_pinned = lambda shape, dtype=float: np.empty(shape, dtype=dtype)
    return {"cupy": cupy, "cupy.cuda": cuda, "cupy.cuda.nccl": nccl, "cupy.cuda.runtime": runtime,
            "cupyx": cupyx}


_saved: dict[str, types.ModuleType] = {}


def install() -> types.ModuleType:
    """Put the fake CuPy in ``sys.modules`` (collective over COMM_WORLD: every rank calls it); a
    real CuPy already imported (installed, but no GPU) is put aside until :func:`uninstall`."""
    _saved.update({n: sys.modules[n] for n in NAMES if n in sys.modules})
    sys.modules.update(_modules())
    return sys.modules["cupy"]


def uninstall() -> None:
    for name in NAMES:
        sys.modules.pop(name, None)
    sys.modules.update(_saved)
    _saved.clear()
    import fake_nccl
    fake_nccl.close()
