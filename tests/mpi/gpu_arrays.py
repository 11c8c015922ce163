"""CuPy for the GPU test files: real CuPy where a GPU is, else the host fake of CuPy/NCCL
(fake_cupy.py, installed in sys.modules for one test module at a time).

A test file imports ``REAL_GPU`` and the module-scoped ``cp`` fixture from here, and marks itself
``fake_gpu`` when ``REAL_GPU`` is false (so the summary counts those tests apart).

The fake gives every rank a GPU of its own, so NCCL always works there (``NCCL_ALWAYS``), unless
``MPITEST_FAKE_SHARED_GPU=1`` makes the ranks of a node share one (as on a machine with one GPU for
several ranks): NCCL is then unusable and the tests check what a GPU node without NCCL does.
"""
from __future__ import annotations

import os

import pytest

from mpidist.collectives.gpu import cupy_arrays


def gpu_available() -> bool:
    try:
        import cupy
        return bool(cupy.cuda.is_available())
    except Exception:  # no CuPy, or no CUDA driver
        return False


REAL_GPU = gpu_available()
FAKE_SHARED_GPU = not REAL_GPU and os.environ.get("MPITEST_FAKE_SHARED_GPU") == "1"
NCCL_ALWAYS = not REAL_GPU and not FAKE_SHARED_GPU  # NCCL works on every rank (the fake's own GPUs)


@pytest.fixture(scope="module")
def cp():
    """Real CuPy on a GPU; elsewhere the fake, in sys.modules for this module's tests only."""
    if REAL_GPU:
        import cupy
        yield cupy
        return
    import fake_cupy
    cupy_arrays.forget()
    yield fake_cupy.install()
    fake_cupy.uninstall()
    cupy_arrays.forget()
