"""Fixtures of the Slurm tests: one real single-node Slurm for the session, started as root.

The packages are installed on first use (apt-get, see cluster.py); where that cannot be done (not
root, no apt-get, no network) the tests skip and say why. MPITEST_SLURM=0 skips them on purpose;
MPITEST_SLURM_KEEP=1 keeps the cluster's directory (configs, logs, job outputs) for a look.
"""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

import pytest

from .cluster import ClusterUnavailable, JobResult, SlurmCluster, ensure_installed

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = REPO / "slurm"
JOBS = Path(__file__).resolve().parent / "jobs"


@pytest.fixture(scope="session")
def slurm() -> Iterator[SlurmCluster]:
    if os.environ.get("MPITEST_SLURM") == "0":
        pytest.skip("MPITEST_SLURM=0: Slurm tests switched off")
    if os.geteuid() != 0:
        pytest.skip(f"the Slurm tests start slurmd, which needs root; this is uid {os.geteuid()}")
    try:
        ensure_installed()
    except ClusterUnavailable as exc:
        pytest.skip(f"no Slurm here: {exc}")
    cluster = SlurmCluster(cpus=4, gpus=4)
    previous = signal.signal(signal.SIGTERM, _interrupt)  # `timeout` ends pytest: stop the daemons
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}: stopping the Slurm test cluster")


Sbatch = Callable[..., JobResult]


@pytest.fixture
def sbatch(slurm: SlurmCluster) -> Sbatch:
    """sbatch a template of slurm/ on one node with ``n`` tasks of one CPU, as a user would."""
    def run(template: str, *args: str, n: int, env: Mapping[str, str] | None = None,
            options: Sequence[str] = (), timeout: float = 150.0) -> JobResult:
        # the whole 2-minute limit of the job (sbatch --time=2) and some: a hang ends there anyway
        resources = ["-N1", f"-n{n}", f"--ntasks-per-node={n}", "-c1", *options]
        return slurm.submit(TEMPLATES / template, *args, options=resources, cwd=REPO, timeout=timeout,
                            env={"PYTHON": sys.executable, **(env or {})})
    return run
