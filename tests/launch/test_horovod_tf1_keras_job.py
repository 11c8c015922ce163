"""jobs/hvd_tf1_keras.py: a TensorFlow 1-style tf_keras program (v1 graph, legacy optimizer,
Horovod's broadcast callback) equals NumPy on every rank, at -n 2."""
from __future__ import annotations

import importlib.util
import re

import pytest


@pytest.mark.skipif(importlib.util.find_spec("tf_keras") is None,
                    reason="tf_keras is not installed (tests/run installs it: see docs/keras2.md)")
def test_tf1_style_keras_program_equals_numpy(mpirun):
    job = mpirun(2, "hvd_tf1_keras.py", timeout=300, env={"TF_USE_LEGACY_KERAS": "1"})
    assert job.returncode == 0, job.output[-4000:]
    assert sorted(re.findall(r"rank (\d): tf1 keras equals numpy", job.output)) == ["0", "1"], job.output[-3000:]
