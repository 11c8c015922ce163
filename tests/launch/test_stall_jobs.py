"""Stall reports under real mpirun: which ranks have not arrived and where they are; optional abort;
at 8 ranks on 4 fake nodes, one report for O(N) messages, then the job goes on, aborts or times out."""
from __future__ import annotations

import json
import re


def test_stall_report_names_the_late_rank_and_its_code(mpirun, tmp_path):
    job = mpirun(3, "stall_report.py", str(tmp_path), env={"MPIDIST_STALL_SECONDS": "1"})
    assert job.returncode == 0, job.output
    assert job.output.count("done") == 3
    reports = re.findall(r"mpidist: stall: allreduce #2 on rank (\d) has waited \d+ s .*ranks not in it: 1\b",
                         job.output)
    assert reports == ["0"], job.output  # one report, on the chief (collectives/stall.py), not one per waiting rank
    assert re.search(r"rank 1: last finished allreduce #1, at .*stall_report.py:\d+ \(busy_in_user_code\)",
                     job.output), job.output


def test_stall_abort(mpirun, tmp_path):
    job = mpirun(2, "stall_report.py", str(tmp_path), "until-killed", timeout=300,
                 env={"MPIDIST_STALL_SECONDS": "1", "MPIDIST_STALL_ABORT_SECONDS": "2"})
    assert job.returncode != 0
    assert "(rc.stall_abort_seconds): aborting the job" in job.output, job.output
    assert "done" not in job.output.replace("rank 1: done", "")
    assert (tmp_path / "reported.0").exists()  # rank 0 reported first, then aborted


# -- at 8 ranks on 4 fake nodes (issue 33): one report, O(N) messages, then what the settings say ------
SCALE = 8
SCALE_ENV = {"MPIDIST_LOCAL_SIZE": "2", "MPIDIST_STALL_SECONDS": "1"}
REPORT = re.compile(rf"mpidist: stall: allreduce #2 on rank 0 has waited \d+ s \(called at .*stall_scale.py:\d+ "
                    rf"\(<module>\)\); ranks not in it: {SCALE - 1}\n  rank {SCALE - 1}: last finished allreduce #1, "
                    r"at .*stall_scale.py:\d+ \(\w+\)")


def test_a_late_rank_at_8_ranks_gives_one_report_for_linear_messages_and_the_job_goes_on(mpirun, tmp_path):
    job = mpirun(SCALE, "stall_scale.py", str(tmp_path), "go-on", timeout=180, env=SCALE_ENV)
    assert job.returncode == 0, job.output
    assert sorted(re.findall(r"rank (\d+): result correct", job.output)) == sorted(map(str, range(SCALE))), job.output
    line = re.search(r"^stall-scale (.*)$", job.output, re.M)
    assert line, job.output
    seen = json.loads(line.group(1))
    assert seen["size"] == SCALE
    assert len(seen["reports"]) == 1 and REPORT.fullmatch(seen["reports"][0]), seen  # the chief's only report
    assert len(REPORT.findall(job.output)) == 1, job.output  # and no other rank logged one
    # N - 2 notices (the chief's own is local), N - 1 questions, N - 1 answers; (N - 1)^2 = 49 before
    assert 2 * (SCALE - 1) <= sum(seen["messages"]) <= 3 * (SCALE - 1), seen["messages"]


def test_a_late_rank_at_8_ranks_with_stall_abort_ends_the_job_after_one_report(mpirun, tmp_path):
    job = mpirun(SCALE, "stall_scale.py", str(tmp_path), "abort", timeout=180,
                 env={**SCALE_ENV, "MPIDIST_STALL_ABORT_SECONDS": "5"})
    assert job.returncode != 0, job.output
    assert len(REPORT.findall(job.output)) == 1, job.output  # the report came first, once
    assert re.search(r"allreduce #2 on rank [0-6] has waited \d+ s \(rc.stall_abort_seconds\): aborting the job",
                     job.output), job.output  # (MPI_Abort kills the others, whether they logged theirs or not)
    assert "result" not in job.output and job.seconds < 150, job.output  # ended, not by the test's timeout


def test_a_late_rank_at_8_ranks_with_a_deadline_is_an_error_on_every_rank(mpirun, tmp_path):
    job = mpirun(SCALE, "stall_scale.py", str(tmp_path), "deadline", timeout=180,
                 env={**SCALE_ENV, "MPIDIST_TIMEOUT_SECONDS": "4"})
    assert job.returncode != 0, job.output
    assert len(REPORT.findall(job.output)) == 1, job.output  # the report before the deadline, once
    errors = re.findall(r"rank (\d+): DeadlineExceededError: allreduce: not finished within timeout_seconds=4: "
                        rf"at least one of the {SCALE} ranks taking part has not reached this collective", job.output)
    assert sorted(errors) == sorted(map(str, range(SCALE))), job.output  # the late rank too, in the step
    assert "result" not in job.output, job.output  # the others never issued
