"""Failure ends the job: an uncaught exception or a killed rank ends every rank within seconds."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from launching import JOBS, kill_job, mpirun_command


@pytest.mark.parametrize("n", [2, 4])
def test_uncaught_exception_aborts_the_job(mpirun, n):
    job = mpirun(n, "fail.py", "raise", timeout=300)  # a hang would be TimeoutExpired: the others wait forever
    assert job.returncode != 0
    assert "RuntimeError: boom on purpose" in job.output  # the traceback is still printed
    assert f"uncaught RuntimeError on rank {n - 1}: aborting the MPI job" in job.output
    assert "UNREACHABLE" not in job.output  # the others were killed in their collective


def test_killed_rank_ends_the_job(mpirun):
    job = mpirun(2, "fail.py", "kill", timeout=300)  # a hang would be TimeoutExpired
    assert job.returncode != 0 and "UNREACHABLE" not in job.output


STILL_THERE = 10.0  # seconds the job must outlive the failure (an abort takes about one)


def test_abort_can_be_switched_off():
    """With abort_on_error off, the failing rank's exception does not end the job: rank 0 stays in
    its collective. Once both the traceback and rank 0's "waiting" are out, the job must still be
    running STILL_THERE seconds later (a slower machine only makes that likelier); then it is killed."""
    env = dict(os.environ, MPIDIST_ABORT_ON_ERROR="0")
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    script = str(JOBS / "fail.py")
    proc = subprocess.Popen(mpirun_command(2) + [sys.executable, script, "raise"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 120
        while not ("RuntimeError: boom on purpose" in "".join(lines) and "rank 0: waiting in allreduce" in "".join(lines)):
            assert proc.poll() is None, "the job ended before the failure was seen:\n" + "".join(lines)
            assert time.monotonic() < deadline, "no failure within 120 s:\n" + "".join(lines)
            time.sleep(0.05)
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=STILL_THERE)
    finally:
        kill_job(proc, marker=script)
        reader.join(timeout=10)
    output = "".join(lines)
    assert "aborting the MPI job" not in output and "UNREACHABLE" not in output, output
