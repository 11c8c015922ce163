"""Keras callbacks that write files, under an mpidist strategy, with unchanged user code: one
writer (the chief), atomic, readable by every rank when the callback returns, errors on every rank;
training equal to one process's. ``fit`` called inside ``strategy.scope()`` too (``in_scope``): what
a save or a callback creates there is the rank's own (no collective), so nothing waits for it."""
from __future__ import annotations

import contextlib
import glob
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from reference import same_everywhere  # noqa: E402

pytestmark = [pytest.mark.mpi, pytest.mark.two_nodes]
GLOBAL_BATCH = 16


def data(n: int = 64, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 8)).astype(np.float32)
    return x, (x[:, :3].sum(axis=1) > 0).astype(np.int64)


def build_model():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def no_temporary_files(directory):
    assert not [f for f in glob.glob(os.path.join(directory, "**", "*"), recursive=True) if "mpidist-tmp" in f]


class ChiefVariables(keras.callbacks.Callback):
    """Creates variables on the chief alone at each epoch's end: a tf.Variable and a Keras optimizer
    (what Keras's own saving code builds), and counts with them."""

    def __init__(self, comm):
        super().__init__()
        self.rank, self.size, self.counts = comm.Get_rank(), comm.Get_size(), []

    def on_epoch_end(self, epoch, logs=None):
        if self.rank == 0:
            count = tf.Variable(float(epoch))
            count.assign_add(keras.optimizers.SGD(1.0).learning_rate)
            self.counts.append(float(count.numpy()))
            if self.size > 1:  # one rank: mpidist is TensorFlow's own (a mirrored variable)
                assert not isinstance(count, tf.distribute.DistributedValues)  # this rank's own


def scope_if(strategy, in_scope):
    """``strategy.scope()`` when ``in_scope`` (fit called inside it, as TensorFlow's docs also do)."""
    return strategy.scope() if in_scope else contextlib.nullcontext()


@pytest.mark.parametrize("name, weights_only, best_only, save_freq, in_scope", [
    ("w.weights.h5", True, False, "epoch", True),
    ("m.keras", False, False, "epoch", False),
    ("best.keras", False, True, "epoch", True),
    ("e{epoch:02d}.weights.h5", True, True, "epoch", False),
    ("sub/dir/b.weights.h5", True, False, 3, True),  # every 3 batches (4 batches per epoch); directories made
])
def test_model_checkpoint(strategy, comm, shared_dir, name, weights_only, best_only, save_freq, in_scope):
    """Also with a callback that creates variables on the chief alone: nobody waits for them."""
    x, y = data()
    with strategy.scope():
        model = build_model()
    path = os.path.join(shared_dir, name)
    callback = keras.callbacks.ModelCheckpoint(path, monitor="loss", save_best_only=best_only,
                                               save_weights_only=weights_only, save_freq=save_freq)
    chief_variables = ChiefVariables(comm)
    with scope_if(strategy, in_scope):
        model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=3, shuffle=False, verbose=0,
                  callbacks=[callback, chief_variables])
    assert chief_variables.counts == ([1.0, 2.0, 3.0] if comm.Get_rank() == 0 else [])
    written = same_everywhere(comm, sorted(os.path.relpath(f, shared_dir)
                                           for f in glob.glob(os.path.join(shared_dir, "**", "*.*"), recursive=True)))
    assert written, "nothing written"
    no_temporary_files(shared_dir)
    same_everywhere(comm, None if callback.best is None else float(callback.best))
    newest = os.path.join(shared_dir, written[-1])
    with strategy.scope():  # every rank reads the chief's file
        if weights_only:
            loaded = build_model()
            loaded.load_weights(newest)
        else:
            loaded = keras.models.load_model(newest)
    if not best_only or callback.best == min(model.history.history["loss"]):  # the last epoch was the best
        for a, b in zip(loaded.get_weights(), model.get_weights()):
            np.testing.assert_array_equal(a, b)


def test_model_checkpoint_error_is_raised_on_every_rank(strategy, comm, shared_dir):
    blocker = os.path.join(shared_dir, "a-file")
    if comm.Get_rank() == 0:
        open(blocker, "w").close()
    comm.Barrier()
    x, y = data()
    with strategy.scope():
        model = build_model()
    callback = keras.callbacks.ModelCheckpoint(os.path.join(blocker, "w.weights.h5"), save_weights_only=True)
    with pytest.raises(Exception) as info:  # the chief's write fails; the others must not wait for it
        model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[callback])
    if comm.Get_rank() != 0:
        assert "rank 0 failed" in str(info.value)


def test_csv_logger_writes_once(strategy, comm, shared_dir):
    x, y = data(seed=2)
    with strategy.scope():
        model = build_model()
    csv = os.path.join(shared_dir, "log.csv")
    history = model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=3, shuffle=False, verbose=0,
                        callbacks=[keras.callbacks.CSVLogger(csv)])
    comm.Barrier()  # the chief has closed its file before fit returned
    with open(csv) as f:
        lines = f.read().splitlines()
    assert len(lines) == 1 + 3 and lines[0].startswith("epoch"), lines
    column = lines[0].split(",").index("loss")
    np.testing.assert_allclose([float(row.split(",")[column]) for row in lines[1:]], history.history["loss"],
                               rtol=1e-5)


def test_tensorboard_writes_once(strategy, comm, shared_dir):
    pytest.importorskip("tensorboard")
    x, y = data(seed=2)
    with strategy.scope():
        model = build_model()
    logs = os.path.join(shared_dir, "tb")
    model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=2, shuffle=False, verbose=0,
              callbacks=[keras.callbacks.TensorBoard(logs)])
    comm.Barrier()
    events = same_everywhere(comm, sorted(glob.glob(os.path.join(logs, "**", "events.*"), recursive=True)))
    assert [os.path.basename(os.path.dirname(e)) for e in events] == ["train"], events


def test_early_stopping_stops_every_rank_at_the_same_epoch(strategy, comm):
    x, y = data(seed=3)
    with strategy.scope():
        model = build_model()
    initial = model.get_weights()
    stop = dict(monitor="loss", min_delta=0.05, patience=1)
    callback = keras.callbacks.EarlyStopping(**stop)
    model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=50, shuffle=False, verbose=0, callbacks=[callback])

    def single():
        reference = build_model()
        reference.set_weights(initial)
        ref_callback = keras.callbacks.EarlyStopping(**stop)
        reference.fit(x, y, batch_size=GLOBAL_BATCH, epochs=50, shuffle=False, verbose=0, callbacks=[ref_callback])
        return ref_callback.stopped_epoch
    expected = comm.bcast(single() if comm.Get_rank() == 0 else None, root=0)
    assert 0 < expected < 49
    assert same_everywhere(comm, callback.stopped_epoch) == expected


def test_interrupted_write_keeps_the_previous_file(strategy, comm, shared_dir, monkeypatch):
    """The chief writes to a temporary name and renames: a write that fails before the rename leaves
    the previous checkpoint untouched and no temporary file, and every rank gets the error."""
    from mpidist.tensorflow.keras import files
    if comm.Get_size() == 1:
        pytest.skip("one rank: Keras's own write (the patches act for several ranks only)")
    x, y = data(seed=4)
    with strategy.scope():
        model = build_model()
    path = os.path.join(shared_dir, "w.weights.h5")
    callback = keras.callbacks.ModelCheckpoint(path, save_weights_only=True)
    model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[callback])
    with open(path, "rb") as f:
        before = f.read()
    if comm.Get_rank() == 0:
        def fail(src, dst):
            raise OSError(f"injected failure renaming {src}")
        monkeypatch.setattr(files.os, "replace", fail)
    with pytest.raises(Exception, match="injected failure"):
        model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[callback])
    monkeypatch.undo()
    comm.Barrier()
    with open(path, "rb") as f:
        assert f.read() == before
    no_temporary_files(shared_dir)


# -- Keras's own BackupAndRestore cases (keras/src/callbacks/backup_and_restore_test.py), on every rank

class Interrupting(keras.callbacks.Callback):
    def __init__(self, steps=None, epochs=None):
        super().__init__()
        self.steps, self.epochs, self.batch_count, self.epoch_count = steps, epochs, 0, 0

    def on_epoch_end(self, epoch, logs=None):
        self.epoch_count += 1
        if self.epochs is not None and self.epoch_count == self.epochs:
            raise RuntimeError("EpochInterruption")

    def on_batch_end(self, batch, logs=None):
        self.batch_count += 1
        if self.steps is not None and self.batch_count == self.steps:
            raise RuntimeError("StepsInterruption")


class Canary(keras.layers.Layer):
    """Counts the calls of the model (a non-trainable weight, saved with the backup)."""

    def __init__(self):
        super().__init__()
        self.counter = self.add_weight(shape=(), initializer="zeros", dtype="float32", trainable=False)

    def call(self, x):
        self.counter.assign_add(1)
        return x


def canary_model():
    model = keras.Sequential([keras.Input((3,)), Canary(), keras.layers.Dense(1)])
    model.compile(loss="mse", optimizer="sgd", metrics=["mse"])
    return model


def canary_data():
    rng = np.random.default_rng(5)  # the same on every rank; 10 rows as in Keras: batches 4, 4, 2
    return rng.random((10, 3)).astype(np.float32), rng.random((10, 1)).astype(np.float32)


@pytest.mark.parametrize("case, in_scope", [("step", True), ("step", False), ("epoch", True), ("corrupted", False)])
def test_keras_backup_and_restore_cases(strategy, comm, shared_dir, case, in_scope):
    """Interrupted on every rank (after 2 batches, or 2 epochs), resumed from the backup: the
    callback's counters and the model's state are Keras's single-process ones, on every rank; the
    backup is deleted at the end. (A job killed and launched again resumes to the weights of a
    straight run: tests/launch/test_keras_jobs.py.)"""
    backup = os.path.join(shared_dir, "subdir")
    x, y = canary_data()
    with strategy.scope():
        model = canary_model()
    if case == "step":
        cbk = keras.callbacks.BackupAndRestore(backup, save_freq=1)
        interrupt, epochs, done = Interrupting(steps=2), 2, (0, 2)
    else:
        cbk = keras.callbacks.BackupAndRestore(backup, save_freq="epoch", double_checkpoint=case == "corrupted")
        interrupt, epochs, done = Interrupting(epochs=2), 6, (2, 6)
    with pytest.raises(RuntimeError, match="Interruption"), scope_if(strategy, in_scope):
        model.fit(x, y, batch_size=4, callbacks=[cbk, interrupt], epochs=epochs, verbose=0)
    assert os.path.exists(backup)
    assert (cbk._current_epoch, int(model.layers[0].counter.value)) == done
    if case == "step":
        assert cbk._last_batch_seen == 1
    if case == "corrupted":
        assert os.path.exists(cbk._prev_weights_path) and os.path.exists(cbk._prev_training_metadata_path)
        comm.Barrier()
        if comm.Get_rank() == 0:
            with open(cbk._weights_path, "w") as f:
                f.write("0")
        comm.Barrier()
    with scope_if(strategy, in_scope):
        history = model.fit(x, y, batch_size=4, callbacks=[cbk], epochs=5, verbose=0)
    assert cbk._current_epoch == 5 and history.epoch[-1] == 4
    assert same_everywhere(comm, int(model.layers[0].counter.value)) == (17 if case == "step" else 15)
    assert not os.path.exists(backup)
