"""Keras's saving functions under an mpidist strategy of several ranks, and atomic writes.

``model.save`` / ``keras.saving.save_model`` and ``model.save_weights`` /
``keras.saving.save_weights`` of a model built under such a strategy go through
``mpidist.tensorflow.checkpoint.save_once``: whichever ranks call them (every rank to one path, every
rank to a path of its own as in TensorFlow's multi-worker tutorial, or the chief alone), each path is
written once, by one rank, and a rank that saves the chief's path returns once the chief's file is
complete. Every such write is atomic (``mpidist.files.write_atomically``: a temporary name in the
same directory, fsync'ed, then renamed), so a reader never sees a half-written file and a write
killed midway leaves the previous file intact.

Keras 2 (tf_keras, ``install_keras2``): its ``saving_api.save_model`` / ``save_weights`` (what
``Model.save`` / ``save_weights`` and ``tf.keras.models.save_model`` call) the same way, with two
differences of Keras 2's formats: a SavedModel directory or a TensorFlow checkpoint prefix (the
default when the name has no ``.keras`` / ``.h5`` ending) is written in place, by the one writer,
not atomically; and Keras 2 saves a compiled model's metrics, whose variables are sync-on-read, so
such a save must be made on every rank (each may name its own path, as TensorFlow's tutorial
does): saved by the chief alone it is an error on every rank naming that rule
(``mpidist.tensorflow.checkpoint``), where it used to leave the chief in a collective alone.
"""
from __future__ import annotations

import gc
import os
from typing import Any, Callable

from ... import files
from .. import checkpoint, owners, patching

# Keras picks the format from the file name's ending: keep it on the temporary name.
_ENDINGS = (".weights.h5", ".weights.json", ".keras", ".h5", ".hdf5", ".json")


def is_remote(path: str) -> bool:
    return "://" in str(path)


def temporary_name(path: str) -> str:
    """A name beside ``path``, unique to this process, with the same format ending."""
    base = os.path.basename(os.fspath(path))
    return files.temporary_name(path, next((e for e in _ENDINGS if base.endswith(e)), os.path.splitext(base)[1]))


def write_atomically(path: Any, write: Callable[[str], Any]) -> Any:
    """``write(temporary)`` then ``mpidist.files.write_atomically`` puts it at ``path`` (fsync'ed,
    renamed, the directory fsync'ed); remote paths: ``write(path)`` directly."""
    path = os.fspath(path)
    if is_remote(path):
        return write(path)
    return files.write_atomically(path, write, temporary=temporary_name(path))


def _saving(kind: str, keras2: bool = False) -> Callable[[Any], Callable[..., Any]]:
    """The patch of one saving function; ``keras2``: tf_keras's (see the module docstring)."""
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def save(model: Any, filepath: Any, *args: Any, **kwargs: Any) -> Any:
            strategy = owners.model_strategy(model)
            if strategy is None or not isinstance(filepath, (str, os.PathLike)):
                return original(model, filepath, *args, **kwargs)

            def write() -> Any:
                if keras2 and not _keras2_single_file(filepath, kwargs.get("save_format")):
                    return original(model, filepath, *args, **kwargs)  # a directory or a checkpoint prefix
                return write_atomically(filepath, lambda tmp: original(model, tmp, *args, **kwargs))

            if checkpoint.inside_save():  # a callback's save: the callback decided who writes
                return write()
            saved = keras2_saved_variables(strategy) if keras2 else None  # the model's included
            return checkpoint.save_once(strategy, kind, filepath, write, trackable=saved)[0]
        return save
    return make


def keras2_saved_variables(strategy: Any) -> list[Any]:
    """The sync-on-read variables a Keras 2 save may read: Keras 2 saves a compiled model's metrics,
    which are not checkpoint dependencies of the model, and ``model.metrics`` lists none before the
    first fit / evaluate (the loss metric ``compile`` made is saved all the same). So: every one
    of the strategy still alive, after a garbage collection so that every rank lists the same."""
    gc.collect()
    return strategy.extended.live_sync_on_read_variables()


def _keras2_single_file(filepath: Any, save_format: Any) -> bool:
    """Whether tf_keras writes ``filepath`` as one file (``.keras``, ``.h5``: named by its ending)."""
    return save_format in (None, "h5", "keras") and os.fspath(filepath).endswith((".keras", ".h5", ".hdf5"))


def install() -> None:
    from keras.src.saving import saving_api
    # what Model.save / save_weights call, and every public name of them (keras.saving, keras.models)
    patching.patch_function(saving_api, "save_model", _saving("keras.saving.save_model"), checked=patching.KERAS3,
                            reason='each path written once, atomically, whichever ranks save')
    patching.patch_function(saving_api, "save_weights", _saving("keras.saving.save_weights"), checked=patching.KERAS3,
                            reason='each path written once, atomically, whichever ranks save')


def install_keras2() -> None:
    saving_api = patching.tf_keras_internal("saving_api")
    # what Model.save / save_weights call, and every public name of them (tf_keras.models,
    # tf_keras.saving, and tf.keras's where tf.keras is tf_keras)
    patching.patch_function(saving_api, "save_model", _saving("keras.saving.save_model", keras2=True),
                            checked=patching.KERAS2, reason='each path written once, atomically, whichever ranks save')
    patching.patch_function(saving_api, "save_weights", _saving("keras.saving.save_weights", keras2=True),
                            checked=patching.KERAS2, reason='each path written once, atomically, whichever ranks save')
