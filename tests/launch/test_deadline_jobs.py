"""A rank that never arrives: the others get DeadlineExceededError after the deadline, further
collectives are refused, and the job ends (MPI_Abort at exit) instead of hanging in MPI_Finalize."""
from __future__ import annotations

import importlib.util
import re

import pytest


def check(job, n: int, timeout: float) -> None:
    waiting = n - 1
    deadlines = [float(x) for x in re.findall(r"DEADLINE after ([0-9.]+) s", job.output)]
    assert len(deadlines) == waiting, job.output
    assert all(t >= timeout for t in deadlines), deadlines
    assert job.output.count(": BROKEN allreduce: this communicator refuses collectives") == waiting, job.output
    assert "aborting the MPI job at exit" in job.output, job.output
    assert job.returncode != 0
    assert job.seconds < 200, "the stalled rank (sleeping 300 s) was not ended with the job"


@pytest.mark.parametrize("n", [2, 4])
def test_stalled_rank_numpy(mpirun, n):
    job = mpirun(n, "stall.py", "1")
    check(job, n, 1.0)
    assert "DeadlineExceededError: allreduce: not finished within timeout_seconds=1" in job.output


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="TensorFlow is not installed")
def test_stalled_rank_caught_as_tf_error(mpirun):
    job = mpirun(2, "stall.py", "1", "tf", timeout=300)
    check(job, 2, 1.0)


@pytest.mark.parametrize("kind", ["reduce", "gather", "broadcast_to", "dataset"])
def test_strategy_paths_honour_the_deadline(mpirun, kind):
    """rc.timeout_seconds reaches every strategy path that can block, the dataset's step agreement too."""
    job = mpirun(2, "strategy_deadline.py", kind, env={"MPIDIST_TIMEOUT_SECONDS": "1"})
    match = re.search(rf"rank 0: DEADLINE {kind} after ([0-9.]+) s", job.output)
    assert match and float(match.group(1)) >= 1.0, job.output
    assert "aborting the MPI job at exit" in job.output and job.returncode != 0
    assert job.seconds < 200
