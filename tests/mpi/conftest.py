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
