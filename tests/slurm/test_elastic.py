"""slurm/elastic.sbatch under a real Slurm (see conftest.py): ULFM survives a rank's death inside the
allocation, srun direct launch does not, and preemption (SIGUSR1 to the batch shell, or Slurm's
SIGTERM when it requeues the job) writes a checkpoint that the requeued run resumes from.

The tests marked "up to 2 nodes" run on both nodes of the test cluster (2 ranks each: mpirun on
node1 starts its daemon on node2 through srun, the ranks talk over TCP), or on its one node where
two cannot be made here (conftest.py says why).

The jobs are tests/launch/jobs/elastic_numpy.py and elastic_preempt.py: gradients depend on each
process's original rank and the step with integer values, so the expected results are exact.
"""
from __future__ import annotations

import pickle
import re
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

from .cluster import FINAL_STATES, JobResult, SlurmCluster
from .conftest import REPO, TEMPLATES

sys.path.insert(0, str(REPO / "tests" / "launch"))  # the elastic jobs' results and checks live beside them
from elastic_segments import check_survivors, replay, results  # noqa: E402

Sbatch = Callable[..., JobResult]  # the `sbatch` fixture of conftest.py
LAUNCH_JOBS = REPO / "tests" / "launch" / "jobs"
SRUN_ULFM = Path(__file__).resolve().parent / "jobs" / "srun_ulfm.sbatch"
# 4 CPUs advertised on 2 cores: no binding; more ranks than cores: yield while waiting
MPIRUN_ARGS = "--bind-to none --mca mpi_yield_when_idle 1"
# the template's `--signal=B:USR1@120` signals a job at its start when its time limit is 2 minutes
TIME = "--time=10"


def nodes_for(slurm: SlurmCluster, wanted: int) -> int:
    """``wanted`` nodes where the cluster has them, else all it has."""
    return min(wanted, len(slurm.node_names))


def assert_placed(job: JobResult, n: int, nodes: int) -> None:
    """The template's first line says where the job ran (every run of a requeued job)."""
    where = re.escape("(node[1-2])") if nodes == 2 else r"\([^)]+\)"
    assert re.search(rf"{n} tasks on {nodes} node\(s\) {where}", job.output), job


# (4 ranks, kills of ranks 0 and 2): on two nodes, a rank of each node dies, node1's being the
# chief and mpirun's own node
@pytest.mark.parametrize("n, steps, kills, wanted", [(3, 20, {1: 7}, 1), (4, 30, {0: 5, 2: 17}, 2)],
                         ids=["n3-one-node", "n4-up-to-2-nodes"])
def test_elastic_template_survivors_of_sigkilled_ranks_finish(slurm: SlurmCluster, sbatch: Sbatch, n: int, steps: int,
                                                              kills: dict[int, int], wanted: int) -> None:
    nodes = nodes_for(slurm, wanted)
    job = sbatch("elastic.sbatch", str(LAUNCH_JOBS / "elastic_numpy.py"), str(steps),
                 *[f"{r}:{s}" for r, s in kills.items()], n=n, nodes=nodes, env={"MPIRUN_ARGS": MPIRUN_ARGS},
                 options=[TIME], timeout=120)
    assert (job.state, job.exit_code) == ("COMPLETED", 0), job
    assert_placed(job, n, nodes)
    assert "--with-ft ulfm --mca mpi_ft_detector true" in job.output, job  # the template's launch line
    assert "ULFM active (mpirun --with-ft ulfm, failure detector on): the job survives" in job.output, job
    for r, s in kills.items():
        assert f"KILLING rank={r} step={s}" in job.output, job
    check_survivors(results(job.output), n, steps, kills, job)


def test_srun_direct_launch_has_no_ulfm_a_death_ends_the_step(slurm: SlurmCluster) -> None:
    # ULFM switched on through the environment and srun told not to kill the step on a bad exit:
    # Slurm's PMIx plugin still cancels the step when the task dies, and mpidist says ULFM is off.
    job = slurm.submit(SRUN_ULFM, str(LAUNCH_JOBS / "elastic_numpy.py"), "20", "1:7",
                       options=["-N1", "-n3", "--ntasks-per-node=3", "-c1"], cwd=REPO, timeout=90,
                       env={"PYTHON": sys.executable})
    assert job.state == "FAILED" and job.exit_code != 0, job
    assert "KILLING rank=1 step=7" in job.output and "RESULT" not in job.output, job
    assert job.output.count("ULFM is not active (srun direct launch") == 1, job  # once, from the chief
    assert re.search(r"mpi/pmix\S*: _errhandler: .*Error handler invoked", job.output), job
    assert re.search(r"STEP \S+ ON \S+ CANCELLED", job.output), job


def _preempted_job(slurm: SlurmCluster, n: int, checkpoint: Path, preempt: Callable[[str], None],
                   *job_args: str, options: tuple[str, ...] = (), requeue_within: float = 60,
                   nodes: int = 1) -> JobResult:
    """Submit elastic.sbatch with elastic_preempt.py (no end before a preemption, 5 steps after a
    resume); once every rank has committed, ``preempt(job_id)``; wait for the requeue, let the
    requeued run start 3 s later (Slurm holds a requeued job for 2 minutes) and finish."""
    job_id = slurm.sbatch(TEMPLATES / "elastic.sbatch", str(LAUNCH_JOBS / "elastic_preempt.py"),
                          str(checkpoint), "+5", *job_args, cwd=REPO, env={"PYTHON": sys.executable, "MPIRUN_ARGS": MPIRUN_ARGS},
                          options=[f"-N{nodes}", f"-n{n}", f"--ntasks-per-node={n // nodes}", "-c1", TIME, *options])
    out = slurm.output_path(job_id)
    slurm.wait_for(job_id, lambda f: len(re.findall(r"^READY ", _read(out), re.M)) >= n
                   or f.get("JobState") not in ("PENDING", "RUNNING") or f.get("Restarts") != "0",
                   90, f"READY from {n} ranks")
    fields = slurm.job_fields(job_id)
    assert (fields.get("JobState"), fields.get("Restarts")) == ("RUNNING", "0"), f"{fields}\n{_read(out)}"
    preempt(job_id)
    fields = slurm.wait_for(job_id, lambda f: f.get("Restarts", "0") != "0" and f.get("JobState") == "PENDING"
                            or f.get("Restarts") == "0" and f.get("JobState") in FINAL_STATES, requeue_within,
                            "the requeue")
    assert fields.get("Restarts") != "0", f"job {job_id} ended without a requeue: {fields}\n{_read(out)}\n{slurm.logs()}"
    assert checkpoint.exists(), f"job {job_id} was requeued without writing {checkpoint}:\n{_read(out)}"
    # not "now": a start in the second of the requeue is refused ("Job credential revoked")
    slurm.command("scontrol", "update", f"JobId={job_id}", "StartTime=now+3")
    job = slurm.wait(job_id, 120)
    if (job.state, job.exit_code) != ("COMPLETED", 0):
        pytest.fail(f"{job}\n{slurm.job_fields(job_id)}\n{slurm.logs()}")
    assert_placed(job, n, nodes)
    return job


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _check_resumed(job: JobResult, n: int, checkpoint: Path) -> int:
    """The requeued run resumed from the checkpoint and finished 5 steps later with the exact values;
    the step the first run stopped at."""
    assert (job.state, job.exit_code) == ("COMPLETED", 0), job
    with open(checkpoint, "rb") as f:
        snapshot = pickle.load(f)["snapshot"]
    stopped = snapshot["step"]
    assert stopped >= 1, snapshot
    np.testing.assert_array_equal(snapshot["w"], replay(np.zeros(4), list(range(n)), 0, stopped))
    assert "resuming from the preemption checkpoint" in job.output, job
    got = results(job.output)
    assert sorted(r["rank"] for r in got) == list(range(n)), job
    for r in got:
        assert r["start"] == {"step": stopped, "w": snapshot["w"].tolist(), "resumed": True}, job
        assert (r["step"], r["size"]) == (stopped + 5, n), job
        np.testing.assert_array_equal(r["w"], replay(snapshot["w"], list(range(n)), stopped, stopped + 5))
    return stopped


def test_sigusr1_to_the_batch_shell_checkpoints_requeues_and_the_requeued_run_resumes_up_to_2_nodes(
        slurm: SlurmCluster, tmp_path: Path) -> None:
    # `scancel --batch --signal=USR1` is what `#SBATCH --signal=B:USR1@120` does 120 s before the
    # time limit: the template forwards it to mpirun, which passes it to every rank (on node2
    # through its daemon there), every rank exits 0 at the same commit, the template requeues the job.
    nodes = nodes_for(slurm, 2)
    n, checkpoint = 2 * nodes, tmp_path / "elastic.pkl"
    job = _preempted_job(slurm, n, checkpoint,
                         lambda job_id: slurm.command("scancel", "--batch", "--signal=USR1", job_id), nodes=nodes)
    stopped = _check_resumed(job, n, checkpoint)
    assert "SIGUSR1 (preemption or time limit): forwarded to mpirun" in job.output, job
    assert "preempted cleanly; requeueing job" in job.output, job
    exits = [int(m) for m in re.findall(r"^EXIT rank=\d+ step=(\d+)$", job.output, re.M)]
    assert exits[:n] == [stopped] * n and exits[n:] == [stopped + 5] * n, job  # all at the same commit


def test_the_time_limit_signal_checkpoints_requeues_and_the_requeued_run_resumes(
        slurm: SlurmCluster, tmp_path: Path) -> None:
    # The real `--signal=B:USR1@T` path: a 4-minute job signalled 200 s before its end, by slurmctld
    # (which looks at signal times every 30 s or so), so the test waits up to 90 s for it. The 40 s
    # before the signal are for the ranks to start and commit twice (READY): 20 s were too few on a
    # loaded 2-core machine (the signal came first).
    n, checkpoint = 3, tmp_path / "elastic.pkl"
    job = _preempted_job(slurm, n, checkpoint, lambda job_id: None,
                         options=("--time=4", "--signal=B:USR1@200"), requeue_within=90)
    stopped = _check_resumed(job, n, checkpoint)
    assert "SIGUSR1 (preemption or time limit): forwarded to mpirun" in job.output, job
    exits = [int(m) for m in re.findall(r"^EXIT rank=\d+ step=(\d+)$", job.output, re.M)]
    assert exits[:n] == [stopped] * n, job


def test_requeue_sigterm_to_every_process_checkpoints_and_the_requeued_run_resumes_up_to_2_nodes(
        slurm: SlurmCluster, tmp_path: Path) -> None:
    # `scontrol requeue` ends the job as a preemption with PreemptMode=REQUEUE does: SIGTERM to every
    # process of the job on every node (batch shell, mpirun, its daemon on node2, ranks), SIGKILL
    # after KillWait. mpirun exits at once; the ranks go on to their next commit, agree, write the
    # checkpoint and leave.
    nodes = nodes_for(slurm, 2)
    n, checkpoint = 2 * nodes, tmp_path / "elastic.pkl"
    job = _preempted_job(slurm, n, checkpoint, lambda job_id: slurm.command("scontrol", "requeue", job_id),
                         nodes=nodes)
    _check_resumed(job, n, checkpoint)
    assert "DUE TO JOB REQUEUE" in job.output, job


def test_requeue_sigterm_during_a_step_longer_than_killwait_the_chief_writes_its_last_commit_at_once(
        slurm: SlurmCluster, tmp_path: Path) -> None:
    # Steps of 60 s after READY: Slurm SIGKILLs the ranks KillWait (5 s here) after the SIGTERM,
    # long before the next commit, so the checkpoint is the one the chief's SIGTERM handler wrote
    # at once (its last commit); the requeued run resumes from it.
    assert "KillWait=5" in slurm.conf.read_text()
    n, checkpoint = 3, tmp_path / "elastic.pkl"
    job = _preempted_job(slurm, n, checkpoint, lambda job_id: slurm.command("scontrol", "requeue", job_id),
                         "--step-seconds=60")
    _check_resumed(job, n, checkpoint)
    first_run = job.output[:job.output.index("DUE TO JOB REQUEUE")]
    assert "EXIT " not in first_run, job  # killed inside the step: no rank reached the next commit
