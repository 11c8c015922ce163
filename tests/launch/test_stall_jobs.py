"""Stall reports under real mpirun: which ranks have not arrived and where they are; optional abort."""
from __future__ import annotations

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
