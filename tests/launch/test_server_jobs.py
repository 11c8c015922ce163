"""mpidist.Server + MPIClusterResolver(ps=N): TensorFlow's ParameterServerStrategy and
ClusterCoordinator from ONE mpirun of 4 ranks, on loopback, with no TF_CONFIG.

The job (jobs/server_ps_job.py) checks on the chief that the variables on the parameter servers
equal the same SGD steps done in NumPy; here we check that, and that every rank - the servers
blocked in join() included - exits 0 before the timeout.
"""
from __future__ import annotations

import re

import pytest

pytest.importorskip("tensorflow")
RANKS = 4


@pytest.mark.parametrize("num_ps", [1, 2])
def test_parameter_server_training_from_one_mpirun(mpirun, num_ps):
    job = mpirun(RANKS, "server_ps_job.py", str(num_ps), timeout=300)
    assert job.returncode == 0, job.output
    assert "chief: PS variables match the reference after 6 steps" in job.output, job.output
    roles = dict(re.findall(r"rank (\d) is (\w+:\d)", job.output))
    expected = {str(r): f"ps:{r}" for r in range(num_ps)}
    expected[str(num_ps)] = "chief:0"
    expected.update({str(r): f"worker:{r - num_ps - 1}" for r in range(num_ps + 1, RANKS)})
    assert roles == expected, job.output
    exits = dict(re.findall(r"rank (\d) \((\w+)\) exits", job.output))
    assert exits == {r: role.split(":")[0] for r, role in expected.items()}, job.output
    left = sorted(re.findall(r"rank (\d) left join", job.output))
    assert left == sorted(r for r, role in expected.items() if not role.startswith("chief")), job.output


def test_failing_chief_ends_the_job(mpirun):
    """The chief raises mid-training: the whole job ends with an error instead of servers waiting."""
    job = mpirun(RANKS, "server_ps_job.py", "1", "chief-fails", timeout=300)
    assert job.returncode != 0
    assert "RuntimeError: the chief fails on purpose" in job.output, job.output
    assert not re.search(r"rank \d \(\w+\) exits", job.output), job.output
