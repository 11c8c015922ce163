"""Keras 3 ``mixed_float16`` under an mpidist strategy: dynamic loss scaling decides as one process
on the same global batches (which steps are skipped, the loss scale), and the weights are one
process's within float16's rounding. (tf_keras refuses mixed precision under strategies other than
TensorFlow's own: "Mixed precision is not supported with the tf.distribute.Strategy".)"""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

pytestmark = pytest.mark.mpi
GLOBAL_BATCH = 12  # a multiple of every tested size (1, 2, 3, 4)


@pytest.fixture
def mixed_float16():
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_float16")
    yield
    keras.mixed_precision.set_global_policy(previous)


def build():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(2)])
    model.compile(keras.optimizers.SGD(0.01), "mse")  # Keras wraps it: LossScaleOptimizer, dynamic
    return model


def test_dynamic_loss_scaling_decides_as_one_process(strategy, comm, mixed_float16):
    """The first target of every global batch is large: the scaled gradient of the part holding it
    overflows float16 at first, on that rank only. Every rank skips those steps and lowers the loss
    scale alike (each rank used to decide on its own part: CollectiveMismatchError)."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4 * GLOBAL_BATCH, 8)).astype(np.float32)
    y = rng.normal(size=(len(x), 2)).astype(np.float32)
    y[::GLOBAL_BATCH] *= 100
    with strategy.scope():
        model = build()
    initial = model.get_weights()
    model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=2, shuffle=False, verbose=0)
    got = (model.get_weights(), float(model.optimizer.dynamic_scale.numpy()), int(model.optimizer.iterations.numpy()))

    def one_process():
        reference = build()
        reference.set_weights(initial)
        reference.fit(x, y, batch_size=GLOBAL_BATCH, epochs=2, shuffle=False, verbose=0)
        return (reference.get_weights(), float(reference.optimizer.dynamic_scale.numpy()),
                int(reference.optimizer.iterations.numpy()))
    expected = comm.bcast(one_process() if comm.Get_rank() == 0 else None)
    assert got[1:] == expected[1:]  # the same loss scale, the same steps applied
    assert expected[1] < 2 ** 15 and expected[2] < 8  # steps were skipped: the scaling acted
    everyone = comm.allgather(got[0])
    for other in everyone[1:]:
        for a, b in zip(everyone[0], other):
            np.testing.assert_array_equal(a, b)
    # float16 activations computed at other batch shapes round differently (a float32 sum inside a
    # kernel may fall on either side of a float16 rounding): a few float16 epsilons (9.8e-4) of the
    # weights' change; measured 5e-6 to 5e-5 here, 3e-4 of the change
    moved = max(np.abs(a - b).max() for a, b in zip(expected[0], initial))
    for a, b in zip(got[0], expected[0]):
        np.testing.assert_allclose(a, b, rtol=0, atol=2e-3 * moved)
