"""``python -m tools.xla_bench`` runs under mpirun -n 2 and -n 1 and reports every case (no timing asserted)."""
from __future__ import annotations

import importlib.util
import json

import pytest


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="TensorFlow is not installed")
@pytest.mark.parametrize("ranks", [1, 2])
def test_xla_bench_reports_every_case(mpirun, tmp_path, ranks):
    out = tmp_path / "xla.json"
    job = mpirun(ranks, "-m", "tools.xla_bench", "--models", "mlp", "--steps", "3", "--rounds", "1",
                 "--json", str(out), timeout=300)
    assert job.returncode == 0, job.output[-3000:]
    found = json.loads(out.read_text())
    assert found["ranks"] == ranks
    cases = found["results"]["mlp"]
    expected = {"mpidist, jit_compile=False", "mpidist, jit_compile=True"}
    if ranks == 1:
        expected |= {"plain Keras, jit_compile=False", "plain Keras, jit_compile=True"}
    assert set(cases) == expected and all(ms > 0 for ms in cases.values())
    assert "| mlp (256) | mpidist, jit_compile=True |" in job.output
