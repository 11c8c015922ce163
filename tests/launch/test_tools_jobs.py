"""The developer tools of tools/ under a real mpirun (smoke runs: no timing is asserted). They are
not installed with the package: they run from the repository root, which goes on PYTHONPATH."""
from __future__ import annotations

import json
import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
ENV = {"PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}


def test_sweep_smoke(mpirun, tmp_path):
    """The nccl-tests-style sweep runs for every collective and draws its plot (no timing asserted)."""
    png = tmp_path / "sweep.png"
    job = mpirun(2, "-m", "tools.sweep", "--max", "16KB", "--seconds", "0.05", "--json",
                 "--plot", str(png), env=ENV)
    assert job.returncode == 0, job.output
    rows = json.loads(job.output[job.output.index("["):])
    assert {r["collective"] for r in rows} == {"allreduce", "allgather", "broadcast", "reduce_scatter"}
    assert {r["bytes"] for r in rows if r["collective"] == "allreduce"} == {4096, 16384}
    for r in rows:
        assert r["mpidist"]["busbw"] > 0 and r["raw"]["busbw"] > 0
    allreduce = next(r for r in rows if r["collective"] == "allreduce")
    assert allreduce["mpidist"]["busbw"] == pytest.approx(allreduce["mpidist"]["algbw"])  # 2(p-1)/p = 1 at p=2
    assert png.stat().st_size > 1000


def test_tf_sweep_smoke(mpirun, tmp_path):
    """raw MPI vs mpidist vs TensorFlow's own MWMS (cluster from MPI, no TF_CONFIG by hand) at one size."""
    png = tmp_path / "tf.png"
    job = mpirun(2, "-m", "tools.tf_sweep", "--min", "4KB", "--max", "4KB", "--seconds", "0.05",
                 "--json", "--plot", str(png), env=ENV)
    assert job.returncode == 0, job.output
    rows = json.JSONDecoder().raw_decode(job.output[job.output.index("["):])[0]  # stdout first, then TF's log
    assert [r["bytes"] for r in rows] == [4096]
    assert all(rows[0][k] > 0 for k in ("raw MPI", "mpidist", "TF MWMS"))
    assert png.stat().st_size > 1000


def test_tf_bench_smoke(mpirun):
    """The TensorFlow bench's input cases (the distributed iterator against tf.data) run end to end."""
    job = mpirun(2, "-m", "tools.tf_bench", "--cases", "input", "--no-mwms", "--seconds", "0.05", "--json",
                 env=ENV)
    assert job.returncode == 0, job.output
    results = json.JSONDecoder().raw_decode(job.output[job.output.index("{"):])[0]
    rows = results["input step, per-replica batch 32 x 8 (ms)"]
    assert results["ranks"] == 2 and rows and all(ms > 0 for ms in rows.values())


def test_lockstep_bench_smoke(mpirun):
    """The preemption agreement's cost per step (NumPy cases): every case timed, nothing asserted on times."""
    job = mpirun(2, "-m", "tools.lockstep_bench", "--seconds", "0.3", env=ENV)
    assert job.returncode == 0, job.output
    lines = [line for line in job.output.splitlines() if "us/step" in line]
    assert [line.split("  ")[0] for line in lines] == ["step alone", "lockstep (persistent)", "lockstep (Iallreduce)",
                                                       "blocking Allreduce"], job.output
