"""``tf.random.shuffle`` while one thread builds a Keras input pipeline with ``shuffle=True``: that
thread's unseeded shuffles draw the agreed permutations (seed and counter of mpidist's shuffle
agreement), another thread's stay TensorFlow's own and do not advance the agreed counter.

mpidist once swapped ``tf.random.shuffle`` for the time a pipeline was built, so a shuffle of any
other thread in that window drew from the agreed seed and advanced its counter. It now wraps it once
(through the patch registry) and the wrapper reads a context variable, which a new thread does not
inherit. Runs in a fresh interpreter: the wrapper stays installed for good.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

CODE = r"""
import threading
import numpy as np
import tensorflow as tf
from mpidist.tensorflow import patching
from mpidist.tensorflow.keras import shuffle

values = tf.range(50)
def agreed(step):
    return tf.random.experimental.stateless_shuffle(values, seed=tf.constant([123, step], tf.int64)).numpy()

shuffle._install_random_shuffle(tf.random, patching.KERAS3)
assert any(p.endswith("random.shuffle") for p in patching.installed()), patching.installed()
entered, other_done = threading.Event(), threading.Event()
got = {}

def builder():
    with shuffle._agreeing(123):
        entered.set()
        assert other_done.wait(60)
        got["first"] = tf.random.shuffle(values).numpy()
        got["seeded"] = tf.random.shuffle(values, seed=7).numpy()
        got["second"] = tf.random.shuffle(values).numpy()
    got["after"] = tf.random.shuffle(values).numpy()

thread = threading.Thread(target=builder)
thread.start()
assert entered.wait(60)
other = [tf.random.shuffle(values).numpy() for _ in range(3)]  # while the builder's context is open
other_done.set()
thread.join(60)
np.testing.assert_array_equal(got["first"], agreed(1))  # the other thread advanced nothing
np.testing.assert_array_equal(got["second"], agreed(2))
for result in other + [got["seeded"], got["after"]]:  # TensorFlow's own: not an agreed permutation
    assert sorted(result.tolist()) == list(range(50))
    assert not any(np.array_equal(result, agreed(k)) for k in range(1, 6))
print("THREADS OK")
"""


def test_another_threads_shuffles_stay_tensorflows_own():
    pytest.importorskip("keras")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0 and "THREADS OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-6000:]
