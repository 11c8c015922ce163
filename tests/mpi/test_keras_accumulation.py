"""Keras 3 optimizers' ``gradient_accumulation_steps`` under an mpidist strategy: the update equals
the large-batch update, and the gradients cross the network once per applied update, not once per
micro-batch (Keras all-reduces inside its "apply" branch only)."""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import mpidist  # noqa: E402
import mpidist.on_tensorflow  # noqa: E402
from mpidist.cross_device.options import CommunicationOptions  # noqa: E402

pytestmark = pytest.mark.mpi
MICRO, STEPS, ROWS, EPOCHS = 12, 4, 48, 2  # 4 micro-batches of 12 = one update of 48, per epoch (multiples of 1-4 ranks)
KERNEL = (8, 16)


@pytest.fixture(scope="module")
def counted():
    """A strategy on an engine that counts the all-reduces carrying the gradients (a leaf of KERNEL's shape)."""
    engine = mpidist.Engine()
    calls = []
    real = engine.allreduce

    def allreduce(value, *args, **kwargs):
        leaves = value if isinstance(value, (list, tuple)) else [value]
        if any(np.shape(leaf) == KERNEL for leaf in leaves):
            calls.append(len(leaves))
        return real(value, *args, **kwargs)

    engine.allreduce = allreduce
    yield mpidist.on_tensorflow.MultiWorkerMirroredStrategy.on_engine(engine, CommunicationOptions()), calls
    engine.close()


def build(optimizer):
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer=optimizer, loss="mse")
    return model


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_accumulated_update_equals_large_batch_and_communicates_once(counted, comm, optimizer):
    strategy, calls = counted
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, 8)).astype(np.float32)
    y = x[:, :1] * 2.0 - x[:, 1:2]

    def make(accumulate):
        kwargs = dict(learning_rate=0.05, gradient_accumulation_steps=STEPS if accumulate else None)
        return keras.optimizers.SGD(**kwargs) if optimizer == "sgd" else keras.optimizers.Adam(**kwargs)

    with strategy.scope():
        micro = build(make(True))
        large = build(make(False))
    large.set_weights(micro.get_weights())
    del calls[:]
    micro.fit(x, y, batch_size=MICRO, epochs=EPOCHS, shuffle=False, verbose=0)
    assert calls == [4] * EPOCHS  # one all-reduce of the 4 gradients per applied update
    del calls[:]
    large.fit(x, y, batch_size=ROWS, epochs=EPOCHS, shuffle=False, verbose=0)
    assert calls == [4] * EPOCHS
    assert int(micro.optimizer.iterations.numpy()) == EPOCHS  # applied updates (Keras counts those)
    for a, b in zip(micro.get_weights(), large.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    everyone = comm.allgather([np.asarray(w) for w in micro.get_weights()])
    for other in everyone[1:]:
        for a, b in zip(everyone[0], other):
            np.testing.assert_array_equal(a, b)
