"""The command line under a real mpirun: info (one table from the chief) and a tiny bench."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from launching import launcher_name


def test_info_prints_one_table_from_the_chief(mpirun):
    job = mpirun(4, "-m", "mpidist", "info", env={"MPIDIST_LOCAL_SIZE": "2"})
    assert job.returncode == 0, job.output
    assert job.output.count("MPI           ") == 1  # chief only
    rows = re.findall(r"^\s+(\d) +(\d) +(\d)/2 ", job.output, flags=re.M)
    assert rows == [("0", "0", "0"), ("1", "0", "1"), ("2", "1", "0"), ("3", "1", "1")], job.output
    assert f"launcher      {launcher_name()} (4 tasks" in job.output, job.output
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


def test_timeline_from_the_environment_and_merge(mpirun, tmp_path):
    """MPIDIST_TIMELINE writes one trace per rank; `timeline merge` joins them for a trace viewer."""
    prefix = tmp_path / "tl" / "trace.json"
    job = mpirun(2, "-m", "mpidist", "bench", "--sizes", "4KB", "--nest", "3", "--seconds", "0.05",
                 env={"MPIDIST_TIMELINE": str(prefix)})
    assert job.returncode == 0, job.output
    files = sorted(p.name for p in (tmp_path / "tl").iterdir())
    assert files == ["trace.rank0.json", "trace.rank1.json"]
    merged = tmp_path / "merged.json"
    out = subprocess.run([sys.executable, "-m", "mpidist", "timeline", "merge", str(merged),
                          str(tmp_path / "tl" / "trace.rank*.json")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    events = json.loads(merged.read_text())["traceEvents"]
    spans = [e for e in events if e.get("cat") == "collective"]
    assert {e["pid"] for e in spans} == {0, 1}
    # both ranks recorded the same collectives, in the same order
    by_rank = [[(e["name"], e["args"]["leaves"]) for e in spans if e["pid"] == r] for r in (0, 1)]
    assert by_rank[0] == by_rank[1] and ("allreduce", 3) in by_rank[0]


def test_timeline_merge_reads_a_file_cut_short(tmp_path):
    """A job killed mid-run leaves a trace without its closing bracket; merge still reads it."""
    from mpidist.timeline import merge
    cut = tmp_path / "cut.json"
    cut.write_text('[\n{"name":"allreduce","ph":"X","pid":0,"tid":1,"ts":1,"dur":2},\n'
                   '{"name":"transfer","ph":"X","pid":0,"tid":1,"ts":1.5,"dur":1}')
    assert [e["name"] for e in merge([str(cut)])["traceEvents"]] == ["allreduce", "transfer"]
    bad = tmp_path / "bad.json"
    bad.write_text('{"x": 1}')
    with pytest.raises(ValueError, match="timeline merge: .* is not a trace in JSON array format"):
        merge([str(bad)])


def test_moved_bench_modes_point_at_the_tools(mpirun):
    """`bench sweep` and friends moved to tools/: the old command says where, and fails."""
    job = mpirun(1, "-m", "mpidist", "bench", "sweep")
    assert job.returncode != 0 and "python -m tools.sweep" in job.output, job.output
