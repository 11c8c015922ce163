"""Facts about the MPI library in use: vendor, versions, thread level, CUDA awareness.

CUDA awareness is asked of the library where it can tell: Open MPI's
``MPIX_Query_cuda_support()`` and MPICH's ``MPIX_GPU_query_support()``, looked up in the loaded
``libmpi`` with ctypes. ``rc.cuda_aware_mpi`` (``MPIDIST_CUDA_AWARE_MPI``: auto, yes, no) overrides
the answer, for libraries that cannot tell or tell wrong.
"""
from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any

from mpi4py import MPI

from .._config import rc

_THREAD_LEVELS = {MPI.THREAD_SINGLE: "single", MPI.THREAD_FUNNELED: "funneled",
                  MPI.THREAD_SERIALIZED: "serialized", MPI.THREAD_MULTIPLE: "multiple"}
_MPIX_GPU_SUPPORT_CUDA = 0


def library_path() -> str | None:
    """Path of the libmpi this process has loaded (Linux), else what the linker would find."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1]
                if "/libmpi" in path and ".so" in path:
                    return path
    except OSError:
        pass
    return ctypes.util.find_library("mpi")


def _query_library() -> bool | None:
    path = library_path()
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(path)
    except OSError:
        return None
    if hasattr(lib, "MPIX_Query_cuda_support"):  # Open MPI
        fn = lib.MPIX_Query_cuda_support
        fn.restype = ctypes.c_int
        return bool(fn())
    if hasattr(lib, "MPIX_GPU_query_support"):  # MPICH >= 4
        supported = ctypes.c_int(0)
        if lib.MPIX_GPU_query_support(_MPIX_GPU_SUPPORT_CUDA, ctypes.byref(supported)) == 0:
            return bool(supported.value)
    return None


def cuda_aware() -> tuple[bool | None, str]:
    """(answer, how it was found): True/False, or None when nobody can tell."""
    setting = rc.cuda_aware_mpi
    if setting != "auto":
        return setting == "yes", "rc.cuda_aware_mpi"
    answer = _query_library()
    return answer, "asked the MPI library" if answer is not None else "the MPI library cannot tell"


def describe() -> dict[str, Any]:
    vendor, version = MPI.get_vendor()
    aware, how = cuda_aware()
    return {
        "vendor": vendor, "vendor_version": ".".join(map(str, version)),
        "standard": ".".join(map(str, MPI.Get_version())),
        "library": MPI.Get_library_version().strip().splitlines()[0],
        "thread_level": _THREAD_LEVELS.get(MPI.Query_thread(), str(MPI.Query_thread())),
        "cuda_aware": aware, "cuda_aware_source": how, "library_path": library_path(),
    }
