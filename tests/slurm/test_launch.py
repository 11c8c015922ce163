"""`mpidist run` and `mpidist horovodrun` under a real Slurm, on two nodes where they can be made here
(else one): srun's direct launch of `mpidist run PROGRAM` (ranks, TF_CONFIG, horovod.run across the
nodes), and a batch script whose `horovodrun -np N python3 PROGRAM` line is kept as it was, with
`horovodrun` defined as `mpidist horovodrun` (docs/launch.md), which inside the allocation starts the
job with srun. The program (tests/launch/jobs/unchanged/probe.py) needs no TensorFlow."""
from __future__ import annotations

import json
import os
import sys

from .cluster import SlurmCluster
from .conftest import REPO

UNCHANGED = REPO / "tests" / "launch" / "jobs" / "unchanged"
ENV = {"OPAL_PREFIX": sys.prefix, "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}"}


def probes(output: str) -> list[dict]:
    return sorted((json.loads(line[len("PROBE "):]) for line in output.splitlines() if line.startswith("PROBE ")),
                  key=lambda p: p["task"]["index"])


def assert_one_job(output: str, slurm: SlurmCluster, n: int, args: list[str]) -> None:
    found = probes(output)
    assert [p["task"]["index"] for p in found] == list(range(n)), output
    hosts = [host for _, _, host in found[0]["results"]]
    expected = [slurm.node_names[r * len(slurm.node_names) // n] for r in range(n)]  # 2 ranks per node, in order
    assert hosts == expected, output
    for p in found:
        assert [r[:2] for r in p["results"]] == [[7, r] for r in range(n)], output
        assert (p["workers"], p["args"], p["tensorflow"]) == (n, args, False), output


def test_srun_mpidist_run(slurm: SlurmCluster) -> None:
    nodes = len(slurm.node_names)
    n = 2 * nodes
    proc = slurm.command("srun", f"-N{nodes}", f"-n{n}", "--ntasks-per-node=2", "-c1", "--mpi=pmix",
                         "--kill-on-bad-exit=1", "--time=2", sys.executable, "-m", "mpidist", "run",
                         str(UNCHANGED / "probe.py"), str(n), "s", timeout=150, cwd=UNCHANGED, env=ENV)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{output}\n{slurm.logs()}"
    assert f"mpidist run: {UNCHANGED / 'probe.py'}: {n} rank(s) on {nodes} node(s)" in output, output
    assert_one_job(output, slurm, n, ["s"])


def test_batch_script_keeps_its_horovodrun_line(slurm: SlurmCluster, tmp_path) -> None:
    nodes = len(slurm.node_names)
    n = 2 * nodes
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\nset -e\n"
                      "horovodrun() { python3 -m mpidist horovodrun \"$@\"; }  # what docs/launch.md says to add\n"
                      f"cd {UNCHANGED}\n"
                      f"horovodrun -np {n} python3 probe.py {n} b\n")
    job = slurm.submit(script, options=[f"-N{nodes}", f"-n{n}", "--ntasks-per-node=2", "-c1"], cwd=tmp_path,
                       env=ENV)
    assert (job.state, job.exit_code) == ("COMPLETED", 0), f"{job}\n{slurm.logs()}"
    assert f"srun -n {n} --mpi=pmix --kill-on-bad-exit=1 python3 -m mpidist run probe.py {n} b" in job.output, job
    assert_one_job(job.output, slurm, n, ["b"])
