"""Keras's saving functions under an mpidist strategy of several ranks, and atomic writes.

``model.save`` / ``keras.saving.save_model`` and ``model.save_weights`` /
``keras.saving.save_weights`` of a model built under such a strategy go through
``mpidist.tensorflow.checkpoint.save_once``: whichever ranks call them (every rank to one path, every
rank to a path of its own as in TensorFlow's multi-worker tutorial, or the chief alone), each path is
written once, by one rank, and a rank that saves the chief's path returns once the chief's file is
complete. Every such write is atomic (``mpidist.files.write_atomically``: a temporary name in the
same directory, fsync'ed, then renamed), so a reader never sees a half-written file and a write
killed midway leaves the previous file intact.
"""
from __future__ import annotations

import os
from typing import Any, Callable

from .. import files
from ..tensorflow import checkpoint
from . import patching

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


def _saving(kind: str) -> Callable[[Any], Callable[..., Any]]:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def save(model: Any, filepath: Any, *args: Any, **kwargs: Any) -> Any:
            strategy = patching.model_strategy(model)
            if strategy is None or not isinstance(filepath, (str, os.PathLike)):
                return original(model, filepath, *args, **kwargs)

            def write() -> Any:
                return write_atomically(filepath, lambda tmp: original(model, tmp, *args, **kwargs))

            if checkpoint.inside_save():  # a callback's save: the callback decided who writes
                return write()
            return checkpoint.save_once(strategy, kind, filepath, write)[0]
        return save
    return make


def install() -> None:
    import keras
    from keras.src.saving import saving_api
    save_model, save_weights = _saving("keras.saving.save_model"), _saving("keras.saving.save_weights")
    patching.patch(saving_api, "save_model", save_model)  # what Model.save calls
    patching.patch(saving_api, "save_weights", save_weights)  # what Model.save_weights calls
    for namespace, name, make in ((keras.saving, "save_model", save_model), (keras.models, "save_model", save_model),
                                  (keras.saving, "save_weights", save_weights)):
        if getattr(namespace, name, None) is patching.original(saving_api, name):
            patching.patch(namespace, name, make)
