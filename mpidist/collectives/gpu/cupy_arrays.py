"""CuPy, loaded only when a device array is seen, and what the GPU path asks of it.

Device arrays are recognized by ``__cuda_array_interface__`` (CuPy arrays, Numba device arrays,
PyTorch CUDA tensors, ...) without importing CuPy: importing mpidist never imports CuPy, and a
NumPy-only program never pays for it. CuPy is imported on the first device array, and the
outcome (or why it failed) is cached. Every "why not" is a sentence that ends up in an error
message after ``NCCL is not available: `` or ``... needs CuPy, but ``.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import Any

import numpy as np

from ...errors import GpuUnavailableError

INSTALL_CUPY = "pip install cupy-cuda12x"
INSTALL_NCCL = "pip install nvidia-nccl-cu12"
_HOST = (np.ndarray, np.generic, int, float, complex, bool, str, bytes, type(None))
_cache: dict[str, Any] = {}


def is_device_array(x: Any) -> bool:
    """Whether ``x`` exposes CUDA device memory through ``__cuda_array_interface__``.

    NumPy arrays and numbers never get past the first test. The attribute is read from the object
    (a property on CuPy and Numba classes, an instance attribute elsewhere); some classes define it
    but raise for host-resident instances (PyTorch CPU tensors): those are host arrays.
    """
    if isinstance(x, _HOST):
        return False
    try:
        return isinstance(x.__cuda_array_interface__, dict)
    except Exception:  # AttributeError, or "Can't get __cuda_array_interface__ on non-CUDA tensor"
        return False


def any_device(leaves: list[Any]) -> bool:
    """Whether any leaf is a device array (the engine's GPU dispatch test; NumPy leaves cost one check)."""
    for leaf in leaves:
        if type(leaf) is not np.ndarray and is_device_array(leaf):
            return True
    return False


def cupy_reason() -> str | None:
    """None when CuPy can run here; otherwise why not (not installed, broken, or no GPU visible)."""
    if "cupy_reason" not in _cache:
        _cache["cupy_reason"] = _probe_cupy()
    return _cache["cupy_reason"]


def _probe_cupy() -> str | None:
    if "cupy" not in sys.modules and importlib.util.find_spec("cupy") is None:
        return f"cupy is not installed ({INSTALL_CUPY})"
    try:
        cp = importlib.import_module("cupy")
    except Exception as err:  # a broken CUDA install raises all sorts of errors
        return f"cupy cannot be imported ({type(err).__name__}: {err})"
    try:
        available = bool(cp.cuda.is_available())
    except Exception as err:
        return f"cupy.cuda.is_available() failed ({type(err).__name__}: {err})"
    if not available:
        return "cupy.cuda.is_available() is False: no CUDA GPU is visible to this process"
    return None


def nccl_reason() -> str | None:
    """None when CuPy's NCCL bindings work here; otherwise why not."""
    if "nccl_reason" not in _cache:
        _cache["nccl_reason"] = _probe_nccl()
    return _cache["nccl_reason"]


def _probe_nccl() -> str | None:
    reason = cupy_reason()
    if reason is not None:
        return reason
    try:
        nccl = importlib.import_module("cupy.cuda.nccl")
    except Exception as err:
        return f"cupy.cuda.nccl cannot be imported ({type(err).__name__}: {err}; {INSTALL_NCCL})"
    if not getattr(nccl, "available", False):
        return f"cupy.cuda.nccl.available is False: CuPy found no NCCL library ({INSTALL_NCCL})"
    try:
        _cache["nccl_version"] = int(nccl.get_version())
    except Exception as err:
        return f"cupy.cuda.nccl.get_version() failed ({type(err).__name__}: {err})"
    return None


def nccl_version() -> int:
    """NCCL's runtime version code (e.g. 22105 for 2.21.5), or 0 where NCCL is unavailable."""
    return 0 if nccl_reason() is not None else _cache["nccl_version"]


def load_cupy() -> Any:
    """The ``cupy`` module; GpuUnavailableError saying why where it cannot run."""
    reason = cupy_reason()
    if reason is not None:
        raise GpuUnavailableError(reason)
    return sys.modules["cupy"]


def load_nccl() -> Any:
    """The ``cupy.cuda.nccl`` module; GpuUnavailableError saying why where it cannot run."""
    reason = nccl_reason()
    if reason is not None:
        raise GpuUnavailableError(reason)
    return sys.modules["cupy.cuda.nccl"]


def as_cupy(leaf: Any) -> Any:
    """A device array as a CuPy array (zero-copy for other ``__cuda_array_interface__`` arrays);
    GpuUnavailableError saying why where CuPy cannot run."""
    cp = load_cupy()
    return leaf if isinstance(leaf, cp.ndarray) else cp.asarray(leaf)


def forget() -> None:
    """Drop the cached probe results (tests that change what is importable)."""
    _cache.clear()


def has_bfloat16(cp: Any) -> bool:
    """Whether this CuPy holds ``ml_dtypes.bfloat16`` arrays (CuPy >= 14; earlier ones refuse them)."""
    try:
        return int(str(cp.__version__).split(".")[0]) >= 14
    except (AttributeError, ValueError):
        return False


def describe_leaf(leaf: Any) -> str:
    return f"{type(leaf).__module__}.{type(leaf).__qualname__}"


def device_id(cp: Any, array: Any) -> int:
    """The CUDA device a CuPy array lives on."""
    return int(array.device.id)


def bus_id(cp: Any, device: int) -> str:
    """PCI bus id of a device: equal for two ranks exactly when they share one GPU."""
    try:
        return str(cp.cuda.Device(device).pci_bus_id)
    except Exception:  # very old CuPy: fall back to the device number (distinct per node only if bound)
        return f"device {device}"


def pinned_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A NumPy array in page-locked host memory (fast, asynchronous-capable copies to and from GPUs)."""
    cupyx = importlib.import_module("cupyx")
    return cupyx.empty_pinned(shape, dtype=dtype)
