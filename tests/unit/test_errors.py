"""Error types, and DeadlineExceededError caught by `except tf.errors.DeadlineExceededError`."""
from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from mpidist import errors


def test_without_tensorflow_plain_types():
    code = ("import sys\nfrom mpidist import errors\n"
            "err = errors.deadline_exceeded('allreduce: late')\n"
            "assert 'tensorflow' not in sys.modules\n"
            "assert type(err) is errors.DeadlineExceededError and isinstance(err, TimeoutError)\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)  # a process without TensorFlow
    assert issubclass(errors.CollectiveMismatchError, ValueError)
    assert issubclass(errors.CommunicatorBrokenError, RuntimeError)


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="TensorFlow is not installed")
def test_with_tensorflow_imported_tf_except_clause_catches_it():
    code = (
        "import tensorflow as tf\n"
        "from mpidist import errors\n"
        "try:\n"
        "    raise errors.deadline_exceeded('allreduce: not finished within timeout_seconds=1')\n"
        "except tf.errors.DeadlineExceededError as e:\n"
        "    assert isinstance(e, errors.DeadlineExceededError) and isinstance(e, TimeoutError)\n"
        "    assert e.message == str(e) == 'allreduce: not finished within timeout_seconds=1'\n"
        "    assert e.error_code == tf.errors.DEADLINE_EXCEEDED\n"
        "    print('caught')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "caught"
