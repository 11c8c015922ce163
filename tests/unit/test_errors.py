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


def test_a_peer_failure_is_of_the_failing_rank_s_builtin_type():
    error = errors.peer_failure("broadcast", [(2, errors.failure_types(KeyError("root")), "'root'")])
    assert isinstance(error, errors.CollectiveFailedError) and isinstance(error, KeyError)
    assert error.rank == 2 and error.failures == [(2, "KeyError", "'root'")]
    assert str(error).startswith("broadcast: rank 2 failed before the collective's data moved")
    # types that cannot be combined (OSError's lay-out, a class of the program) leave the plain class
    for other in (FileNotFoundError("x"), type("Custom", (Exception,), {})("x")):
        plain = errors.peer_failure("allreduce", [(0, errors.failure_types(other), "x")])
        assert type(plain) is errors.CollectiveFailedError


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="TensorFlow is not installed")
def test_a_peer_failure_of_a_tf_error_is_that_tf_error():
    code = (
        "import tensorflow as tf\n"
        "from mpidist import errors\n"
        "mine = tf.errors.FailedPreconditionError(None, None, 'mismatch')\n"
        "e = errors.peer_failure('allgather', [(1, errors.failure_types(mine), 'mismatch')])\n"
        "assert isinstance(e, tf.errors.FailedPreconditionError) and isinstance(e, errors.CollectiveFailedError)\n"
        "assert e.error_code == tf.errors.FAILED_PRECONDITION and 'rank 1' in e.message\n"
        "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "ok"
