"""``python -m mpidist check`` finds ULFM under ``mpirun --with-ft ulfm``: a launcher's option, so a job
of its own. (The rest of the command's tests call ``mpidist.check.main`` on every rank of the MPI
test job: tests/mpi/test_check_command.py.)
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from launching import mpirun_command

CHEAP = ["--size", "65536", "--repeat", "2"]  # small timed calls: the checks themselves are unchanged


def lines(output: str, state: str) -> dict[str, str]:
    """{check name: detail} of the report's lines in ``state`` (OK, SKIPPED, MISSING, BROKEN)."""
    return dict(re.findall(rf"^{state} +([^:]+): (.*)$", output, flags=re.M))


def test_ulfm_is_found_under_mpirun_with_ft_ulfm():
    out = subprocess.run([shutil.which("ompi_info") or "ompi_info"], capture_output=True, text=True).stdout \
        if shutil.which("ompi_info") else ""
    if "FT MPI support: yes" not in out:
        pytest.skip("no Open MPI with ULFM here (ompi_info: FT MPI support is not yes)")
    env = dict(os.environ)
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = mpirun_command(2) + ["--with-ft", "ulfm", "--mca", "mpi_ft_detector", "true", sys.executable, "-m",
                               "mpidist", "check", *CHEAP, "--skip", "host,gpu,cupy,cuda,tensorflow,barrier"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    detail = lines(output, "OK")["ULFM (elastic training)"]
    assert detail == "active (mpirun --with-ft ulfm, failure detector on); MPIX_Comm_agree works", output
