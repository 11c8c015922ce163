"""Gradient clipping of Keras 3 optimizers under an mpidist strategy clips the aggregated gradient:
``clipnorm``, ``global_clipnorm`` and ``clipvalue``, in ``fit`` (also with gradient accumulation) and
in custom loops calling ``optimizer.apply_gradients`` / ``optimizer.apply`` inside ``strategy.run``,
equal to one process on the same global batches. (Keras 3 clips before its cross-replica sum, and
TensorFlow's own strategies clip each replica's part; see mpidist/keras/clipping.py.)"""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from reference import CLIPS, clipping_acts  # noqa: E402

pytestmark = pytest.mark.mpi
GLOBAL_BATCH = 12  # a multiple of every tested size (1, 2, 3, 4)
TOL = 1e-5


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4 * GLOBAL_BATCH, 8)).astype(np.float32)
    return x, 5 * rng.normal(size=(len(x), 2)).astype(np.float32)  # 4 steps an epoch, 2 epochs


def build(clip=None, accumulate=None, jit_compile=False):
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(2)])
    kwargs = {} if clip is None else {clip: CLIPS[clip]}
    model.compile(keras.optimizers.SGD(0.1, gradient_accumulation_steps=accumulate, **kwargs), "mse",
                  jit_compile=jit_compile)
    return model


def batch_loss(model, xb, yb):
    """The mean squared error over the global batch (Keras's mse in fit), from one replica's rows."""
    return tf.reduce_sum(tf.reduce_mean(tf.square(model(xb) - yb), axis=-1)) / GLOBAL_BATCH


def train(model, x, y, how, strategy=None):
    if how in ("fit", "accumulation", "fit_xla"):
        model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=2, shuffle=False, verbose=0)
        return
    optimizer, variables = model.optimizer, model.trainable_variables

    def replica_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = batch_loss(model, xb, yb)
        grads = tape.gradient(loss, variables)
        if how == "apply_gradients":
            optimizer.apply_gradients(zip(grads, variables))
        else:
            optimizer.apply(grads, variables)

    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH).repeat(2)
    if strategy is None:
        step = tf.function(replica_step)
    else:
        dataset = strategy.experimental_distribute_dataset(dataset)
        step = tf.function(lambda xb, yb: strategy.run(replica_step, args=(xb, yb)))
    for xb, yb in dataset:
        step(xb, yb)


@pytest.mark.parametrize("clip, how", [
    ("clipnorm", "fit"),
    ("global_clipnorm", "fit_xla"),  # jit_compile=True: the step split around its all-reduce, clipped after it
    ("global_clipnorm", "accumulation"),  # gradient_accumulation_steps=2: the accumulated mean is clipped
    ("clipvalue", "apply_gradients"), ("global_clipnorm", "apply"),  # custom loops in strategy.run
])
def test_clipping_acts_on_the_global_gradient(strategy, comm, clip, how):
    x, y = data()
    accumulate = 2 if how == "accumulation" else None
    with strategy.scope():
        model = build(clip, accumulate, how == "fit_xla")
    initial = model.get_weights()
    train(model, x, y, how, strategy)

    def one_process():
        reference = build(clip, accumulate, how == "fit_xla")  # no strategy
        reference.set_weights(initial)
        with tf.GradientTape() as tape:
            loss = batch_loss(reference, x[:GLOBAL_BATCH], y[:GLOBAL_BATCH])
        acts = clipping_acts(clip, tape.gradient(loss, reference.trainable_variables))
        train(reference, x, y, how)
        return reference.get_weights(), acts
    expected, acts = comm.bcast(one_process() if comm.Get_rank() == 0 else None)
    assert acts, "the first step's gradient is not clipped: this test could not fail"
    got = model.get_weights()
    everyone = comm.allgather(got)
    for other in everyone[1:]:
        for a, b in zip(everyone[0], other):
            np.testing.assert_array_equal(a, b)
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=TOL, atol=TOL)
