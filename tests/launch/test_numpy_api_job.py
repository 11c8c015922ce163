"""The whole NumPy API under a real mpirun, in a process that never imports TensorFlow."""
from __future__ import annotations

import pytest


@pytest.mark.parametrize("n", [2])
def test_numpy_api_never_imports_tensorflow(mpirun, n):
    job = mpirun(n, "numpy_api.py")
    assert job.returncode == 0, job.output
    assert job.output.count("numpy API ok, no tensorflow imported") == n, job.output
