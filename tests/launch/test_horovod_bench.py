"""``python -m tools.horovod_bench`` runs under mpirun -n 2 and reports every case (no timing asserted)."""
from __future__ import annotations

import importlib.util
import json
import re

import pytest


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="TensorFlow is not installed")
def test_horovod_bench_reports_every_case(mpirun):
    job = mpirun(2, "-m", "tools.horovod_bench", "--seconds", "0.2", "--json", timeout=300)
    assert job.returncode == 0, job.output[-3000:]
    found = json.loads(job.output[job.output.index("{"):job.output.rindex("}") + 1])
    assert found["ranks"] == 2
    allreduce = found["allreduce 4 KB (ms)"]
    assert set(allreduce) >= {"hvd.allreduce in tf.function (mpidist.horovod)", "raw mpi4py Allreduce (NumPy)"}
    assert all(v > 0 for v in allreduce.values())
    steps = next(v for k, v in found.items() if k.startswith("Keras step"))
    assert len(steps) == 3 and all(v > 0 for v in steps.values())
    assert not re.search(r"Traceback", job.output)
