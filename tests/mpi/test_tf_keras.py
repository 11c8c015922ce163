"""Keras 3 and TensorFlow training under mpidist strategies, against single-process training.

Each rank also trains the same model without a strategy, on the same global batches, in the same
process: the distributed weights must be identical on every rank and equal to that reference
within float tolerance; logged epoch loss and metrics must be the global ones.
"""
from __future__ import annotations

import os
import shutil
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import mpidist  # noqa: E402
import mpidist.on_tensorflow  # noqa: E402
from mpidist.cross_device.options import CommunicationOptions  # noqa: E402
from mpidist.tensorflow import checkpoint  # noqa: E402

pytestmark = pytest.mark.mpi
GLOBAL_BATCH = 12  # a multiple of every tested size (1, 2, 3, 4)
TOL = 1e-5


def dataset_arrays(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 8)).astype(np.float32)
    y = (x[:, :3].sum(axis=1) > 0).astype(np.int64) + (x[:, 3] > 1).astype(np.int64)
    return x, y


def build_model(optimizer: str = "sgd", steps_per_execution: int = 1):
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(3)])
    opt = keras.optimizers.SGD(0.1, momentum=0.9) if optimizer == "sgd" else keras.optimizers.Adam(0.01)
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], steps_per_execution=steps_per_execution)
    return model


def assert_same_on_every_rank(comm, weights):
    everyone = comm.allgather([np.asarray(w) for w in weights])
    for other in everyone[1:]:
        for a, b in zip(everyone[0], other):
            np.testing.assert_array_equal(a, b)


def assert_close(weights, reference, tol=TOL):
    for a, b in zip(weights, reference):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=tol, rtol=tol)


def on_chief(comm, fn):
    """``fn()`` computed by rank 0 only (the single-process reference), sent to every rank."""
    return comm.bcast(fn() if comm.Get_rank() == 0 else None, root=0)


@pytest.mark.parametrize("kind, data, optimizer, steps_per_execution", [
    ("MultiWorkerMirroredStrategy", "dataset", "sgd", 3),  # several steps per tf.function (a while loop)
    ("MultiWorkerMirroredStrategy", "numpy", "adam", 1),
    ("MultiWorkerMirroredStrategy", "distributed", "sgd", 2),  # fit(strategy.experimental_distribute_dataset(ds))
    ("CentralStorageStrategy", "numpy", "adam", 1),
])
def test_fit_and_evaluate_equal_single_process(eng, comm, kind, data, optimizer, steps_per_execution):
    strategy = getattr(mpidist.on_tensorflow, kind).on_engine(eng, CommunicationOptions())
    x, y = dataset_arrays(72)
    xe, ye = dataset_arrays(70, seed=1)  # 70 = 5 full global batches + a short one of 10
    with strategy.scope():
        model = build_model(optimizer, steps_per_execution)
    initial = model.get_weights()
    assert_same_on_every_rank(comm, initial)
    fit = dict(epochs=2, verbose=0, shuffle=False)
    if data == "numpy":
        history = model.fit(x, y, batch_size=GLOBAL_BATCH, **fit)
        got = model.evaluate(xe, ye, batch_size=GLOBAL_BATCH, verbose=0, return_dict=True)
    else:
        train, test = (tf.data.Dataset.from_tensor_slices(d).batch(GLOBAL_BATCH) for d in ((x, y), (xe, ye)))
        if data == "distributed":
            train, test = (strategy.experimental_distribute_dataset(d) for d in (train, test))
        history = model.fit(train, **fit)
        got = model.evaluate(test, verbose=0, return_dict=True)

    def single_process():
        reference = build_model(optimizer, steps_per_execution)  # no strategy
        reference.set_weights(initial)
        h = reference.fit(x, y, batch_size=GLOBAL_BATCH, **fit)
        e = reference.evaluate(xe, ye, batch_size=GLOBAL_BATCH, verbose=0, return_dict=True)
        return reference.get_weights(), h.history, e

    weights, expected_history, expected_eval = on_chief(comm, single_process)
    assert_same_on_every_rank(comm, model.get_weights())
    assert_close(model.get_weights(), weights)
    for key in ("loss", "accuracy"):  # epoch logs are global, not this rank's
        np.testing.assert_allclose(history.history[key], expected_history[key], rtol=TOL)
    assert got.keys() == expected_eval.keys()
    for key in expected_eval:
        assert got[key] == pytest.approx(expected_eval[key], rel=TOL)


def test_custom_training_loop_tutorial(eng, comm):
    """TensorFlow's "Custom training with tf.distribute.Strategy" tutorial, unchanged in shape."""
    x, y = dataset_arrays(72, seed=2)

    def make(strategy_or_none):
        scope = strategy_or_none.scope() if strategy_or_none else tf.distribute.get_strategy().scope()
        with scope:
            model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                      keras.layers.Dense(3)])
            optimizer = keras.optimizers.SGD(0.1)
            loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
            accuracy = keras.metrics.SparseCategoricalAccuracy()
        return model, optimizer, loss_object, accuracy

    def train(strategy, model, optimizer, loss_object, accuracy):
        def compute_loss(labels, predictions):
            per_example_loss = loss_object(labels, predictions)
            return tf.nn.compute_average_loss(per_example_loss, global_batch_size=GLOBAL_BATCH)

        def train_step(inputs):
            images, labels = inputs
            with tf.GradientTape() as tape:
                predictions = model(images, training=True)
                loss = compute_loss(labels, predictions)
            gradients = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables))
            accuracy.update_state(labels, predictions)
            return loss

        @tf.function
        def distributed_train_step(dataset_inputs):
            per_replica_losses = strategy.run(train_step, args=(dataset_inputs,))
            return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)

        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
        dist_dataset = strategy.experimental_distribute_dataset(dataset)
        losses, accuracies = [], []
        for _ in range(2):
            total, batches = 0.0, 0
            for batch in dist_dataset:
                total += float(distributed_train_step(batch))
                batches += 1
            losses.append(total / batches)
            accuracies.append(float(accuracy.result()))
            accuracy.reset_state()
        return losses, accuracies

    strategy = mpidist.on_tensorflow.MultiWorkerMirroredStrategy.on_engine(eng, CommunicationOptions())
    parts = make(strategy)
    initial = parts[0].get_weights()
    losses, accuracies = train(strategy, *parts)

    def single_process():
        ref_parts = make(None)
        ref_parts[0].set_weights(initial)
        return train(tf.distribute.get_strategy(), *ref_parts), ref_parts[0].get_weights()

    (ref_losses, ref_accuracies), ref_weights = on_chief(comm, single_process)
    assert_same_on_every_rank(comm, parts[0].get_weights())
    assert_close(parts[0].get_weights(), ref_weights)
    np.testing.assert_allclose(losses, ref_losses, rtol=TOL)
    np.testing.assert_allclose(accuracies, ref_accuracies, rtol=TOL)


def test_checkpoint_saved_by_chief_restored_everywhere(eng, comm):
    strategy = mpidist.on_tensorflow.MultiWorkerMirroredStrategy.on_engine(eng, CommunicationOptions())
    x, y = dataset_arrays(36, seed=3)
    with strategy.scope():
        model = build_model("adam")
    model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=1, shuffle=False, verbose=0)
    with strategy.scope():
        metric = keras.metrics.Mean()  # sync-on-read: its saved value must be the global one
    tf.function(lambda v: strategy.run(metric.update_state, args=(v,)))(tf.constant([eng.rank + 1.0] * (eng.rank + 1)))
    ckpt = tf.train.Checkpoint(model=model, optimizer=model.optimizer, metric=list(metric.variables))
    directory = comm.bcast(tempfile.mkdtemp(prefix="mpidist-ckpt-") if eng.rank == 0 else None, root=0)
    try:
        saved = [v.numpy() for v in model.variables + model.optimizer.variables]
        metric_value = float(metric.result())
        assert metric_value == pytest.approx(sum((r + 1) ** 2 for r in range(eng.size)) /
                                             sum(r + 1 for r in range(eng.size)))
        path = checkpoint.save(ckpt, os.path.join(directory, "ckpt"), strategy=strategy)
        assert comm.allgather(path) == [path] * eng.size
        assert os.path.exists(path + ".index")
        assert int(ckpt.save_counter.numpy()) == 1  # equal on every rank
        rng = np.random.default_rng(eng.rank)
        for v in model.variables + model.optimizer.variables:
            if np.issubdtype(np.dtype(str(v.dtype)), np.floating):
                v.assign(rng.normal(size=v.shape).astype(str(v.dtype)))
        metric.reset_state()
        checkpoint.restore(ckpt, path).assert_consumed()
        restored = [v.numpy() for v in model.variables + model.optimizer.variables]
        for a, b in zip(restored, saved):
            np.testing.assert_array_equal(a, b)
        assert_same_on_every_rank(comm, restored)
        assert float(metric.result()) == pytest.approx(metric_value, rel=1e-6)
        manager = tf.train.CheckpointManager(ckpt, directory, max_to_keep=1)
        second = checkpoint.save_manager(manager, strategy=strategy)
        assert comm.allgather(second) == [second] * eng.size and second.endswith("-2")
        assert int(ckpt.save_counter.numpy()) == 2 and tf.train.latest_checkpoint(directory) == second
    finally:
        comm.Barrier()
        if eng.rank == 0:
            shutil.rmtree(directory, ignore_errors=True)
