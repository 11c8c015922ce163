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

- streams (fake_stream.py): kernels, copies and NCCL calls stay pending on their stream until the
  host waits for it (or another rank's NCCL call needs them), so a missing wait before the host
  reads device memory (MPI on device pointers) reads stale memory and fails a test; each stream is
  a queue of its own, ordered with others only by events and the null stream's implicit waits, so
  work read on the wrong stream is stale too; the current stream and device are per thread, as in
  CuPy; fresh allocations hold 0xA5 bytes, as uninitialised memory would;
- copies between the host and page-locked memory (``cupyx.empty_pinned``) are asynchronous, as
  CUDA's are: ``set`` from pinned memory reads it when the copy runs, and ``get(out=pinned,
  blocking=False)`` writes it then; from pageable memory ``set`` reads it at once, as the driver
  does.

What it cannot check: CuPy's memory pool, real CUDA-aware MPI, DLPack with TensorFlow, NCCL's own
limits. Those need a GPU (docs/gpu.md).

``install()`` puts ``cupy``, ``cupy.cuda``, ``cupy.cuda.nccl``, ``cupy.cuda.runtime`` and
``cupyx`` into ``sys.modules``; ``uninstall()`` takes them out again.
"""
from __future__ import annotations

import ctypes
import itertools
import os
import sys
import threading
import types
import warnings
import weakref
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

import fake_stream
from fake_stream import Event, Stream

transfers = {"to_device": 0, "to_host": 0}   # bytes copied across the (pretend) PCIe bus
_live: dict[int, tuple[int, int, weakref.ref]] = {}  # serial -> (start, nbytes, array) of live allocations
_serials = itertools.count()
_threads = threading.local()                 # each thread's current device (CuPy keeps it per thread)
_pinned: dict[int, tuple[int, int]] = {}     # id -> (start, nbytes) of live page-locked host arrays
POISON = 0xA5                                # the bytes of a fresh allocation


def _allocation(a: np.ndarray) -> np.ndarray:
    """Register ``a`` (a fresh NumPy array) as a device allocation that NCCL calls may point into."""
    serial = next(_serials)
    _live[serial] = (a.ctypes.data, a.nbytes, weakref.ref(a))
    weakref.finalize(a, _live.pop, serial, None)
    return a


def _live_items() -> list:
    """A snapshot of the live allocations (the device thread, or the garbage collector, may free
    some while it is taken: then take it again)."""
    while True:
        try:
            return list(_live.items())
        except RuntimeError:  # dictionary changed size during iteration
            continue


def allocation_of(ptr: int, nbytes: int, what: str) -> int | None:
    """The serial number of the live allocation holding ``nbytes`` at ``ptr`` (None for 0 bytes)."""
    if nbytes == 0:
        return None
    for serial, (start, size, _) in _live_items():
        if start <= ptr and ptr + nbytes <= start + size:
            return serial
    raise RuntimeError(f"fake NCCL: {what} points at {nbytes} bytes at {ptr:#x}, which no live device "
                       f"allocation holds")


def keep_alive(serial: int | None, what: str) -> np.ndarray | None:
    """The array of allocation ``serial``, to keep it until a queued call has run (as CuPy's pool
    keeps a block for work queued on its stream); raise if it was freed already (its address may
    hold another array by now)."""
    if serial is None:
        return None
    entry = _live.get(serial)
    array = entry[2]() if entry is not None else None
    if array is None:
        raise RuntimeError(f"fake NCCL: the buffer of {what} was freed before the NCCL call ran (inside a "
                           f"group, calls run at groupEnd: keep their buffers referenced until then)")
    return array


def _fresh(shape: Any, dtype: Any) -> "ndarray":
    """A new device array of uninitialised (0xA5) memory."""
    a = np.empty(shape, dtype=dtype)
    ctypes.memset(a.ctypes.data, POISON, a.nbytes)
    return ndarray(_allocation(a))


def _current_device() -> int:
    return getattr(_threads, "device", 0)


def _set_device(device: int) -> None:
    _threads.device = device


def _launch(fn: Callable[[], Any], what: str, stream: Any = None) -> None:
    """Queue a kernel on ``stream`` (default: the thread's current one): it runs when the device
    gets there (fake_stream.py)."""
    fake_stream.device().enqueue(fn, what, stream=stream)


def empty_pinned(shape: Any, dtype: Any = float) -> np.ndarray:
    """A host array in (pretend) page-locked memory: copies to and from it are asynchronous."""
    a = np.empty(shape, dtype=dtype)
    key = id(a)
    _pinned[key] = (a.ctypes.data, a.nbytes)
    weakref.finalize(a, _pinned.pop, key, None)
    return a


def is_pinned(a: np.ndarray) -> bool:
    """Whether ``a`` (or the array it views) lies in page-locked memory from :func:`empty_pinned`."""
    start, end = a.ctypes.data, a.ctypes.data + a.nbytes
    return any(s <= start and end <= s + n for s, n in list(_pinned.values()))


def _stand_in(x: Any) -> Any:
    """What a probe computes with instead of a device operand: ones of its shape and dtype."""
    return np.ones(x.shape, x.dtype) if isinstance(x, ndarray) else x


def _result(fn: Callable[..., np.ndarray], operands: list[Any], what: str) -> "ndarray":
    """A new device array that will hold ``fn(*operands)``: its shape and dtype (and errors such as
    a bad cast or shape) come at once from a probe on stand-ins, its values when the kernel runs."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        probe = np.asarray(fn(*[_stand_in(o) for o in operands]))
    out = _fresh(probe.shape, probe.dtype)
    inputs = [_device_operand(o, what) for o in operands]
    _launch(lambda: out._a.__setitem__(..., fn(*inputs)), what)
    return out


class _Pointer:
    def __init__(self, ptr: int, device_id: int) -> None:
        self.ptr, self.device_id = ptr, device_id


class Device:
    def __init__(self, device: int | None = None) -> None:
        self.id = _current_device() if device is None else int(device)

    @property
    def pci_bus_id(self) -> str:
        """One pretend GPU per process (NCCL never sees a shared GPU), or with
        MPITEST_FAKE_SHARED_GPU=1 one for every process (as ranks sharing a GPU)."""
        if os.environ.get("MPITEST_FAKE_SHARED_GPU") == "1":
            return f"fake:shared:{self.id}"
        return f"fake:{MPI.COMM_WORLD.Get_rank()}:{self.id}"

    def use(self) -> None:
        _set_device(self.id)

    def synchronize(self) -> None:
        fake_stream.device().synchronize()

    def __enter__(self) -> "Device":  # the previous device on a per-thread stack, as CuPy's
        stack = _threads.__dict__.setdefault("stack", [])
        stack.append(_current_device())
        _set_device(self.id)
        return self

    def __exit__(self, *exc: Any) -> None:
        _set_device(_threads.stack.pop())


class ndarray:
    """A device array: a NumPy array underneath, reachable only through explicit copies."""

    __slots__ = ("_a", "_device", "__weakref__")

    def __init__(self, a: np.ndarray, device: int | None = None) -> None:
        self._a = a
        self._device = _current_device() if device is None else device

    # -- what CuPy arrays have ---------------------------------------------------------------------
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    ndim = property(lambda self: self._a.ndim)
    strides = property(lambda self: self._a.strides)
    itemsize = property(lambda self: self._a.itemsize)
    flags = property(lambda self: self._a.flags)
    data = property(lambda self: _Pointer(self._a.ctypes.data, self._device))
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

    def _derived(self, fn: Callable[[np.ndarray], np.ndarray], what: str) -> "ndarray":
        """A view of this array (at once), or where NumPy would copy, a kernel's result."""
        with np.errstate(all="ignore"), warnings.catch_warnings():  # (on whatever the memory holds now)
            warnings.simplefilter("ignore")
            view = fn(self._a)
        if isinstance(view, np.ndarray) and np.shares_memory(view, self._a):
            return self._wrap(view)
        return _result(fn, [self], what)

    def reshape(self, *shape: Any) -> "ndarray":
        return self._derived(lambda a: a.reshape(*shape), "reshape")

    def ravel(self) -> "ndarray":
        return self._derived(lambda a: a.ravel(), "ravel")

    def view(self, dtype: Any) -> "ndarray":
        return self._wrap(self._a.view(dtype))

    def astype(self, dtype: Any, copy: bool = True) -> "ndarray":
        if not copy and np.dtype(dtype) == self.dtype:
            return self
        return _result(lambda a: a.astype(dtype), [self], "astype")

    def copy(self) -> "ndarray":
        return _result(np.copy, [self], "copy")

    def get(self, stream: Any = None, order: str = "C", out: np.ndarray | None = None,
            blocking: bool = True) -> np.ndarray:
        """A copy in host memory, made on ``stream`` (default: the current one). Blocking (the
        default, as in CuPy): the host waits for the stream. ``blocking=False`` into page-locked
        ``out``: the copy is only queued; into pageable memory CUDA copies synchronously anyway."""
        if out is not None and (not isinstance(out, np.ndarray) or out.shape != self.shape
                                or out.dtype != self.dtype or not out.flags.c_contiguous):
            raise ValueError("fake cupy: `out` must be a C-contiguous NumPy array of the same shape and dtype")
        stream = fake_stream.current() if stream is None else stream
        transfers["to_host"] += self.nbytes
        if not blocking and out is None:
            raise ValueError("fake cupy: get(blocking=False) needs `out`")
        target = np.empty(self.shape, self.dtype) if out is None else out
        src = self._a
        _launch(lambda: target.__setitem__(..., src), "get (device to host)", stream)
        if blocking or not is_pinned(target):
            stream.synchronize()
        return target

    def set(self, arr: np.ndarray, stream: Any = None) -> None:
        """Copy host data in, queued on ``stream`` (default: the current one), as CuPy's
        ``memcpyAsync``: page-locked ``arr`` is read when the copy runs (the host must not change it
        before then), pageable ``arr`` at once."""
        if not self.flags.c_contiguous:
            raise RuntimeError("Cannot set to non-contiguous array")
        if not isinstance(arr, np.ndarray) or arr.shape != self.shape or arr.dtype != self.dtype:
            raise ValueError("fake cupy: set() needs a NumPy array of the same shape and dtype")
        transfers["to_device"] += arr.nbytes
        source = arr if is_pinned(arr) else arr.copy()
        _launch(lambda: self._a.__setitem__(..., source), "set (host to device)",
                fake_stream.current() if stream is None else stream)

    def __getitem__(self, key: Any) -> "ndarray":
        return self._derived(lambda a: a[key], "__getitem__")

    def __setitem__(self, key: Any, value: Any) -> None:
        operand = _device_operand(value, "__setitem__")
        np.empty(self.shape, self.dtype)[key] = _stand_in(value)  # shape and cast errors at once
        _launch(lambda: self._a.__setitem__(key, operand), "__setitem__")

    def _read(self) -> np.ndarray:
        """This array's values on the host, as CuPy's conversions to Python values: after a wait
        for the current stream."""
        fake_stream.current().synchronize()
        return self._a

    def __bool__(self) -> bool:
        return bool(self._read())

    def __float__(self) -> float:
        return float(self._read())

    def __int__(self) -> int:
        return int(self._read())

    def item(self) -> Any:
        return self._read().item()

    def tolist(self) -> Any:
        return self._read().tolist()

    # -- arithmetic (what mpidist and the tests use) -----------------------------------------------
    def _binary(self, other: Any, fn: Any) -> "ndarray":
        return _result(fn, [self, other], fn.__name__)

    def _inplace(self, other: Any, fn: Any) -> "ndarray":
        operand = _device_operand(other, "arithmetic")
        probe = np.ones(self.shape, self.dtype)
        with np.errstate(all="ignore"):
            fn(probe, _stand_in(other), out=probe, casting="same_kind")  # cast errors at once, as CuPy's
        _launch(lambda: fn(self._a, operand, out=self._a, casting="same_kind"), fn.__name__)
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
    __neg__ = lambda self: _result(np.negative, [self], "negative")
    __abs__ = lambda self: _result(np.abs, [self], "absolute")
    __hash__ = None


def _device_operand(value: Any, what: str) -> Any:
    """The NumPy array under a device operand; Python scalars pass; host arrays are refused."""
    if isinstance(value, ndarray):
        return value._a
    if isinstance(value, (int, float, complex, bool, np.generic)):
        return value
    raise TypeError(f"fake cupy: {what} with a host value of type {type(value).__name__}: "
                    f"copy it to the device explicitly")


def _filled(shape: Any, value: Any, dtype: Any) -> ndarray:
    """A new device array and a fill kernel queued (cudaMemsetAsync-like)."""
    out = _fresh(shape, np.full((), value, dtype=dtype).dtype)
    _launch(lambda: out._a.fill(value), "fill")
    return out


def asarray(x: Any, dtype: Any = None) -> ndarray:
    """Host data to the device: copied at once into a staging buffer, then to the device on the stream."""
    if isinstance(x, ndarray):
        return x if dtype is None or np.dtype(dtype) == x.dtype else x.astype(dtype)
    if hasattr(x, "__cuda_array_interface__") and not isinstance(x, np.ndarray):
        raise TypeError("fake cupy: foreign device arrays are not supported")
    host = np.array(x, dtype=dtype, copy=True, order="C")
    transfers["to_device"] += host.nbytes
    out = _fresh(host.shape, host.dtype)
    _launch(lambda: out._a.__setitem__(..., host), "asarray (host to device)")
    return out


def ascontiguousarray(x: ndarray) -> ndarray:
    return x if x.flags.c_contiguous else _result(np.ascontiguousarray, [x], "ascontiguousarray")


def asnumpy(x: Any) -> np.ndarray:
    if isinstance(x, ndarray):
        return x.get()
    return np.asarray(x)


def empty(shape: Any, dtype: Any = float) -> ndarray:
    return _fresh(shape, dtype)


def zeros(shape: Any, dtype: Any = float) -> ndarray:
    return _filled(shape, 0, dtype)


def ones(shape: Any, dtype: Any = float) -> ndarray:
    return _filled(shape, 1, dtype)


def full(shape: Any, fill_value: Any, dtype: Any = None) -> ndarray:
    return _filled(shape, fill_value, dtype)


def empty_like(x: ndarray, dtype: Any = None) -> ndarray:
    return _fresh(x.shape, x.dtype if dtype is None else dtype)


def zeros_like(x: ndarray, dtype: Any = None) -> ndarray:
    return _filled(x.shape, 0, x.dtype if dtype is None else dtype)


def where(condition: ndarray, x: Any, y: Any) -> ndarray:
    _device_operand(condition, "where")
    return _result(np.where, [condition, x, y], "where")


def abs(x: ndarray) -> ndarray:  # noqa: A001 - CuPy's name
    return _result(np.abs, [x], "absolute")


def _device_function(fn: Any) -> Any:
    """A NumPy function on device arrays, giving device arrays: views at once (``moveaxis``),
    computed results (``sum``, ...) by a kernel."""
    def run(x: ndarray, *args: Any, **kwargs: Any) -> ndarray:
        _device_operand(x, fn.__name__)
        return x._derived(lambda a: np.asarray(fn(a, *args, **kwargs)), fn.__name__)
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
    cuda.nccl, cuda.runtime, cuda.Device, cuda.Stream, cuda.Event = nccl, runtime, Device, Stream, Event
    cuda.is_available = lambda: True
    cuda.get_current_stream = fake_stream.current
    runtime.getDeviceCount = lambda: 1
    runtime.getDevice = _current_device
    runtime.deviceSynchronize = lambda: fake_stream.device().synchronize()
    cupyx.empty_pinned = empty_pinned
    return {"cupy": cupy, "cupy.cuda": cuda, "cupy.cuda.nccl": nccl, "cupy.cuda.runtime": runtime,
            "cupyx": cupyx}


_saved: dict[str, types.ModuleType] = {}


def install() -> types.ModuleType:
    """Put the fake CuPy in ``sys.modules`` (collective over COMM_WORLD: every rank calls it); a
    real CuPy already imported (installed, but no GPU) is put aside until :func:`uninstall`."""
    _saved.update({n: sys.modules[n] for n in NAMES if n in sys.modules})
    fake_stream.start()
    sys.modules.update(_modules())
    return sys.modules["cupy"]


def uninstall() -> None:
    """Run what is still queued, stop the device, and take the fake modules out again."""
    fake_stream.stop()
    for name in NAMES:
        sys.modules.pop(name, None)
    sys.modules.update(_saved)
    _saved.clear()
    import fake_nccl
    fake_nccl.close()
