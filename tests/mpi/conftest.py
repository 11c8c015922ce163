"""Fixtures of the MPI tests: they run at any -n and read rank and size at run time."""
from __future__ import annotations

import pytest
from mpi4py import MPI

import mpidist


@pytest.fixture(scope="session")
def comm() -> MPI.Intracomm:
    return MPI.COMM_WORLD


@pytest.fixture(scope="session")
def engine():
    eng = mpidist.Engine()
    yield eng
    if eng.broken is None:
        eng.close()


@pytest.fixture(scope="module")
def eng():
    """A test module's own engine: a module that breaks it (a deadline test) breaks only its own."""
    engine = mpidist.Engine()
    yield engine
    if engine.broken is None:
        engine.close()


@pytest.fixture(scope="module")
def strategy(eng):
    """mpidist's TensorFlow MultiWorkerMirroredStrategy on ``eng`` (NumPy test modules define their own)."""
    from mpidist.cross_device.options import CommunicationOptions
    from mpidist.tensorflow import make_strategy
    return make_strategy("MultiWorkerMirroredStrategy", eng, CommunicationOptions())
