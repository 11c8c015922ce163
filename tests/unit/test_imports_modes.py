"""The NumPy entry points never import TensorFlow; the TensorFlow ones always build on it. Each case
runs in a fresh interpreter (one rank), since whether TensorFlow was imported is process state."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")


def run(code: str) -> None:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=ENV)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_numpy_mode_never_imports_tensorflow():
    run("import sys, numpy as np, mpidist\n"
        "for cls in (mpidist.MultiWorkerMirroredStrategy, mpidist.MirroredStrategy,\n"
        "            mpidist.OneDeviceStrategy, mpidist.experimental.CentralStorageStrategy,\n"
        "            mpidist.experimental.MultiWorkerMirroredStrategy):\n"
        "    with cls() as s:\n"
        "        assert type(s) is cls and isinstance(s, mpidist.Strategy), type(s)\n"
        "        assert s.reduce('sum', np.ones(2), axis=None).tolist() == [1.0, 1.0]\n"
        "    assert s.closed\n"
        "assert issubclass(mpidist.experimental.MultiWorkerMirroredStrategy, mpidist.MultiWorkerMirroredStrategy)\n"
        "heavy = [m for m in ('tensorflow', 'keras') if m in sys.modules]\n"
        "assert not heavy, heavy\n")


def test_public_classes_follow_the_import_of_tensorflow():
    pytest.importorskip("tensorflow")
    run("import numpy as np, mpidist\n"
        "numpy_mode = mpidist.MultiWorkerMirroredStrategy()\n"
        "import tensorflow as tf\n"
        "tf_mode = mpidist.MultiWorkerMirroredStrategy()\n"
        "assert not isinstance(numpy_mode, tf.distribute.Strategy) and isinstance(tf_mode, tf.distribute.Strategy)\n"
        "for s in (numpy_mode, tf_mode):\n"
        "    assert isinstance(s, mpidist.MultiWorkerMirroredStrategy) and isinstance(s, mpidist.Strategy)\n"
        "    assert not isinstance(s, mpidist.MirroredStrategy)\n"
        "    s.close(); s.close()\n"
        "import mpidist.on_tensorflow\n"
        "assert type(numpy_mode) is mpidist.MultiWorkerMirroredStrategy\n"
        "assert type(tf_mode) is mpidist.on_tensorflow.MultiWorkerMirroredStrategy\n"
        "assert not isinstance(numpy_mode, mpidist.on_tensorflow.MultiWorkerMirroredStrategy)\n"
        "with mpidist.rc.override(framework='numpy'):\n"
        "    again = mpidist.MultiWorkerMirroredStrategy()\n"
        "assert type(again) is mpidist.MultiWorkerMirroredStrategy\n"
        "again.close()\n")
