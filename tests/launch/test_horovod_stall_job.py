"""Horovod's stall variables drive mpidist's stall report and abort under a real mpirun."""
from __future__ import annotations

import importlib.util
import re

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="TensorFlow is not installed")


def test_horovod_stall_check_time_reports_the_late_rank(mpirun, tmp_path):
    job = mpirun(2, "horovod_stall.py", str(tmp_path), env={"HOROVOD_STALL_CHECK_TIME_SECONDS": "1"},
                 timeout=180)
    assert job.returncode == 0, job.output[-3000:]
    assert job.output.count("done") == 2
    assert re.search(r"mpidist: stall: allreduce #\d+ on rank 0 has waited \d+ s .*ranks not in it: 1\b",
                     job.output), job.output[-3000:]


def test_horovod_stall_shutdown_time_aborts(mpirun, tmp_path):
    job = mpirun(2, "horovod_stall.py", str(tmp_path), "until-killed", timeout=180,
                 env={"HOROVOD_STALL_CHECK_TIME_SECONDS": "1", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "2"})
    assert job.returncode != 0
    assert "aborting the job" in job.output, job.output[-3000:]
    assert "rank 0: done" not in job.output
