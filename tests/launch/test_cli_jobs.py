"""The command line under a real mpirun: info (one table from the chief) and a tiny bench."""
from __future__ import annotations

import json
import re

import pytest



def test_info_prints_one_table_from_the_chief(mpirun):
    job = mpirun(4, "-m", "mpidist", "info", env={"MPIDIST_LOCAL_SIZE": "2"})
    assert job.returncode == 0, job.output
    assert job.output.count("MPI           ") == 1  # chief only
    rows = re.findall(r"^\s+(\d) +(\d) +(\d)/2 ", job.output, flags=re.M)
    assert rows == [("0", "0", "0"), ("1", "0", "1"), ("2", "1", "0"), ("3", "1", "1")], job.output
    assert "launcher      mpirun (Open MPI) (4 tasks)" in job.output or "mpiexec" in job.output
    assert "faked by MPIDIST_LOCAL_SIZE" in job.output


def test_info_json(mpirun):
    job = mpirun(2, "-m", "mpidist", "info", "--json")
    assert job.returncode == 0, job.output
    report = json.loads(job.output[job.output.index("{"):])
    assert report["world_size"] == 2 and [r["rank"] for r in report["ranks"]] == [0, 1]
    assert report["mpi"]["thread_level"] in ("single", "funneled", "serialized", "multiple")


def test_bench_smoke(mpirun):
    """The bench runs end to end at a tiny size (a smoke test: no timing is asserted)."""
    job = mpirun(2, "-m", "mpidist", "bench", "--sizes", "4KB,300KB", "--nest", "10", "--seconds", "0.2", "--json")
    assert job.returncode == 0, job.output
    rows = json.loads(job.output[job.output.index("["):])
    assert [r["case"] for r in rows] == ["allreduce 4 KB", "allreduce 300 KB", "10 x 4 KB nest"]
    assert all(r["raw"] > 0 and r["mpidist"] > 0 for r in rows)


def test_soak_smoke(mpirun):
    """A short soak: random collectives, every result checked exactly on every rank."""
    job = mpirun(2, "-m", "mpidist", "soak", "--collectives", "150", "--max-bytes", "600KB", "--json")
    assert job.returncode == 0, job.output
    result = json.loads(job.output[job.output.index("{"):])
    assert result["wrong_results"] == 0 and result["collectives"] == 150 and result["ranks"] == 2


def test_bench_sweep_smoke(mpirun, tmp_path):
    """The nccl-tests-style sweep runs for every collective and draws its plot (no timing asserted)."""
    png = tmp_path / "sweep.png"
    job = mpirun(2, "-m", "mpidist", "bench", "sweep", "--max", "16KB", "--seconds", "0.05", "--json",
                 "--plot", str(png))
    assert job.returncode == 0, job.output
    rows = json.loads(job.output[job.output.index("["):])
    assert {r["collective"] for r in rows} == {"allreduce", "allgather", "broadcast", "reduce_scatter"}
    assert {r["bytes"] for r in rows if r["collective"] == "allreduce"} == {4096, 16384}
    for r in rows:
        assert r["mpidist"]["busbw"] > 0 and r["raw"]["busbw"] > 0
    allreduce = next(r for r in rows if r["collective"] == "allreduce")
    assert allreduce["mpidist"]["busbw"] == pytest.approx(allreduce["mpidist"]["algbw"])  # 2(p-1)/p = 1 at p=2
    assert png.stat().st_size > 1000
