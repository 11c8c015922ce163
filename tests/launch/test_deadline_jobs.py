"""A straggler and timeout_seconds under real mpirun. A program that handles DeadlineExceededError
ends normally: the job's status is the program's (0), no rank is killed before it finishes, and
MPI_Finalize does not hang on the requests left pending. A program that does not handle it ends
with a non-zero status right after the deadline, never hanging."""
from __future__ import annotations

import importlib.util
import re

import pytest


def finished(job, n: int) -> None:
    """Every rank reached the end of its program (none was killed) and the job exited 0."""
    assert job.returncode == 0, job.output
    assert sorted(re.findall(r"rank (\d+): finished", job.output)) == sorted(str(r) for r in range(n)), job.output
    assert "MPI_ABORT" not in job.output and "aborting" not in job.output, job.output


def deadlines(job, ranks: int, timeout: float) -> None:
    seen = [float(x) for x in re.findall(r"DEADLINE after ([0-9.]+) s", job.output)]
    assert len(seen) == ranks, job.output
    assert all(t >= timeout for t in seen), seen


@pytest.mark.parametrize("n", [2, 4])
def test_straggler_handled_every_rank_finishes(mpirun, n):
    """The straggler arrives late: the others time out; it times out in the step they never issued."""
    job = mpirun(n, "stall.py", "1", "late")
    deadlines(job, n, 1.0)  # the straggler's own deadline too
    assert job.output.count(": BROKEN allreduce: this communicator refuses collectives") == n, job.output
    assert "DeadlineExceededError: allreduce: not finished within timeout_seconds=1" in job.output
    finished(job, n)


@pytest.mark.parametrize("n", [2, 4])
def test_rank_that_never_arrives_handled(mpirun, n):
    job = mpirun(n, "stall.py", "1", "never")
    deadlines(job, n - 1, 1.0)
    finished(job, n)


@pytest.mark.parametrize("n", [2, 4])
def test_unhandled_deadline_ends_the_job(mpirun, n):
    job = mpirun(n, "stall.py", "1", "unhandled")
    assert job.returncode != 0, job.output
    assert "uncaught DeadlineExceededError" in job.output, job.output
    assert not re.search(r"rank \d+: finished", job.output), job.output
    assert job.seconds < 200, "the straggler (sleeping 300 s) was not ended with the job"


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="TensorFlow is not installed")
def test_straggler_caught_as_tf_error(mpirun):
    job = mpirun(2, "stall.py", "1", "late", "tf", timeout=300)
    deadlines(job, 2, 1.0)
    finished(job, 2)


@pytest.mark.parametrize("kind", ["gather"])
def test_strategy_paths_honour_the_deadline(mpirun, kind):
    """rc.timeout_seconds reaches strategy.gather (two MPI steps: a late rank would wait in the second,
    so the rank never arrives: a job of its own). reduce, broadcast_to and the dataset's step agreement:
    tests/mpi/test_deadline.py, with a late rank that arrives."""
    job = mpirun(2, "strategy_deadline.py", kind, env={"MPIDIST_TIMEOUT_SECONDS": "1"})
    match = re.search(rf"rank 0: DEADLINE {kind} after ([0-9.]+) s", job.output)
    assert match and float(match.group(1)) >= 1.0, job.output
    finished(job, 2)
