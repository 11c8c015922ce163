"""tf.train.Checkpoint.save / write, CheckpointManager.save and tf.saved_model.save called by every
rank on one shared directory under an mpidist strategy: one writer, the same path on every rank,
restorable everywhere (without the patch the ranks race: NotFoundError on ckpt-1_temp, or in
MergeV2Checkpoints for a SavedModel)."""
from __future__ import annotations

import importlib
import os
import shutil
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from keras.saving import save_model  # noqa: E402  (bound before any strategy exists: see the last test)

from mpidist.tensorflow import checkpoint  # noqa: E402
from reference import assert_float32_close, same_everywhere  # noqa: E402

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("in_scope", [True, False])
def test_every_rank_saves_one_checkpoint(strategy, comm, shared_dir, in_scope):
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
        model.compile(optimizer="adam", loss="mse")
    model.fit(np.ones((8, 4)), np.zeros((8, 3)), batch_size=8, verbose=0)
    ckpt = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
    prefix = os.path.join(shared_dir, "ckpt")
    paths = []
    for _ in range(3):
        if in_scope:
            with strategy.scope():
                paths.append(ckpt.save(prefix))
        else:  # as in TensorFlow's custom-loop tutorial: outside the scope
            paths.append(ckpt.save(prefix))
    assert same_everywhere(comm, paths) == [f"{prefix}-{i}" for i in (1, 2, 3)]
    assert int(ckpt.save_counter.numpy()) == 3
    assert tf.train.latest_checkpoint(shared_dir) == paths[-1]
    written = same_everywhere(comm, ckpt.write(os.path.join(shared_dir, "plain")))
    saved = [v.numpy() for v in model.variables]
    for v in model.variables:
        v.assign(tf.zeros_like(v))
    ckpt.restore(written).expect_partial()
    for v, expected in zip(model.variables, saved):
        np.testing.assert_array_equal(v.numpy(), expected)
    assert not [f for f in os.listdir(shared_dir) if "temp" in f]


def test_checkpoint_manager_on_every_rank(strategy, comm, shared_dir):
    with strategy.scope():
        v = tf.Variable([1.0, 2.0])
    ckpt = tf.train.Checkpoint(v=v)
    with strategy.scope():
        manager = tf.train.CheckpointManager(ckpt, shared_dir, max_to_keep=2)
        paths = [manager.save() for _ in range(4)]
    assert same_everywhere(comm, paths)[-1].endswith("ckpt-4")
    assert manager.latest_checkpoint == paths[-1]
    kept = same_everywhere(comm, sorted(f for f in os.listdir(shared_dir) if f.endswith(".index")))
    assert kept == ["ckpt-3.index", "ckpt-4.index"]  # the chief swept the old ones


def test_unrelated_checkpoint_is_tensorflows_own(strategy, comm):
    """A checkpoint of nothing built under the strategy, saved outside its scope: each rank its own."""
    private = tempfile.mkdtemp(prefix=f"mpidist-own-{comm.Get_rank()}-")
    try:
        ckpt = tf.train.Checkpoint(v=tf.Variable(float(comm.Get_rank())))
        path = ckpt.save(os.path.join(private, "own"))
        assert path.startswith(private) and os.path.exists(path + ".index")
    finally:
        shutil.rmtree(private, ignore_errors=True)


class _Scaler(tf.Module):
    def __init__(self):
        super().__init__()
        self.scale = tf.Variable(tf.random.normal([3]))  # rank 0's draw, broadcast at creation

    @tf.function(input_signature=[tf.TensorSpec([3])])
    def __call__(self, x):
        return x * self.scale


@pytest.mark.parametrize("what", ["module", "keras_model", "keras_export"])
def test_saved_model_saved_by_every_rank_to_one_directory(strategy, comm, shared_dir, what):
    """``tf.saved_model.save`` (and Keras 3's ``model.export``, which calls it) on every rank to one
    directory: written once, by the chief; it loads on every rank, in the strategy's scope too."""
    path = os.path.join(shared_dir, "exported")
    x = np.arange(3, dtype=np.float32)
    if what == "module":
        with strategy.scope():
            obj = _Scaler()
        expected = (x * obj.scale.numpy()).tolist()
        tf.saved_model.save(obj, path)
    else:
        with strategy.scope():
            obj = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
            obj.compile(optimizer="sgd", loss="mse", metrics=["mae"])
        obj.fit(np.ones((8, 3)), np.zeros((8, 2)), batch_size=8, verbose=0)
        expected = obj(x[None]).numpy().ravel().tolist()
        if what == "keras_model":
            tf.saved_model.save(obj, path)
        else:
            obj.export(path, verbose=False)
    assert os.path.exists(os.path.join(path, "saved_model.pb"))
    for in_scope in (True, False):
        if in_scope:
            with strategy.scope():
                loaded = tf.saved_model.load(path)
        else:
            loaded = tf.saved_model.load(path)
        if what == "module":
            got = loaded(x)
        elif what == "keras_model":
            got = loaded.signatures["serving_default"](tf.constant(x[None]))["output_0"]
        else:
            got = loaded.serve(x[None])
        got = got.numpy().ravel().tolist()
        assert_float32_close(same_everywhere(comm, got), expected)  # a saved graph against eager
    comm.Barrier()
    assert not [f for f in os.listdir(shared_dir) if "temp" in f or "mpidist-tmp" in f]


def test_saved_model_saved_by_the_chief_alone(strategy, comm, shared_dir):
    """``if chief: tf.saved_model.save(...)``: the chief writes without waiting for anyone."""
    with strategy.scope():
        obj = _Scaler()
    path = os.path.join(shared_dir, "chief")
    if comm.Get_rank() == 0:
        tf.saved_model.save(obj, path)
    comm.Barrier()
    loaded = tf.saved_model.load(path)
    np.testing.assert_array_equal(loaded.scale.numpy(), obj.scale.numpy())


@pytest.fixture
def writes(monkeypatch):
    """The kinds of save this rank wrote itself through ``checkpoint.save_once`` in the test."""
    wrote = []
    real = checkpoint.save_once

    def spy(strategy, kind, path, write, **kwargs):
        return real(strategy, kind, path, lambda: (wrote.append(kind), write())[1], **kwargs)

    monkeypatch.setattr(checkpoint, "save_once", spy)
    return wrote


def assert_written_by_the_chief_alone(comm, writes, kind):
    everyone, size = comm.allgather(writes), comm.Get_size()
    assert everyone == ([[kind]] + [[]] * (size - 1) if size > 1 else [[]]), everyone  # one rank: plain Keras


@pytest.mark.parametrize("what", ["keras_export", "module"])
def test_saved_model_written_once_after_a_second_copy_of_its_module(strategy, comm, shared_dir, writes, what):
    """``from tensorflow.saved_model.experimental import ...`` (what Keras 3's ``model.export`` runs, and
    what programs write) imports a second copy of ``tf.saved_model`` that replaces the first: every
    rank's save still goes through mpidist's one writer, the chief (before: the copy was TensorFlow's
    own save, every rank wrote the directory, and the ranks sometimes raced in MergeV2Checkpoints)."""
    importlib.import_module("tensorflow.saved_model.experimental")
    path = os.path.join(shared_dir, "exported")
    with strategy.scope():
        obj = _Scaler() if what == "module" else keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    if what == "module":
        tf.saved_model.save(obj, path)
    else:
        obj.export(path, verbose=False)
    assert_written_by_the_chief_alone(comm, writes, "tf.saved_model.save")
    assert os.path.exists(os.path.join(path, "saved_model.pb"))


def test_save_model_bound_by_name_before_the_strategy_existed(strategy, comm, shared_dir, writes):
    """``from keras.saving import save_model`` at the top of a program (this file does), before any
    strategy was built, binds Keras's own function; mpidist's wrapper reaches that name too, so every
    rank's ``save_model(model, path)`` is written once, by the chief."""
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    path = os.path.join(shared_dir, "model.keras")
    save_model(model, path)
    assert_written_by_the_chief_alone(comm, writes, "keras.saving.save_model")
    loaded = keras.saving.load_model(path)
    for got, want in zip(loaded.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(got, want)
