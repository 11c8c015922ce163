"""Helpers of the tests that start their own mpirun jobs, each under a timeout (see conftest.py)."""
from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import pytest

JOBS = pathlib.Path(__file__).parent / "jobs"


def _launcher() -> tuple[str, bool]:
    """(mpirun executable, whether it is Open MPI's)."""
    exe = os.environ.get("MPITEST_MPIRUN") or shutil.which("mpirun") or shutil.which("mpiexec")
    if exe is None:
        pytest.skip("no mpirun on PATH")
    version = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout
    return exe, "Open MPI" in version


def launcher_name() -> str:
    """The name ``mpidist info`` must report for the ranks of :func:`mpirun_command`'s jobs."""
    return "mpirun (Open MPI)" if _launcher()[1] else "mpiexec (MPICH/Hydra)"


def mpirun_command(n: int) -> list[str]:
    exe, open_mpi = _launcher()
    flags = ["--oversubscribe", "--bind-to", "none", "--mca", "mpi_yield_when_idle", "1"] if open_mpi else []
    return [exe, "-n", str(n), *flags]


def kill_job(proc: subprocess.Popen, marker: str | None = None) -> None:
    """End an mpirun job and every rank: SIGTERM to its process group (mpirun then ends its ranks),
    SIGKILL after a grace period, then any process whose command line holds ``marker``."""
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.communicate(timeout=grace)
            break
        except subprocess.TimeoutExpired:
            continue
    if marker:
        subprocess.run(["pkill", "-9", "-f", marker], check=False)


class Job:
    def __init__(self, proc: subprocess.CompletedProcess, seconds: float) -> None:
        self.returncode, self.output, self.seconds = proc.returncode, proc.stdout + proc.stderr, seconds


@pytest.fixture
def mpirun():
    def run(n: int, script: str, *args: str, timeout: float = 120, env: dict | None = None) -> Job:
        environ = dict(os.environ, **(env or {}))
        if os.geteuid() == 0:
            environ.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        # "-m mod" runs a module; an absolute path runs that file; else a script in jobs/
        target = [script] if script.startswith("-") or os.path.isabs(script) else [str(JOBS / script)]
        cmd = mpirun_command(n) + [sys.executable, *target, *args]
        start = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environ,
                                start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_job(proc, marker=str(JOBS / script) if not script.startswith("-") else None)
            raise
        proc = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
        return Job(proc, time.monotonic() - start)
    return run
