"""tools/overlap_bench.py, tools/overlap_timeline.py and tools/tf_bench.py's token part under a
real mpirun (smoke runs on a tiny model: no timing is asserted). They run from the repository root."""
from __future__ import annotations

import json
import os
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
ENV = {"PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
TINY = ["--inputs", "16", "--width", "64", "--depth", "3", "--batch", "8"]


def _json(output: str) -> dict:
    return json.JSONDecoder().raw_decode(output[output.index("{"):])[0]


def test_overlap_bench_smoke(mpirun):
    """Every case runs, before (the git revision) and after; buckets follow --bucket-bytes."""
    job = mpirun(2, "-m", "tools.overlap_bench", *TINY, "--bucket-bytes", "8192", "--seconds", "0.05", "--json",
                 env=ENV)
    assert job.returncode == 0, job.output
    results = _json(job.output)
    assert results["ranks"] == 2 and len(results["buckets (MB, backprop order)"]) >= 2
    assert all(ms > 0 for ms in results["ms"].values())
    assert "step after (buckets in backprop order)" in results["ms"]


def test_overlap_bench_accumulation_counts_one_reduction_per_update(mpirun):
    job = mpirun(2, "-m", "tools.overlap_bench", *TINY, "--accumulation", "--seconds", "0.05", "--json", env=ENV)
    assert job.returncode == 0, job.output
    results = _json(job.output)
    four, one = results["gradient_accumulation_steps=4"], results["gradient_accumulation_steps=1"]
    assert four["applied updates"] * 4 == four["micro-batches"] == one["applied updates"]
    assert four["... per applied update"] == one["... per applied update"] >= 1


def test_overlap_timeline_draws_and_profiles(mpirun, tmp_path):
    png, profile = tmp_path / "t.png", tmp_path / "profile.json"
    job = mpirun(2, "-m", "tools.overlap_timeline", *TINY, "--steps", "2", "--out", str(png),
                 "--trace", str(tmp_path / "trace" / "t.json"), "--profile", str(profile), env=ENV)
    assert job.returncode == 0, job.output
    assert png.stat().st_size > 1000
    tensors = json.loads(profile.read_text())["tensors"]
    assert len(tensors) == 8 and all(t["ready_ms"] > 0 and t["bytes"] > 0 for t in tensors)


def test_tf_bench_token_smoke(mpirun):
    job = mpirun(2, "-m", "tools.tf_bench", "--cases", "token", "--no-mwms", "--seconds", "0.05", "--json", env=ENV)
    assert job.returncode == 0, job.output
    rows = _json(job.output)["ordering token, 4 KB, 100 per call (ms)"]
    assert len(rows) == 6 and all(ms > 0 for ms in rows.values())
