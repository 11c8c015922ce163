"""``import mpidist`` does not import TensorFlow; ``mpidist.Server`` does, when first used."""
from __future__ import annotations

import subprocess
import sys

import pytest


def test_server_is_lazy():
    pytest.importorskip("tensorflow")
    code = ("import sys, mpidist\n"
            "assert 'tensorflow' not in sys.modules\n"
            "Server = mpidist.Server\n"
            "import tensorflow as tf\n"
            "assert issubclass(Server, tf.distribute.Server) and Server.__module__ == 'mpidist.tensorflow.server'\n"
            "try:\n"
            "    mpidist.NoSuchThing\n"
            "except AttributeError as err:\n"
            "    assert \"has no attribute 'NoSuchThing'\" in str(err)\n"
            "else:\n"
            "    raise SystemExit('no AttributeError')\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
