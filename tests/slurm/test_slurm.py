"""The slurm/ templates, submitted with sbatch to a real single-node Slurm (see conftest.py).

The node advertises 4 CPUs (on 2 cores here) and 4 fake GPUs. Jobs run tests/slurm/jobs/*.py.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pytest

from .cluster import JobResult, SlurmCluster

Sbatch = Callable[..., JobResult]  # the `sbatch` fixture of conftest.py
JOBS = Path(__file__).resolve().parent / "jobs"
REPORT = str(JOBS / "report.py")
FAIL = str(JOBS / "fail.py")


def reports(job: JobResult, count: int) -> list[dict]:
    """The per-rank lines of report.py, expected ``count`` of them."""
    found = [json.loads(line) for line in job.tagged("MPIDIST ")]
    assert len(found) == count, f"expected {count} report lines, got {len(found)}; {job}"
    return sorted(found, key=lambda r: (r["rank"], r["launcher_rank"]))


def assert_succeeded(job: JobResult) -> None:
    assert (job.state, job.exit_code) == ("COMPLETED", 0), f"expected COMPLETED with exit code 0; {job}"


@pytest.mark.parametrize("n", [2, 4])
def test_srun_pmix_runs_one_job_of_n_ranks(sbatch: Sbatch, n: int) -> None:
    job = sbatch("cpu_multinode.sbatch", REPORT, n=n)
    assert_succeeded(job)
    for rank, r in enumerate(reports(job, n)):
        assert (r["rank"], r["size"], r["sum"]) == (rank, n, [n] * 3), job
        assert (r["launcher"], r["tasks"], r["launcher_rank"], r["detail"]) == ("srun", n, rank, "--mpi=pmix"), job
    assert "MPI_COMM_WORLD has size 1" not in job.output, job


@pytest.mark.parametrize("plugin", ["pmi2", "none"])
def test_srun_without_pmix_runs_singletons_and_mpidist_warns(sbatch: Sbatch, plugin: str) -> None:
    job = sbatch("cpu_multinode.sbatch", REPORT, n=2, env={"SRUN_MPI": plugin})
    assert_succeeded(job)  # the danger: the job "works", as 2 jobs of one rank each
    found = reports(job, 2)
    assert [(r["rank"], r["size"], r["sum"]) for r in found] == [(0, 1, [1.0] * 3)] * 2, job
    assert [(r["launcher"], r["tasks"], r["launcher_rank"]) for r in found] == [("srun", 2, 0), ("srun", 2, 1)], job
    for task in (0, 1):
        assert f"srun started 2 tasks but MPI_COMM_WORLD has size 1 in task {task}" in job.output, job


def test_srun_lists_the_pmix_plugin(slurm: SlurmCluster) -> None:
    listed = slurm.command("srun", "--mpi=list")
    assert "pmix" in listed.stdout + listed.stderr, f"expected pmix in `srun --mpi=list`, got {listed}"


@pytest.mark.parametrize("n", [2, 4])
def test_mpirun_inside_the_allocation(sbatch: Sbatch, n: int) -> None:
    # 4 CPUs advertised on 2 cores: Open MPI would refuse to bind 4 ranks to cores.
    job = sbatch("mpirun_in_allocation.sbatch", REPORT, n=n, env={"MPIRUN_ARGS": "--bind-to none"})
    assert_succeeded(job)
    for rank, r in enumerate(reports(job, n)):
        assert (r["rank"], r["size"], r["sum"]) == (rank, n, [n] * 3), job
        assert (r["launcher"], r["tasks"], r["launcher_rank"]) == ("mpirun (Open MPI)", n, rank), job


@pytest.mark.parametrize("bind", ["single:1", "localid"])
def test_gpu_template_gives_each_rank_its_own_gpu(slurm: SlurmCluster, sbatch: Sbatch, bind: str) -> None:
    if slurm.gpus < 2:
        pytest.skip("no fake GPUs on this node (mknod was refused)")
    job = sbatch("gpu_multinode.sbatch", REPORT, n=2, options=["--gpus-per-node=2"], env={"GPU_BIND": bind})
    assert_succeeded(job)
    found = reports(job, 2)
    assert [(r["rank"], r["size"], r["launcher"]) for r in found] == [(0, 2, "srun"), (1, 2, "srun")], job
    assert [(r["localid"], r["cuda_visible_devices"]) for r in found] == [("0", "0"), ("1", "1")], job


def test_gpu_template_refuses_more_ranks_than_gpus(slurm: SlurmCluster, sbatch: Sbatch) -> None:
    if slurm.gpus < 2:
        pytest.skip("no fake GPUs on this node (mknod was refused)")
    job = sbatch("gpu_multinode.sbatch", REPORT, n=4, options=["--gpus-per-node=2"], env={"GPU_BIND": "localid"})
    assert job.state == "FAILED" and job.exit_code != 0, job
    assert "has local id 3 but only 2 GPU(s) are visible" in job.output, job


@pytest.mark.parametrize("template, args, code", [
    ("cpu_multinode.sbatch", ("exit", "3"), 3),
    ("cpu_multinode.sbatch", ("raise",), None),
    ("mpirun_in_allocation.sbatch", ("exit", "3"), 3),
    ("mpirun_in_allocation.sbatch", ("raise",), None),
])
def test_a_failing_program_fails_the_job(sbatch: Sbatch, template: str, args: tuple[str, ...],
                                         code: int | None) -> None:
    # The script comes from SCRIPT here (the other tests give it as the first argument).
    job = sbatch(template, *args, n=2, env={"SCRIPT": FAIL})
    assert job.state == "FAILED" and job.exit_code != 0, f"expected FAILED with a non-zero exit code; {job}"
    if code is not None:
        assert job.exit_code == code, f"expected exit code {code}; {job}"
    else:  # one rank raised: mpidist's excepthook aborted the job instead of leaving rank 0 waiting
        assert "rank 1 fails on purpose" in job.output and "second allreduce returned" not in job.output, job
        assert job.seconds < 90, job  # ended by the abort, not by the job's 2-minute time limit


@pytest.mark.parametrize("template", ["cpu_multinode.sbatch", "gpu_multinode.sbatch", "mpirun_in_allocation.sbatch"])
def test_a_template_without_a_script_says_what_it_expected(sbatch: Sbatch, template: str) -> None:
    job = sbatch(template, n=1)
    assert (job.state, job.exit_code) == ("FAILED", 2), job
    assert f"{template}: expected a Python script" in job.output, job
