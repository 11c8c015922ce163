"""slurm/tf_preemption.sbatch under a real Slurm (see conftest.py): TensorFlow's
PreemptionCheckpointHandler over an mpidist strategy, launched by srun or by mpirun. The SIGTERM that
``--signal=B:TERM@60`` sends the batch shell (here ``scancel --batch --signal=TERM``, the same
delivery) is passed on to every rank (srun: ``scancel --signal=TERM`` of the job's steps; mpirun:
SIGUSR1, which it forwards, with MPIDIST_PREEMPTION_SIGNALS=TERM,USR1); every rank saves at the same
run and exits 42, the template requeues the job, and the requeued run restores and ends with the
weights of an uninterrupted run. One rank on each of two nodes where the test cluster has two (else
two on one). The job is tests/launch/jobs/tf_preemption.py; its reference is computed as in
tests/launch/test_tf_preemption_jobs.py.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from .cluster import FINAL_STATES, SlurmCluster
from .conftest import REPO, TEMPLATES

pytest.importorskip("tensorflow")
sys.path.insert(0, str(REPO / "tests" / "launch"))  # the job's reference lives beside it
from test_tf_preemption_jobs import STEPS_PER_EPOCH, check_finished, fields, saved_runs  # noqa: E402

JOB = REPO / "tests" / "launch" / "jobs" / "tf_preemption.py"


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


@pytest.mark.parametrize("launcher", ["srun", "mpirun"])
def test_sigterm_to_the_batch_shell_every_rank_saves_exits_42_requeue_and_restore(slurm: SlurmCluster,
                                                                                  tmp_path: Path, launcher: str) -> None:
    nodes = min(2, len(slurm.node_names))  # a rank on each node where the cluster has two
    n, directory = 2, tmp_path / "ckpt"
    env = {"PYTHON": sys.executable, "LAUNCHER": launcher,
           "MPIRUN_ARGS": "--bind-to none --mca mpi_yield_when_idle 1"}  # 4 CPUs advertised on 2 cores
    job_id = slurm.sbatch(TEMPLATES / "tf_preemption.sbatch", str(JOB), str(directory), "+2", cwd=REPO, env=env,
                          options=[f"-N{nodes}", f"-n{n}", f"--ntasks-per-node={n // nodes}", "-c1", "--time=10"])
    out = slurm.output_path(job_id)
    slurm.wait_for(job_id, lambda f: len(re.findall(r"^READY ", _read(out), re.M)) >= n
                   or f.get("JobState") not in ("PENDING", "RUNNING"), 150, f"READY from {n} ranks")
    assert slurm.job_fields(job_id).get("JobState") == "RUNNING", _read(out)
    slurm.command("scancel", "--batch", "--signal=TERM", job_id)  # what --signal=B:TERM@60 sends
    got = slurm.wait_for(job_id, lambda f: f.get("Restarts", "0") != "0" and f.get("JobState") == "PENDING"
                         or f.get("Restarts") == "0" and f.get("JobState") in FINAL_STATES, 90, "the requeue")
    first = _read(out)
    assert got.get("Restarts") != "0", f"job {job_id} ended without a requeue: {got}\n{first}\n{slurm.logs()}"
    assert "SIGTERM (time limit or preemption): passed on to the ranks" in first, first
    assert f"{n} tasks on {nodes} node(s)" in first, first
    assert "every rank saved and exited 42; requeueing job" in first, first
    exits = fields(first, "EXIT")
    runs = exits[0]["runs"]
    assert sorted(e["rank"] for e in exits) == list(range(n)) and runs >= 2, first
    assert all(e["runs"] == runs and e["save_counter"] == 1 for e in exits), first
    assert saved_runs(str(directory)) == runs
    # not "now": a start in the second of the requeue is refused ("Job credential revoked")
    slurm.command("scontrol", "update", f"JobId={job_id}", "StartTime=now+3")
    job = slurm.wait(job_id, 150)
    assert (job.state, job.exit_code) == ("COMPLETED", 0), f"{job}\n{slurm.logs()}"
    second = job.output[len(first):]
    assert [s["runs"] for s in fields(second, "START")] == [runs] * n, job
    check_finished(n, second, (runs // STEPS_PER_EPOCH + 2) * STEPS_PER_EPOCH)
