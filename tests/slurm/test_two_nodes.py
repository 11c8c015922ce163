"""mpidist jobs across two Slurm nodes (node1 and node2: namespaces of their own on this machine,
each with its own slurmd, address and host name; see nodes.py): MPI alone finds the nodes (no
MPIDIST_LOCAL_SIZE), and the hierarchical allreduce, which crosses between them over TCP, equals
the flat one and a NumPy reference. Skipped, with the reason, where namespaces cannot be made.
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


def test_sbatch_cpu_template_two_nodes_two_ranks_each(two_nodes: SlurmCluster, sbatch: Sbatch) -> None:
    job: JobResult = sbatch("cpu_multinode.sbatch", TOPOLOGY, n=4, nodes=2)
    assert (job.state, job.exit_code) == ("COMPLETED", 0), job
    assert "4 tasks on 2 node(s) (node[1-2])" in job.output, job
    assert_two_nodes_of_two(job.output, job)


def test_mpirun_inside_a_two_node_allocation(two_nodes: SlurmCluster, sbatch: Sbatch) -> None:
    # Open MPI reads the allocation and starts its daemon on node2 through srun
    job = sbatch("mpirun_in_allocation.sbatch", TOPOLOGY, n=4, nodes=2, env={"MPIRUN_ARGS": "--bind-to none"})
    assert (job.state, job.exit_code) == ("COMPLETED", 0), job
    assert_two_nodes_of_two(job.output, job)
