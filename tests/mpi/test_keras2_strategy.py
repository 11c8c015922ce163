"""Keras 2 (tf_keras, ``TF_USE_LEGACY_KERAS=1``) training under mpidist strategies, against one process.

The Keras 2 counterpart of test_tf_keras.py: ``model.fit`` / ``evaluate`` of a ``tf.keras`` model
built under ``strategy.scope()``, with tf_keras's current and legacy optimizers, and a custom loop.
Each rank also trains the same model without a strategy on the same global batches: the
distributed weights must be identical on every rank and equal to that reference within float
tolerance; logged epoch loss and metrics must be the global ones.

TF_USE_LEGACY_KERAS must be set before TensorFlow is imported, so this file runs in a job of its
own (tests/run: ``TF_USE_LEGACY_KERAS=1 mpirun ... tests/mpi/test_keras2_*.py``); in any other
job ``tf.keras`` is Keras 3 and the file skips itself.
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

from reference import CLIPS, assert_float32_close, clipping_acts  # noqa: E402

import mpidist.on_tensorflow  # noqa: E402
import mpidist.tensorflow  # noqa: E402
from mpidist.cross_device.options import CommunicationOptions  # noqa: E402

keras = tf.keras
pytestmark = [pytest.mark.mpi, pytest.mark.keras2]
GLOBAL_BATCH = 12  # a multiple of every tested size (1, 2, 3, 4)
TOL = 1e-5


def dataset_arrays(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 8)).astype(np.float32)
    y = (x[:, :3].sum(axis=1) > 0).astype(np.int64) + (x[:, 3] > 1).astype(np.int64)
    return x, y


def make_optimizer(kind: str):
    if kind == "sgd":  # tf_keras's current optimizer (the one since TF 2.11)
        return keras.optimizers.SGD(0.1, momentum=0.9)
    if kind == "legacy_sgd":  # OptimizerV2, with Keras 2's lr= spelling
        return keras.optimizers.legacy.SGD(lr=0.1, momentum=0.9)
    if kind == "legacy_adam":
        return keras.optimizers.legacy.Adam(0.01)
    return keras.optimizers.Adam(0.01)


def build_model(optimizer: str, steps_per_execution: int = 1):
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              # batch statistics over the global batch (the replica context's all_reduce)
                              keras.layers.BatchNormalization(synchronized=True), keras.layers.Dense(3)])
    model.compile(optimizer=make_optimizer(optimizer),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], steps_per_execution=steps_per_execution)
    return model


def assert_same_on_every_rank(comm, weights):
    everyone = comm.allgather([np.asarray(w) for w in weights])
    for other in everyone[1:]:
        for a, b in zip(everyone[0], other):
            np.testing.assert_array_equal(a, b)


def assert_close(weights, reference, tol=TOL):
    assert len(weights) == len(reference)
    for a, b in zip(weights, reference):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=tol, rtol=tol)


def on_chief(comm, fn):
    """``fn()`` computed by rank 0 only (the single-process reference), sent to every rank."""
    return comm.bcast(fn() if comm.Get_rank() == 0 else None, root=0)


def test_tf_keras_is_keras_2():
    assert flavor.major_version(keras) == 2 and keras.__name__.startswith("tf_keras")


@pytest.mark.parametrize("kind, data, optimizer, steps_per_execution", [
    ("MultiWorkerMirroredStrategy", "numpy", "sgd", 1),
    ("MultiWorkerMirroredStrategy", "dataset", "legacy_sgd", 3),  # several steps per tf.function
    ("MultiWorkerMirroredStrategy", "distributed", "adam", 2),  # fit(strategy.experimental_distribute_dataset(ds))
    ("MultiWorkerMirroredStrategy", "numpy", "legacy_adam", 1),
    ("CentralStorageStrategy", "numpy", "sgd", 1),
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
        steps = {}
        if data == "distributed":  # Keras 2 iterates a distributed dataset once: repeat it, give the steps
            train = strategy.experimental_distribute_dataset(train.repeat())
            test = strategy.experimental_distribute_dataset(test)
            steps = dict(steps_per_epoch=len(x) // GLOBAL_BATCH), dict(steps=-(-len(xe) // GLOBAL_BATCH))
        history = model.fit(train, **fit, **(steps[0] if steps else {}))
        got = model.evaluate(test, verbose=0, return_dict=True, **(steps[1] if steps else {}))

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


@pytest.mark.parametrize("optimizer", ["sgd", "legacy_sgd"])
def test_custom_training_loop_equals_single_process(eng, comm, optimizer):
    """TensorFlow's "Custom training with tf.distribute.Strategy" tutorial with tf_keras."""
    x, y = dataset_arrays(72, seed=2)

    def make(strategy):
        with strategy.scope():
            model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                      keras.layers.Dense(3)])
            opt = make_optimizer(optimizer)
            loss_object = keras.losses.SparseCategoricalCrossentropy(
                from_logits=True, reduction=keras.losses.Reduction.NONE)
            accuracy = keras.metrics.SparseCategoricalAccuracy()
        return model, opt, loss_object, accuracy

    def train(strategy, model, opt, loss_object, accuracy):
        def train_step(inputs):
            features, labels = inputs
            with tf.GradientTape() as tape:
                predictions = model(features, training=True)
                loss = tf.nn.compute_average_loss(loss_object(labels, predictions), global_batch_size=GLOBAL_BATCH)
            gradients = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(gradients, model.trainable_variables))
            accuracy.update_state(labels, predictions)
            return loss

        @tf.function
        def distributed_train_step(batch):
            per_replica = strategy.run(train_step, args=(batch,))
            return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

        dist = strategy.experimental_distribute_dataset(
            tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH))
        losses, accuracies = [], []
        for _ in range(2):
            losses.append(float(np.mean([float(distributed_train_step(b)) for b in dist])))
            accuracies.append(float(accuracy.result()))
            accuracy.reset_state()
        return losses, accuracies

    strategy = mpidist.on_tensorflow.MultiWorkerMirroredStrategy.on_engine(eng, CommunicationOptions())
    parts = make(strategy)
    initial = parts[0].get_weights()
    losses, accuracies = train(strategy, *parts)

    def single_process():
        default = tf.distribute.get_strategy()
        ref = make(default)
        ref[0].set_weights(initial)
        return train(default, *ref), ref[0].get_weights()

    (ref_losses, ref_accuracies), ref_weights = on_chief(comm, single_process)
    assert_same_on_every_rank(comm, parts[0].get_weights())
    assert_close(parts[0].get_weights(), ref_weights)
    np.testing.assert_allclose(losses, ref_losses, rtol=TOL)
    np.testing.assert_allclose(accuracies, ref_accuracies, rtol=TOL)


CLIP_BATCH = 12  # a multiple of every tested size (1, 2, 3, 4)


@pytest.mark.parametrize("optimizer, clip, how", [
    ("sgd", "clipnorm", "fit"), ("legacy_sgd", "global_clipnorm", "fit"), ("sgd", "clipvalue", "apply_gradients"),
])
def test_clipping_acts_on_the_global_gradient(eng, comm, optimizer, clip, how):
    """tf_keras's optimizers (current and legacy) sum the replicas' gradients before they clip: equal
    to one process on the same global batches, in fit and in a custom loop."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4 * CLIP_BATCH, 8)).astype(np.float32)
    y = 5 * rng.normal(size=(len(x), 2)).astype(np.float32)

    def batch_loss(model, xb, yb):  # the mean squared error over the global batch, from one replica's rows
        return tf.reduce_sum(tf.reduce_mean(tf.square(model(xb) - yb), axis=-1)) / CLIP_BATCH

    def build(clipping):
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(2)])
        opt = keras.optimizers.legacy.SGD(0.1) if optimizer == "legacy_sgd" else keras.optimizers.SGD(0.1)
        if clipping is not None:
            setattr(opt, clipping, CLIPS[clipping])
        model.compile(opt, "mse")
        return model

    def train(model, strategy):
        if how == "fit":
            model.fit(x, y, batch_size=CLIP_BATCH, epochs=2, shuffle=False, verbose=0)
            return

        def replica_step(xb, yb):
            with tf.GradientTape() as tape:
                loss = batch_loss(model, xb, yb)
            grads = tape.gradient(loss, model.trainable_variables)
            model.optimizer.apply_gradients(zip(grads, model.trainable_variables))

        dataset = strategy.experimental_distribute_dataset(
            tf.data.Dataset.from_tensor_slices((x, y)).batch(CLIP_BATCH).repeat(2))
        step = tf.function(lambda xb, yb: strategy.run(replica_step, args=(xb, yb)))
        for xb, yb in dataset:
            step(xb, yb)

    strategy = mpidist.on_tensorflow.MultiWorkerMirroredStrategy.on_engine(eng, CommunicationOptions())
    with strategy.scope():
        model = build(clip)
    initial = model.get_weights()
    train(model, strategy)

    def one_process():
        reference = build(clip)  # no strategy
        reference.set_weights(initial)
        with tf.GradientTape() as tape:
            loss = batch_loss(reference, x[:CLIP_BATCH], y[:CLIP_BATCH])
        acts = clipping_acts(clip, tape.gradient(loss, reference.trainable_variables))
        train(reference, tf.distribute.get_strategy())
        return reference.get_weights(), acts
    expected, acts = on_chief(comm, one_process)
    assert acts, "the first step's gradient is not clipped: this test could not fail"
    assert_same_on_every_rank(comm, model.get_weights())
    assert_close(model.get_weights(), expected)


def test_variables_created_in_scope_start_equal_and_metrics_are_global(eng, comm):
    strategy = mpidist.on_tensorflow.MultiWorkerMirroredStrategy.on_engine(eng, CommunicationOptions())
    tf.random.set_seed(eng.rank)  # a different initial draw on every rank: rank 0's must win
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
        metric = keras.metrics.Mean()
    assert_same_on_every_rank(comm, model.get_weights())
    values = tf.constant([eng.rank + 1.0] * (eng.rank + 1))

    @tf.function
    def update(v):
        strategy.run(metric.update_state, args=(v,))

    update(values)
    n = eng.size
    assert float(metric.result()) == pytest.approx(sum((r + 1) ** 2 for r in range(n)) / sum(r + 1 for r in range(n)))


def test_predict_returns_every_row_in_order(eng, comm):
    """As with Keras 3 (test_keras_predict.py): every rank gets all rows, in input order, with a short
    last batch, from arrays and from a dataset."""
    strategy = mpidist.on_tensorflow.MultiWorkerMirroredStrategy.on_engine(eng, CommunicationOptions())
    x, _ = dataset_arrays(70, seed=4)
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(3)])
    want = on_chief(comm, lambda: model(x).numpy())
    for got in (model.predict(x, batch_size=GLOBAL_BATCH, verbose=0),
                model.predict(tf.data.Dataset.from_tensor_slices(x).batch(GLOBAL_BATCH), verbose=0)):
        assert_float32_close(got, want)  # batches split over the ranks, against all 70 rows at once


ROWS, EPOCHS = 70, 3  # a short last batch of 10


class Recorder(keras.Sequential):
    """Records the row ids (feature 0) of every batch this rank trains on (run eagerly)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen = []

    def train_step(self, data):
        self.seen.append(data[0][:, 0].numpy().astype(np.int64))
        return super().train_step(data)


@pytest.mark.parametrize("source", ["arrays", "dataset"])
def test_unseeded_shuffles_agree_across_ranks(eng, comm, source):
    """fit(shuffle=True) on arrays and dataset.shuffle(n) without a seed: in every epoch the ranks
    train on disjoint parts of one global permutation, a new one every epoch (as one process)."""
    tf.random.set_seed(None)  # a program without a global seed (else TensorFlow's seeds agree anyway)
    strategy = mpidist.on_tensorflow.MultiWorkerMirroredStrategy.on_engine(eng, CommunicationOptions())
    x = np.stack([np.arange(ROWS), np.ones(ROWS)], axis=1).astype(np.float32)
    y = np.zeros((ROWS, 1), np.float32)
    with strategy.scope():
        model = Recorder([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse", run_eagerly=True)
    if source == "arrays":
        model.fit(x, y, batch_size=GLOBAL_BATCH, shuffle=True, epochs=EPOCHS, verbose=0)
    else:
        model.fit(tf.data.Dataset.from_tensor_slices((x, y)).shuffle(ROWS).batch(GLOBAL_BATCH), epochs=EPOCHS,
                  verbose=0)
    steps = len(model.seen) // EPOCHS
    everyone = comm.allgather(model.seen)
    orders = [[row for step in range(e * steps, (e + 1) * steps) for rank in everyone for row in rank[step]]
              for e in range(EPOCHS)]
    for order in orders:
        assert sorted(order) == list(range(ROWS)), order  # every row exactly once: disjoint, complete
    assert len({tuple(o) for o in orders}) == EPOCHS and orders[0] != list(range(ROWS)), orders


class _ChiefVariables(keras.callbacks.Callback):
    """Creates variables on the chief alone at each epoch's end (tf_keras's fit runs callbacks inside
    the strategy's scope): a tf.Variable and a legacy optimizer's, and counts with them."""

    def __init__(self, comm):
        super().__init__()
        self.rank, self.size, self.counts = comm.Get_rank(), comm.Get_size(), []

    def on_epoch_end(self, epoch, logs=None):
        if self.rank == 0:
            count = tf.Variable(float(epoch))
            count.assign_add(tf.cast(keras.optimizers.legacy.SGD(1.0).iterations, tf.float32) + 1)  # made here
            self.counts.append(float(count.numpy()))
            if self.size > 1:  # one rank: mpidist is TensorFlow's own (a mirrored variable)
                assert not isinstance(count, tf.distribute.DistributedValues)  # this rank's own


def test_model_checkpoint_and_tensorboard_write_once(eng, comm, shared_dir):
    """tf_keras's own multi-worker file handling (non-chiefs write to a temporary directory named by
    ``extended._task_id``, then remove it) works under an mpidist strategy: the chief's files only.
    A callback that creates variables on the chief alone does not stop the others."""
    strategy = mpidist.on_tensorflow.MultiWorkerMirroredStrategy.on_engine(eng, CommunicationOptions())
    x, y = dataset_arrays(36, seed=5)
    with strategy.scope():
        model = build_model("sgd")
    chief_variables = _ChiefVariables(comm)
    callbacks = [keras.callbacks.ModelCheckpoint(os.path.join(shared_dir, "model-{epoch}.h5")),
                 keras.callbacks.TensorBoard(os.path.join(shared_dir, "logs")), chief_variables]
    model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=2, verbose=0, callbacks=callbacks)
    assert chief_variables.counts == ([1.0, 2.0] if comm.Get_rank() == 0 else [])
    comm.Barrier()
    assert sorted(os.listdir(shared_dir)) == ["logs", "model-1.h5", "model-2.h5"]
    restored = keras.models.load_model(os.path.join(shared_dir, "model-2.h5"))
    assert_close(restored.get_weights(), model.get_weights(), tol=0)


def test_model_built_in_scope_keeps_its_strategy_outside_it(eng, comm):
    """A tf_keras model keeps its strategy as ``_distribution_strategy`` (Keras 3:
    ``_distribute_strategy``): mpidist's save coordination finds it outside the scope too, directly
    and through a tf.train.Checkpoint holding the model."""
    from mpidist.tensorflow import owners
    strategy = mpidist.on_tensorflow.MultiWorkerMirroredStrategy.on_engine(eng, CommunicationOptions())
    with strategy.scope():
        model = build_model("sgd")
    expected = strategy if comm.Get_size() > 1 else None  # one rank: nothing to coordinate
    assert owners.model_strategy(model) is expected
    assert owners.built_under(model) is strategy
    assert owners.tracked_strategy(tf.train.Checkpoint(model=model)) is expected


def test_csv_logger_rows_written_once(eng, comm, shared_dir):
    """tf_keras's CSVLogger on every rank, appending to one file: the chief writes (one header, one
    row per epoch), the other ranks write nothing there."""
    strategy = mpidist.on_tensorflow.MultiWorkerMirroredStrategy.on_engine(eng, CommunicationOptions())
    x, y = dataset_arrays(36, seed=6)
    with strategy.scope():
        model = build_model("sgd")
    path = os.path.join(shared_dir, "log.csv")
    model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=3, verbose=0,
              callbacks=[keras.callbacks.CSVLogger(path, append=True)])
    comm.Barrier()
    with open(path) as f:
        lines = f.read().splitlines()
    assert lines[0].startswith("epoch") and [ln.split(",")[0] for ln in lines[1:]] == ["0", "1", "2"], lines


def fitted_model(eng, seed):
    """A model built, compiled (with metrics: Keras 2 saves their sync-on-read variables) and fitted
    under a multi-worker strategy."""
    strategy = mpidist.on_tensorflow.MultiWorkerMirroredStrategy.on_engine(eng, CommunicationOptions())
    x, y = dataset_arrays(36, seed=seed)
    with strategy.scope():
        model = build_model("sgd")
    model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=1, verbose=0)
    return strategy, model


@pytest.mark.parametrize("name, how", [
    ("saved_model", "save"),  # Keras 2's default: a SavedModel directory
    ("model.h5", "save"), ("model.keras", "save"), ("keras_save_model.keras", "save_model"),
    ("weights.weights.h5", "save_weights"), ("weights.h5", "save_weights"),
    ("weights", "save_weights"),  # a TensorFlow checkpoint prefix
    ("tf_saved_model", "tf.saved_model.save"),  # holds the compiled metrics too (it hung: the chief read them alone)
])
def test_every_rank_saving_one_path_writes_it_once(eng, comm, shared_dir, name, how):
    """``model.save`` / ``save_weights`` / ``tf.keras.models.save_model`` / ``tf.saved_model.save`` on
    every rank to one path (TensorFlow's own code makes every rank write it: SavedModel directories
    and HDF5 files then collide): the chief writes it, the others return once it is complete; the
    files load, in the strategy's scope too, to the saved weights."""
    strategy, model = fitted_model(eng, seed=7)
    path = os.path.join(shared_dir, name)
    {"save": model.save, "save_weights": model.save_weights,
     "save_model": lambda p: keras.models.save_model(model, p),
     "tf.saved_model.save": lambda p: tf.saved_model.save(model, p)}[how](path)
    assert os.path.exists(path if how != "save_weights" or "." in name else path + ".index")
    if how == "tf.saved_model.save":  # no Keras metadata: TensorFlow's loader, the serving signature
        x = dataset_arrays(4, seed=1)[0]
        (got,) = tf.saved_model.load(path).signatures["serving_default"](tf.constant(x)).values()
        assert_float32_close(got.numpy(), model(x, training=False).numpy())  # a saved graph against eager
    else:
        expected = model.get_weights()
        with strategy.scope():
            if how == "save_weights":
                loaded = build_model("sgd")
                loaded.load_weights(path)
            else:
                loaded = keras.models.load_model(path)
        assert_close(loaded.get_weights(), expected, tol=0)
    comm.Barrier()
    assert not [f for f in os.listdir(shared_dir) if "mpidist-tmp" in f]


def test_every_rank_saving_a_model_not_yet_fitted(eng, comm, shared_dir):
    """A compiled model before its first fit: ``model.metrics`` lists nothing yet, but the SavedModel
    holds the loss metric ``compile`` made (sync-on-read): it is aggregated before the chief writes
    (it was read by the chief alone, which then waited forever)."""
    strategy = mpidist.on_tensorflow.MultiWorkerMirroredStrategy.on_engine(eng, CommunicationOptions())
    with strategy.scope():
        model = build_model("sgd")
    path = os.path.join(shared_dir, "unfitted")
    model.save(path)
    with strategy.scope():
        loaded = keras.models.load_model(path)
    assert_close(loaded.get_weights(), model.get_weights(), tol=0)


def test_a_save_on_the_chief_alone_is_an_error_on_every_rank(eng, comm, shared_dir):
    """Keras 2 saves a compiled model's metrics, whose saved value is their sum over ranks: a
    ``model.save`` on the chief alone cannot work; it raises on the chief naming the rule and the
    others' next collective raises the same mismatch, instead of the chief waiting alone; the ranks
    are then in step. With one rank the save simply works."""
    from mpidist.errors import CollectiveMismatchError
    strategy, model = fitted_model(eng, seed=8)
    path = os.path.join(shared_dir, "chief.keras")
    if comm.Get_size() == 1:
        model.save(path)
        assert os.path.exists(path)
        return
    if comm.Get_rank() == 0:
        with pytest.raises(ValueError, match="call this save on every rank"):
            model.save(path)
    else:
        with pytest.raises(CollectiveMismatchError, match="save of sync-on-read variables: every rank must make it"):
            strategy.reduce("SUM", tf.ones([2]), axis=None)
    assert not os.path.exists(path)
    total = strategy.reduce("SUM", tf.fill([2], float(comm.Get_rank() + 1)), axis=None)
    np.testing.assert_array_equal(total.numpy(), [comm.Get_size() * (comm.Get_size() + 1) / 2] * 2)


class _Interrupt(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        if epoch == 2:
            raise RuntimeError("interrupted at epoch 2")


@pytest.mark.parametrize("save_freq", ["epoch", 2])
def test_backup_and_restore_resumes_where_training_stopped(eng, comm, shared_dir, save_freq):
    """tf_keras's BackupAndRestore (it refuses strategies other than TensorFlow's; mpidist's are
    accepted): training interrupted on every rank at the start of epoch 2 resumes there and ends
    with the weights of one process's uninterrupted training; the backup is removed at the end."""
    strategy = mpidist.on_tensorflow.MultiWorkerMirroredStrategy.on_engine(eng, CommunicationOptions())
    x, y = dataset_arrays(72, seed=9)
    with strategy.scope():
        model = build_model("sgd")
    initial = model.get_weights()
    backup = os.path.join(shared_dir, "backup")
    fit = dict(batch_size=GLOBAL_BATCH, epochs=4, verbose=0, shuffle=False)
    with pytest.raises(RuntimeError, match="interrupted at epoch 2"):
        model.fit(x, y, **fit, callbacks=[keras.callbacks.BackupAndRestore(backup, save_freq=save_freq), _Interrupt()])
    assert os.listdir(os.path.join(backup, "chief"))
    history = model.fit(x, y, **fit, callbacks=[keras.callbacks.BackupAndRestore(backup, save_freq=save_freq)])
    assert history.epoch == [2, 3]

    def single_process():
        reference = build_model("sgd")
        reference.set_weights(initial)
        reference.fit(x, y, **fit)
        return reference.get_weights()

    assert_same_on_every_rank(comm, model.get_weights())
    assert_close(model.get_weights(), on_chief(comm, single_process))
    comm.Barrier()
    assert not os.path.exists(os.path.join(backup, "chief"))
