"""Every example runs under a real mpirun at a small size, and its result is checked."""
from __future__ import annotations

import importlib.util
import pathlib
import re

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("n", [1, 2, 4])
def test_numpy_linear_regression(mpirun, n):
    job = mpirun(n, str(EXAMPLES / "numpy_linear_regression.py"), "--examples", "1000", "--epochs", "20")
    assert job.returncode == 0, job.output
    match = re.search(r"ranks: (\d+); max difference between ranks: (\S+); max \|w - lstsq\|: (\S+)", job.output)
    assert match, job.output
    assert int(match.group(1)) == n and float(match.group(2)) == 0.0  # identical parameters on every rank
    assert float(match.group(3)) < 1e-3, job.output  # converged to least squares


def test_heat_surrogate_same_simulation_at_any_rank_count(mpirun):
    energies = {}
    for n in (1, 2, 4):
        job = mpirun(n, str(EXAMPLES / "heat_surrogate.py"), "--cells", "80", "--steps", "300")
        assert job.returncode == 0, job.output
        energies[n] = float(re.search(r"energy (\S+)", job.output).group(1))
        error = float(re.search(r"max error (\S+);", job.output).group(1))
        assert error < 1e-6, job.output  # the surrogate recovered the exact stencil
        assert f"trained on {max(1, n // 2)} rank(s)" in job.output
    assert energies[1] == pytest.approx(energies[2], rel=1e-9) == pytest.approx(energies[4], rel=1e-9)


needs_tf = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="TensorFlow is not installed")


@needs_tf
def test_keras_digits_main_job(mpirun, tmp_path):
    png = tmp_path / "curve.png"
    job = mpirun(2, str(EXAMPLES / "keras_digits.py"), "--epochs", "8", "--plot", str(png), timeout=300)
    assert job.returncode == 0, job.output[-3000:]
    match = re.search(r"ranks: 2; final test accuracy: (\S+);", job.output)
    assert match, job.output[-3000:]
    assert float(match.group(1)) > 0.8, job.output[-3000:]  # 8 epochs on digits: well above chance (0.1)
    assert job.output.count("final test accuracy") == 1  # the chief alone reports
    assert png.stat().st_size > 1000


@needs_tf
def test_custom_training_loop_same_weights_on_every_rank(mpirun):
    job = mpirun(2, str(EXAMPLES / "custom_training_loop.py"), "--epochs", "3", timeout=300)
    assert job.returncode == 0, job.output[-3000:]
    assert job.output.count("Epoch 3, Loss:") == 1
    sums = re.findall(r"rank (\d): weights checksum (\S+)", job.output)
    assert sorted(r for r, _ in sums) == ["0", "1"] and len({s for _, s in sums}) == 1, job.output[-2000:]
