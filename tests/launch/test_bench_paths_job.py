"""``python -m mpidist bench paths`` under a real mpirun: every layer against raw MPI in one run. With
``--before`` it loads another checkout's mpidist into its processes (a second rc, engines and exit
hooks): a job of its own. (A missing checkout: tests/mpi/test_cli.py.)"""
from __future__ import annotations

import json
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]
CASES = ["raw Allreduce", "raw Iallreduce", "engine", "reduce", "replica"]


def test_bench_paths_smoke(mpirun):
    """Tiny sizes, with this checkout as the `--before` one too (a smoke test: no timing is asserted;
    the tool itself checks every path's result against the reference before timing it)."""
    job = mpirun(2, "-m", "mpidist", "bench", "paths", "--sizes", "64KB,300KB", "--seconds", "0.2", "--json",
                 "--before", str(REPOSITORY))
    assert job.returncode == 0, job.output
    rows = json.loads(job.output[job.output.index("["):])
    assert [r["size"] for r in rows] == ["64 KB", "300 KB"]
    for row in rows:
        names = CASES + [f"{c} before" for c in CASES[2:]]
        assert sorted(row["median"]) == sorted(names) and sorted(row["ratio"]) == sorted(names)
        assert all(t > 0 for t in row["median"].values())
        assert row["ratio"]["raw Allreduce"] == 1.0 and row["rounds"] >= 5
