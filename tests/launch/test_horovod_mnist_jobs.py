"""Horovod's two everyday TensorFlow 2 examples with only the import swapped, as launch jobs.

jobs/hvd_keras_mnist.py (tensorflow2_keras_mnist.py: Keras ``fit``, hvd.DistributedOptimizer,
Horovod's callbacks) and jobs/hvd_tf2_mnist.py (tensorflow2_mnist.py: a custom loop with
hvd.DistributedGradientTape), on synthetic data, under Keras 3 and under Keras 2 (tf_keras,
``TF_USE_LEGACY_KERAS=1``), at -n 2 and -n 4 (four of the eight combinations: CASES): the final weights are the same on every rank and
equal, to float tolerance, those of one process trained on the global batch with plain Keras
(jobs/hvd_mnist_reference.py).
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from launching import JOBS

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="TensorFlow is not installed")
FLAVORS = {"keras3": {"TF_USE_LEGACY_KERAS": "0"}, "tf_keras": {"TF_USE_LEGACY_KERAS": "1"}}
EXPECTED_KERAS = {"keras3": "keras._tf_keras.keras", "tf_keras": "tf_keras.api._v2.keras"}


def _need(flavor: str) -> None:
    if flavor == "tf_keras" and importlib.util.find_spec("tf_keras") is None:
        pytest.skip("tf_keras is not installed (tests/run installs it: see docs/keras2.md)")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """``reference(script, flavor, n)``: the single-process weights for an n-rank job. One process per
    Keras flavor computes the references of every case of CASES under that flavor (both scripts):
    TensorFlow is imported once per flavor, and no reference is computed that no case compares."""
    done: dict[str, object] = {}

    def get(script: str, flavor: str, n: int):
        if flavor not in done:
            out = tmp_path_factory.mktemp(f"reference-{flavor}")
            wanted = sorted({f"{s}:{r}" for s, f, r in CASES if f == flavor} | {f"{script}:{n}"})
            proc = subprocess.run([sys.executable, str(JOBS / "hvd_mnist_reference.py"), str(out), *wanted],
                                  capture_output=True, text=True, timeout=600, env=dict(os.environ, **FLAVORS[flavor]))
            assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
            assert f"tf.keras: {EXPECTED_KERAS[flavor]}" in proc.stdout, proc.stdout[-2000:]
            done[flavor] = out
        return np.load(done[flavor] / f"ref-{script}-{n}.npz")
    return get


# each script under each Keras at one of the two sizes, each size under each Keras and for each script
# (the suite's time: every one of the eight combinations passes, see docs/horovod.md)
CASES = [("keras", "keras3", 2), ("keras", "tf_keras", 4), ("tf2", "keras3", 4), ("tf2", "tf_keras", 2)]


@pytest.mark.parametrize("script, flavor, ranks", CASES, ids=["-".join(map(str, c)) for c in CASES])
def test_horovod_example_equals_one_process_on_the_global_batch(mpirun, reference, tmp_path, script, flavor, ranks):
    _need(flavor)
    job = mpirun(ranks, f"hvd_{script}_mnist.py", str(tmp_path), timeout=600, env=FLAVORS[flavor])
    assert job.returncode == 0, job.output[-4000:]
    sums = dict(re.findall(r"rank (\d+): weights checksum (\w+)", job.output))
    assert sorted(sums) == [str(r) for r in range(ranks)], job.output[-3000:]
    assert len(set(sums.values())) == 1, sums  # bitwise the same weights on every rank
    got, expected = np.load(tmp_path / "weights.npz"), reference(script, flavor, ranks)
    assert got.files == expected.files and len(got.files) == 6
    for name in expected.files:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-4, atol=1e-5, err_msg=name)
    saved = sorted(os.listdir(tmp_path))  # the chief's checkpoints, as the examples write them
    if script == "keras":
        assert saved == ["checkpoint-1.weights.h5", "checkpoint-2.weights.h5", "checkpoint-3.weights.h5",
                         "weights.npz"], saved
    else:
        assert "checkpoint" in saved and "checkpoints-1.index" in saved, saved


def test_jobs_differ_from_horovod_only_in_their_import():
    for name, line in (("hvd_keras_mnist.py", "import mpidist.horovod.tensorflow.keras as hvd  "
                                             "# was: import horovod.tensorflow.keras as hvd"),
                       ("hvd_tf2_mnist.py", "import mpidist.horovod.tensorflow as hvd  "
                                           "# was: import horovod.tensorflow as hvd")):
        lines = [ln for ln in (JOBS / name).read_text().splitlines() if "mpidist" in ln and ln.startswith(("import", "from"))]
        assert lines == [line], (name, lines)
