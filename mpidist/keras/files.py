"""Atomic writes of Keras models: to a temporary name in the same directory, then renamed.

``model.save(path)`` and ``model.save_weights(path)`` are patched to write atomically while
``atomic_saves()`` is active (the chief's writes inside mpidist's callback patches): a reader never
sees a half-written file, and a write killed midway leaves the previous file intact. Outside that
block they are Keras's own.
"""
from __future__ import annotations

import contextlib
import contextvars
import os
from typing import Any, Callable, Iterator

from . import patching

_ATOMIC = contextvars.ContextVar("mpidist_keras_atomic_saves", default=False)
# Keras picks the format from the file name's ending: keep it on the temporary name.
_ENDINGS = (".weights.h5", ".weights.json", ".keras", ".h5", ".hdf5", ".json")


def is_remote(path: str) -> bool:
    return "://" in str(path)


def temporary_name(path: str) -> str:
    """A name beside ``path``, unique to this process, with the same format ending."""
    path = os.fspath(path)
    folder, base = os.path.split(path)
    ending = next((e for e in _ENDINGS if base.endswith(e)), os.path.splitext(base)[1])
    stem = base[: len(base) - len(ending)] if ending else base
    return os.path.join(folder, f".{stem}.mpidist-tmp-{os.getpid()}{ending}")


def write_atomically(path: Any, write: Callable[[str], Any]) -> Any:
    """``write(temporary)`` then rename it to ``path`` (remote paths: ``write(path)`` directly)."""
    path = os.fspath(path)
    if is_remote(path):
        return write(path)
    tmp = temporary_name(path)
    try:
        result = write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return result


@contextlib.contextmanager
def atomic_saves() -> Iterator[None]:
    token = _ATOMIC.set(True)
    try:
        yield
    finally:
        _ATOMIC.reset(token)


def _atomic(original: Callable[..., Any]) -> Callable[..., Any]:
    def method(self: Any, filepath: Any, *args: Any, **kwargs: Any) -> Any:
        if not _ATOMIC.get() or not isinstance(filepath, (str, os.PathLike)):
            return original(self, filepath, *args, **kwargs)
        return write_atomically(filepath, lambda tmp: original(self, tmp, *args, **kwargs))
    return method


def install() -> None:
    from keras.src.models.model import Model
    patching.patch(Model, "save", _atomic)
    patching.patch(Model, "save_weights", _atomic)
