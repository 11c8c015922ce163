"""Fixtures of the MPI tests: they run at any -n and read rank and size at run time.

Markers (declared in pyproject.toml; which steps of tests/run a file runs in: tests/README.md):
``fake_gpu`` marks tests that ran on the host fake of CuPy and NCCL (fake_cupy.py,
fake_nccl.py), not on a GPU; ``job_sizes(2, reason=...)`` runs a test only at those job sizes
(it skips elsewhere, giving the reason). The terminal summary says how many of the passes were such tests,
and with ``MPITEST_COUNTS=FILE`` rank 0 writes ``passed fake_gpu_passed`` there (tests/run
shows them in its summary).
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

import pytest
from mpi4py import MPI

import mpidist

FAKE_GPU_NOTE = "on the host fake of CuPy/NCCL, not a GPU"
_counts = {"passed": 0, "fake_gpu": 0}


def pytest_runtest_setup(item):
    sizes = item.get_closest_marker("job_sizes")
    if sizes is not None and MPI.COMM_WORLD.Get_size() not in sizes.args:
        pytest.skip(f"runs at {' or '.join(map(str, sizes.args))} rank(s) only: {sizes.kwargs['reason']}")


def pytest_runtest_logreport(report):
    if report.when == "call" and report.passed:
        _counts["passed"] += 1
        if "fake_gpu" in report.keywords:
            _counts["fake_gpu"] += 1


def pytest_terminal_summary(terminalreporter):
    passed, fake = _counts["passed"], _counts["fake_gpu"]
    if fake:
        terminalreporter.write_line(f"{passed} passed, of which {fake} {FAKE_GPU_NOTE}", yellow=True)
    target = os.environ.get("MPITEST_COUNTS")
    if target and MPI.COMM_WORLD.Get_rank() == 0:
        with open(target, "w", encoding="utf-8") as f:
            f.write(f"{passed} {fake}\n")


@pytest.fixture(scope="session")
def comm() -> MPI.Intracomm:
    return MPI.COMM_WORLD


@pytest.fixture
def shared_dir(comm):
    """A directory every rank sees: the chief makes it and broadcasts its path, and removes it once
    every rank is done with it."""
    path = comm.bcast(tempfile.mkdtemp(prefix="mpidist-test-") if comm.Get_rank() == 0 else None, root=0)
    yield path
    comm.Barrier()
    if comm.Get_rank() == 0:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def rc_settings():
    """``rc_settings(name=value, ...)`` overrides mpidist.rc for the rest of the test; the previous
    settings come back when the test ends, however it ends."""
    with contextlib.ExitStack() as stack:
        yield lambda **settings: stack.enter_context(mpidist.rc.override(**settings))


def _closed_after_use():
    """An engine for a fixture; closed afterwards unless a test broke it (a deadline test)."""
    engine = mpidist.Engine()
    yield engine
    if engine.broken is None:
        engine.close()


@pytest.fixture(scope="session")
def engine():
    yield from _closed_after_use()


@pytest.fixture(scope="module")
def eng():
    """A test module's own engine: a module that breaks it (a deadline test) breaks only its own."""
    yield from _closed_after_use()


@pytest.fixture(scope="module")
def strategy(eng):
    """mpidist's TensorFlow MultiWorkerMirroredStrategy on ``eng`` (NumPy test modules define their own)."""
    import mpidist.on_tensorflow
    from mpidist.cross_device.options import CommunicationOptions
    return mpidist.on_tensorflow.MultiWorkerMirroredStrategy.on_engine(eng, CommunicationOptions())
