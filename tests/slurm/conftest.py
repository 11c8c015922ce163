"""Fixtures of the Slurm tests: one real Slurm for the session, started as root, on two nodes
(node1 and node2: namespaces of their own on this machine, see nodes.py) where namespaces can be
made here, else on one (this host; the tests that need two nodes then skip and say why).

The packages are installed on first use (apt-get, see cluster.py); where that cannot be done (not
root, no apt-get, no network) the tests skip and say why. MPITEST_SLURM=0 skips them on purpose;
MPITEST_SLURM_NODES=1 keeps to one node; MPITEST_SLURM_KEEP=1 keeps the cluster's directory
(configs, logs, job outputs) for a look.
"""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

import pytest

from . import nodes
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
    reason = ("MPITEST_SLURM_NODES=1" if os.environ.get("MPITEST_SLURM_NODES") == "1"
              else nodes.unavailable())
    cluster = SlurmCluster(cpus=4, gpus=4, nodes=1 if reason else 2)
    cluster.one_node_reason = reason
    previous = signal.signal(signal.SIGTERM, _interrupt)  # `timeout` ends pytest: stop the daemons
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}: stopping the Slurm test cluster")


@pytest.fixture
def two_nodes(slurm: SlurmCluster) -> SlurmCluster:
    """The session's cluster, where it has two nodes; else the test skips and says why."""
    if len(slurm.node_names) < 2:
        pytest.skip(f"the Slurm test cluster has one node: two cannot be made here ({slurm.one_node_reason})")
    return slurm


Sbatch = Callable[..., JobResult]


@pytest.fixture
def sbatch(slurm: SlurmCluster) -> Sbatch:
    """sbatch a template of slurm/ with ``n`` tasks of one CPU on ``nodes`` nodes (``n`` divisible
    by ``nodes``), as a user would."""
    def run(template: str, *args: str, n: int, nodes: int = 1, env: Mapping[str, str] | None = None,
            options: Sequence[str] = (), timeout: float = 150.0) -> JobResult:
        # the whole 2-minute limit of the job (sbatch --time=2) and some: a hang ends there anyway
        resources = [f"-N{nodes}", f"-n{n}", f"--ntasks-per-node={n // nodes}", "-c1", *options]
        return slurm.submit(TEMPLATES / template, *args, options=resources, cwd=REPO, timeout=timeout,
                            env={"PYTHON": sys.executable, **(env or {})})
    return run
