"""Checkpoints under real mpirun: a save killed mid-way leaves the previous checkpoint intact,
and every rank restores the same state. (Restore errors raised on every rank: tests/mpi/test_checkpoint_numpy.py.)"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time

from launching import JOBS, kill_job, mpirun_command


def test_killed_save_keeps_previous_checkpoint(tmp_path, mpirun):
    path = str(tmp_path / "state.npz")
    env = dict(os.environ)
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    proc = subprocess.Popen(mpirun_command(2) + [sys.executable, str(JOBS / "checkpoint_job.py"), path,
                                                 "save-then-hang"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    deadline = time.monotonic() + 120
    seen = ""
    try:
        while "SAVING-V2" not in seen:
            assert time.monotonic() < deadline, seen
            line = proc.stdout.readline()
            assert line or proc.poll() is None, seen
            seen += line
    finally:
        kill_job(proc, marker=path)  # a real kill, in the middle of the second save
    assert os.path.exists(path)
    job = mpirun(2, "checkpoint_job.py", path, "restore")
    assert job.returncode == 0, job.output
    lines = re.findall(r"rank (\d): restored version (\d) exact=(\w+) checksum=(\S+)", job.output)
    assert sorted(l[0] for l in lines) == ["0", "1"], job.output
    assert {l[1:] for l in lines} == {("1", "True", lines[0][3])}  # version 1, exact, same on every rank
