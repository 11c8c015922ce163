"""examples/horovod_keras.py (a Horovod Keras script with mpidist's import line) under mpirun -n 2."""
from __future__ import annotations

import importlib.util
import pathlib
import re

import pytest

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "horovod_keras.py"


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="TensorFlow is not installed")
def test_horovod_keras_example_trains_identically_on_every_rank(mpirun):
    job = mpirun(2, str(EXAMPLE), "--epochs", "6", timeout=300)
    assert job.returncode == 0, job.output[-3000:]
    match = re.search(r"ranks: 2; final test accuracy: (\S+);", job.output)
    assert match, job.output[-3000:]
    assert float(match.group(1)) > 0.8, job.output[-3000:]  # well above chance (0.1)
    sums = re.findall(r"rank (\d): weights checksum (\S+)", job.output)
    assert sorted(r for r, _ in sums) == ["0", "1"] and len({s for _, s in sums}) == 1, job.output[-2000:]


def test_example_differs_from_horovod_only_in_its_import():
    lines = [ln for ln in EXAMPLE.read_text().splitlines() if "mpidist" in ln and not ln.startswith((" ", '"'))]
    assert lines == ["import mpidist.horovod.tensorflow.keras as hvd  # noqa: E402  "
                     "(was: import horovod.tensorflow.keras as hvd)"]
