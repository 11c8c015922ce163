"""Every private Keras / TensorFlow name mpidist relies on still exists in the installed release.

The tables are ``mpidist.keras.patching.KERAS_PRIVATE`` (Keras 3 ``keras``, Keras 2 ``tf_keras``)
and ``mpidist.tensorflow._tf_private.TF_PRIVATE``: class -> names mpidist reads, writes, calls
or overrides. A release that renames or drops one fails here, naming the class, the symbol and
the version, instead of breaking a training run (or, for an override, silently not calling it).
Names that are instance attributes (set in ``__init__`` or ``build``) are looked up on a sample
instance made by SAMPLES.
"""
from __future__ import annotations

import importlib

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from mpidist.keras import patching  # noqa: E402
from mpidist.tensorflow import _tf_private  # noqa: E402

_TF = "tensorflow.python."


def _backup_and_restore(tmp_path):
    return keras.callbacks.BackupAndRestore(backup_dir=str(tmp_path / "backup"))


def _array_data_adapter(tmp_path):
    from keras.src.trainers.data_adapters.array_data_adapter import ArrayDataAdapter
    return ArrayDataAdapter(np.zeros((4, 1), "float32"), np.zeros((4, 1), "float32"), batch_size=2, shuffle=True)


def _batch_normalization(tmp_path):
    layer = keras.layers.BatchNormalization()
    layer.build((None, 3))
    return layer


def _keras_optimizer(tmp_path):
    optimizer = keras.optimizers.SGD()
    optimizer.build([keras.Variable(np.zeros(2, "float32"))])
    return optimizer


def _keras_model(tmp_path):
    return keras.Sequential([keras.layers.Dense(1)])


def _tf_keras_model(tmp_path):
    import tf_keras
    return tf_keras.Sequential([tf_keras.layers.Dense(1)])


def _tf_keras_backup_and_restore(tmp_path):
    import tf_keras
    return tf_keras.callbacks.BackupAndRestore(backup_dir=str(tmp_path / "tf_keras_backup"))


def _mirrored_variable(tmp_path):
    with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
        return tf.Variable(1.0)


def _tf_function(tmp_path):
    return tf.function(lambda x: x, jit_compile=True)


def _checkpoint_manager(tmp_path):
    return tf.train.CheckpointManager(tf.train.Checkpoint(), str(tmp_path / "ckpt"), max_to_keep=1)


SAMPLES = {  # class (a table's key) -> an instance of it, for the names set on instances
    "keras.src.callbacks.backup_and_restore.BackupAndRestore": _backup_and_restore,
    "keras.src.trainers.data_adapters.array_data_adapter.ArrayDataAdapter": _array_data_adapter,
    "keras.src.layers.normalization.batch_normalization.BatchNormalization": _batch_normalization,
    "keras.src.optimizers.base_optimizer.BaseOptimizer": _keras_optimizer,
    "keras.src.backend.tensorflow.trainer.TensorFlowTrainer": _keras_model,
    "tf_keras.src.engine.training.Model": _tf_keras_model,
    "tf_keras.src.callbacks.BackupAndRestore": _tf_keras_backup_and_restore,
    _TF + "distribute.values.DistributedValues": _mirrored_variable,
    _TF + "distribute.values.DistributedVariable": _mirrored_variable,
    _TF + "checkpoint.checkpoint_management.CheckpointManager": _checkpoint_manager,
    _TF + "eager.polymorphic_function.polymorphic_function.Function": _tf_function,
}


def _version(path):
    package = path.split(".")[0]
    module = importlib.import_module(package)
    return f"{package} {getattr(module, '__version__', '?')}"


def missing_names(table, tmp_path):
    """``class.name (version)`` for every entry of ``table`` that the installed release lacks."""
    missing = []
    for path, names in table.items():
        if path.startswith("tf_keras.") and importlib.util.find_spec("tf_keras") is None:
            continue  # Keras 2 is optional
        module_name, class_name = path.rsplit(".", 1)
        try:
            cls = getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError) as error:
            missing.append(f"{path} (the class itself: {type(error).__name__}: {error}; {_version(path)})")
            continue
        defined_as = f"{cls.__module__}.{cls.__qualname__}"
        if defined_as != path:  # the accessors look classes up by where they are defined
            missing.append(f"{path} (the class is now defined as {defined_as}; {_version(path)})")
            continue
        absent = [name for name in names if not hasattr(cls, name)]
        if absent and path in SAMPLES:
            instance = SAMPLES[path](tmp_path)
            assert isinstance(instance, cls), (path, type(instance))
            absent = [name for name in absent if not hasattr(instance, name)]
        missing.extend(f"{path}.{name} ({_version(path)})" for name in absent)
    return missing


def test_every_private_keras_name_exists(tmp_path):
    missing = missing_names(patching.KERAS_PRIVATE, tmp_path)
    assert not missing, ("private Keras names mpidist relies on are gone from the installed Keras "
                         "(see mpidist/keras/patching.py, KERAS_PRIVATE):\n" + "\n".join(missing))


def test_every_private_tensorflow_name_exists(tmp_path):
    missing = missing_names(_tf_private.TF_PRIVATE, tmp_path)
    assert not missing, ("private TensorFlow names mpidist relies on are gone from the installed TensorFlow "
                         "(see mpidist/tensorflow/_tf_private.py, TF_PRIVATE):\n" + "\n".join(missing))


def test_the_check_names_a_missing_symbol(tmp_path):
    table = {"keras.src.callbacks.tensorboard.TensorBoard": ("_close_writers", "_no_such_name"),
             "keras.src.callbacks.no_such_module.Gone": ("_x",),
             "keras.callbacks.TensorBoard": ("_close_writers",),  # a re-export, not where it is defined
             "keras.src.callbacks.backup_and_restore.BackupAndRestore": ("_training_metadata_path", "_gone_too")}
    missing = missing_names(table, tmp_path)
    assert len(missing) == 4, missing
    assert missing[0] == f"keras.src.callbacks.tensorboard.TensorBoard._no_such_name (keras {keras.__version__})"
    assert "keras.src.callbacks.no_such_module.Gone (the class itself" in missing[1]
    assert "keras.callbacks.TensorBoard (the class is now defined as keras.src.callbacks.tensorboard" in missing[2]
    assert missing[3] == ("keras.src.callbacks.backup_and_restore.BackupAndRestore._gone_too "
                          f"(keras {keras.__version__})")  # looked up on a sample instance too


def test_accessors_read_write_call_and_name_what_is_missing(tmp_path):
    callback = _backup_and_restore(tmp_path)
    path = patching.get_private(callback, "_training_metadata_path")
    patching.set_private(callback, "_training_metadata_path", "elsewhere")
    assert patching.get_private(callback, "_training_metadata_path") == "elsewhere"
    patching.set_private(callback, "_training_metadata_path", path)
    board = keras.callbacks.TensorBoard(log_dir=str(tmp_path / "logs"))
    patching.call_private(board, "_close_writers")  # nothing open: a no-op
    with pytest.raises(AttributeError, match=r"_load_model of keras\.src\.callbacks\.tensorboard\.TensorBoard "
                                             r"is not in patching\.KERAS_PRIVATE"):
        patching.get_private(board, "_load_model")  # not listed for this class
    del callback._prev_training_metadata_path  # as if this Keras had dropped it
    with pytest.raises(AttributeError, match=rf"this Keras \(keras {keras.__version__}\) has no keras\.src\.callbacks"
                                             r"\.backup_and_restore\.BackupAndRestore\._prev_training_metadata_path"):
        patching.get_private(callback, "_prev_training_metadata_path")


def test_super_reaches_the_keras_method(tmp_path):
    class Layer(keras.layers.BatchNormalization):
        def _moments(self, inputs, mask):
            return patching.call_private(super(), "_moments", inputs, mask)

    layer = Layer()
    layer.build((None, 3))
    x = np.arange(6, dtype="float32").reshape(2, 3)
    mean, variance = layer._moments(tf.constant(x), None)
    np.testing.assert_allclose(mean, x.mean(axis=0))
    np.testing.assert_allclose(variance, x.var(axis=0))


def test_tf_accessors(tmp_path):
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    assert _tf_private.container_strategy(strategy.extended) is strategy
    manager = _checkpoint_manager(tmp_path)
    _tf_private.set_latest_checkpoint(manager, "somewhere-1")
    assert manager.latest_checkpoint == "somewhere-1"
