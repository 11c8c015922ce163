"""Keras 2 (tf_keras, ``TF_USE_LEGACY_KERAS=1``): ``model.compile(jit_compile=True)`` under mpidist
strategies, against ``jit_compile=False`` and one process.

tf_keras compiles its per-replica step (``tf.function(run_step, jit_compile=True)``) and hands it
to ``strategy.run``, which compiles it in two parts around the gradients' all-reduce
(mpidist/tensorflow/xla.py), with tf_keras's current and legacy optimizers (its loss-scale
optimizer refuses strategies other than TensorFlow's, with or without XLA). A synchronized batch norm (a collective in the forward pass) cannot be split off: a
clear error on every rank.

TF_USE_LEGACY_KERAS must be set before TensorFlow is imported, so this file runs in a job of its
own (tests/run); in any other job ``tf.keras`` is Keras 3 and the file skips itself.
"""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from mpidist.tensorflow.keras import flavor  # noqa: E402

if not flavor.is_keras2():
    pytest.skip("Keras 2 tests: run with TF_USE_LEGACY_KERAS=1 and tf_keras installed (tests/run does)",
                allow_module_level=True)

import mpidist.on_tensorflow  # noqa: E402
import mpidist.tensorflow  # noqa: E402
from mpidist.cross_device.options import CommunicationOptions  # noqa: E402
from mpidist.tensorflow import XlaCollectiveError, xla  # noqa: E402

keras = tf.keras
pytestmark = [pytest.mark.mpi, pytest.mark.keras2]
GLOBAL_BATCH = 24  # a multiple of every tested size (1, 2, 3, 4)
TOL = 1e-5


def data(n: int = 96, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 8)).astype(np.float32)
    y = (x[:, :3].sum(axis=1) > 0).astype(np.int64) + (x[:, 3] > 1).astype(np.int64)
    return x, y


def make_optimizer(kind: str):
    if kind == "sgd":  # tf_keras's current optimizer
        return keras.optimizers.SGD(0.1, momentum=0.9)
    if kind == "legacy_adam":  # OptimizerV2
        return keras.optimizers.legacy.Adam(0.01)
    raise ValueError(kind)


def mlp(synchronized: bool = False):
    layers = [keras.Input((8,)), keras.layers.Dense(16, activation="relu")]
    if synchronized:
        layers.append(keras.layers.BatchNormalization(synchronized=True))
    return keras.Sequential(layers + [keras.layers.Dense(3)])


def compile_model(model, kind: str, jit: bool):
    model.compile(optimizer=make_optimizer(kind), jit_compile=jit, metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))


def on_chief(comm, fn):
    return comm.bcast(fn() if comm.Get_rank() == 0 else None, root=0)


def assert_same_on_every_rank(comm, weights):
    everyone = comm.allgather([np.asarray(w) for w in weights])
    for other in everyone[1:]:
        for a, b in zip(everyone[0], other):
            np.testing.assert_array_equal(a, b)


def assert_close(weights, reference, tol=TOL):
    for a, b in zip(weights, reference):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=tol, rtol=tol)


@pytest.mark.parametrize("kind", ["sgd", "legacy_adam"])
def test_fit_jit_compile_equals_no_jit_and_one_process(eng, comm, kind, monkeypatch):
    strategy = mpidist.on_tensorflow.MultiWorkerMirroredStrategy.on_engine(eng, CommunicationOptions())
    x, y = data()
    with strategy.scope():
        weights = mlp().get_weights()
    splits = []  # tf_keras makes its jit-compiled run_step while tracing: keep what strategy.run splits
    real_split = xla.split
    monkeypatch.setattr(xla, "split", lambda fn: splits.append(real_split(fn)) or splits[-1])
    results = {}
    for jit in (False, True):
        with strategy.scope():
            model = mlp()
            compile_model(model, kind, jit)
        model.set_weights(weights)
        history = model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=2, shuffle=False, verbose=0)
        history.history["evaluate"] = model.evaluate(x, y, batch_size=GLOBAL_BATCH, verbose=0)
        results[jit] = model.get_weights(), history.history, float(model.optimizer.iterations)
    train = [s for s in splits if s.name == "run_step" and s.update_functions()]  # tf_keras's per-replica steps
    assert len(train) == 1 and len(splits) == 2  # the train step and evaluate's test step, split
    for split in splits:
        for function in [split.forward_backward] + split.update_functions():
            assert function.function_spec.jit_compile is True and function.experimental_get_tracing_count() >= 1

    def single_process():
        model = mlp()
        compile_model(model, kind, True)
        model.set_weights(weights)
        history = model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=2, shuffle=False, verbose=0)
        history.history["evaluate"] = model.evaluate(x, y, batch_size=GLOBAL_BATCH, verbose=0)
        return model.get_weights(), history.history, float(model.optimizer.iterations)

    ref_weights, ref_history, ref_iterations = on_chief(comm, single_process)
    for weights_, history, iterations in results.values():
        assert iterations == ref_iterations == 2 * len(x) // GLOBAL_BATCH
        assert_same_on_every_rank(comm, weights_)
        assert_close(weights_, ref_weights)
        for key in ("loss", "accuracy", "evaluate"):  # epoch logs and evaluate: global, as one process
            np.testing.assert_allclose(history[key], ref_history[key], rtol=TOL)
    assert_close(results[True][0], results[False][0])


def test_synchronized_batch_norm_is_a_clear_error_on_every_rank(eng, comm):
    strategy = mpidist.on_tensorflow.MultiWorkerMirroredStrategy.on_engine(eng, CommunicationOptions())
    x, y = data(GLOBAL_BATCH)
    with strategy.scope():
        model = mlp(synchronized=True)
        compile_model(model, "sgd", True)
    with pytest.raises(XlaCollectiveError, match=r"cannot run inside `run_step`'s forward and backward pass"):
        model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=1, verbose=0)
    total = strategy.reduce("SUM", tf.constant(float(eng.rank + 1)), axis=None)  # still in step
    assert float(total) == eng.size * (eng.size + 1) / 2
