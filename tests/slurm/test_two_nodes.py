"""mpidist jobs across two Slurm nodes (node1 and node2: namespaces of their own on this machine,
each with its own slurmd, address and host name; see nodes.py): MPI alone finds the nodes (no
MPIDIST_LOCAL_SIZE), and the hierarchical allreduce, which crosses between them over TCP, equals
the flat one and a NumPy reference: under `srun -N2 -n4` and mpirun inside an allocation
(jobs/topology.py), and under `sbatch cpu_multinode.sbatch` running `python -m mpidist check`.
Skipped, with the reason, where namespaces cannot be made.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from .cluster import JobResult, SlurmCluster
from .conftest import REPO, Sbatch

TOPOLOGY = str(Path(__file__).resolve().parent / "jobs" / "topology.py")


def assert_two_nodes_of_two(output: str, where: object) -> None:
    found = sorted((json.loads(line[len("MPIDIST "):]) for line in output.splitlines()
                    if line.startswith("MPIDIST ")), key=lambda r: r["rank"])
    assert [r["rank"] for r in found] == [0, 1, 2, 3], where
    for r in found:
        assert (r["size"], r["num_nodes"], r["node_sizes"], r["faked"]) == (4, 2, [2, 2], False), where
        assert r["local_size_env"] is None, where
        assert r["checked"] > 0 and r["failed"] == [] and r["hierarchical_calls"] > 0, where
    # block distribution: ranks 0, 1 on node1, ranks 2, 3 on node2; MPI's node index follows
    assert [(r["host"], r["node_index"], r["local_rank"]) for r in found] == [
        ("node1", 0, 0), ("node1", 0, 1), ("node2", 1, 0), ("node2", 1, 1)], where


def test_srun_two_nodes_two_ranks_each(two_nodes: SlurmCluster) -> None:
    # srun as a user types it on a login node: an allocation of 2 nodes and one step of 4 tasks
    proc = two_nodes.command("srun", "-N2", "-n4", "--ntasks-per-node=2", "-c1", "--mpi=pmix", "--kill-on-bad-exit=1", "--time=2",
                             sys.executable, TOPOLOGY, timeout=150, cwd=REPO,
                             env={"OPAL_PREFIX": sys.prefix})
    where = f"srun exited with {proc.returncode}; output:\n{proc.stdout}{proc.stderr}"
    assert proc.returncode == 0, f"{where}\n{two_nodes.logs()}"
    assert_two_nodes_of_two(proc.stdout, where)


def test_mpirun_inside_a_two_node_allocation(two_nodes: SlurmCluster, sbatch: Sbatch) -> None:
    # Open MPI reads the allocation and starts its daemon on node2 through srun
    job = sbatch("mpirun_in_allocation.sbatch", TOPOLOGY, n=4, nodes=2, env={"MPIRUN_ARGS": "--bind-to none"})
    assert (job.state, job.exit_code) == ("COMPLETED", 0), job
    assert_two_nodes_of_two(job.output, job)


CHECK = ["-m", "mpidist", "check", "--size", "65536", "--repeat", "2"]


def test_sbatch_cpu_template_runs_check_on_two_nodes_of_two_ranks(two_nodes: SlurmCluster, sbatch: Sbatch) -> None:
    # `sbatch cpu_multinode.sbatch -m mpidist check`, what an administrator runs first: srun's view
    # (tasks, nodes) against MPI's, 2 nodes x 2 ranks with no MPIDIST_LOCAL_SIZE (else the line
    # says "faked by"), and every collective, the hierarchical allreduce among them, against NumPy
    job = sbatch("cpu_multinode.sbatch", *CHECK, n=4, nodes=2)
    assert (job.state, job.exit_code) == ("COMPLETED", 0), job
    assert "4 tasks on 2 node(s) (node[1-2])" in job.output, job
    assert ("OK       MPI and launcher: 4 rank(s) = 4 task(s) of srun --mpi=pmix; 2 node(s) of 2+2 rank(s) on "
            "2 host(s) (node1, node2); ") in job.output, job
    assert ("OK       allreduce (host): 72 calls (5 ops x 4 dtypes, flat and hierarchical on 2 node(s)), a nest and "
            "allreduce_async equal the host reference") in job.output, job
    assert "MISSING  ULFM (elastic training): not active: srun direct launch" in job.output, job
    assert "SKIPPED  CuPy on GPU: no GPU on this node" in job.output, job
    assert "result: everything present works (exit status 0)" in job.output, job


def test_check_finds_ulfm_in_the_elastic_template_on_two_nodes(two_nodes: SlurmCluster, sbatch: Sbatch) -> None:
    job = sbatch("elastic.sbatch", *CHECK, "--skip", "host", n=4, nodes=2,
                 env={"MPIRUN_ARGS": "--bind-to none --mca mpi_yield_when_idle 1"}, options=["--time=10"])
    assert (job.state, job.exit_code) == ("COMPLETED", 0), job
    assert ("OK       ULFM (elastic training): active (mpirun --with-ft ulfm, failure detector on); "
            "MPIX_Comm_agree works") in job.output, job
    assert "2 node(s) of 2+2 rank(s) on 2 host(s) (node1, node2)" in job.output, job
