"""Failure ends the job: an uncaught exception or a killed rank ends every rank within seconds."""
from __future__ import annotations

import pytest


@pytest.mark.parametrize("n", [2, 4])
def test_uncaught_exception_aborts_the_job(mpirun, n):
    job = mpirun(n, "fail.py", "raise", timeout=120)
    assert job.returncode != 0
    assert "RuntimeError: boom on purpose" in job.output  # the traceback is still printed
    assert f"uncaught RuntimeError on rank {n - 1}: aborting the MPI job" in job.output
    assert "UNREACHABLE" not in job.output
    assert job.seconds < 60, job.seconds  # not a hang: the others were killed


def test_killed_rank_ends_the_job(mpirun):
    job = mpirun(2, "fail.py", "kill", timeout=120)
    assert job.returncode != 0 and "UNREACHABLE" not in job.output
    assert job.seconds < 60, job.seconds


def test_abort_can_be_switched_off(mpirun):
    # with abort_on_error off, the waiting rank stays in its collective: the mpirun timeout ends it
    with pytest.raises(Exception) as info:
        mpirun(2, "fail.py", "raise", timeout=8, env={"MPIDIST_ABORT_ON_ERROR": "0"})
    assert "TimeoutExpired" in type(info.value).__name__
