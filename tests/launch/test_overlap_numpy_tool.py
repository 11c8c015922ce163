"""tools/overlap_numpy.py under a real mpirun (a smoke run on a tiny model: no timing is asserted)."""
from __future__ import annotations

import json
import os
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
ENV = {"PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}


def test_overlap_numpy_smoke(mpirun):
    """Every case runs; buckets follow --bucket-bytes; the step after trains the same weights as before."""
    job = mpirun(2, "-m", "tools.overlap_numpy", "--inputs", "16", "--width", "64", "--depth", "3", "--batch", "8",
                 "--bucket-bytes", "8192", "--seconds", "0.05", "--json", env=ENV)
    assert job.returncode == 0, job.output
    results = json.JSONDecoder().raw_decode(job.output[job.output.index("{"):])[0]
    assert results["ranks"] == 2 and len(results["buckets (MB, backprop order)"]) >= 2
    assert results["weights after == before, bit for bit (same steps)"] is True
    assert all(ms > 0 for ms in results["ms"].values()) and len(results["ms"]) == 5
