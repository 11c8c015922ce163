"""Checkpoints for NumPy state: one writer per path, the write is atomic, every rank restores
the same state.

``save(state, path, strategy)``: the writer writes the nest of arrays with
``mpidist.files.write_atomically`` (a temporary file next to ``path``, fsync'ed, renamed over it,
the directory fsync'ed), so a save interrupted at any point leaves the previous checkpoint intact. Call it on every
rank or on the chief alone (``if rank == 0``): the chief writes and never waits; another rank that
saves the chief's path at the same point returns once the chief's file is complete (raising the
chief's error if its write failed), and one that names a path of its own writes it
(``collectives/notices.py``).
``restore(path, like, strategy)`` (collective): rank 0 reads the file and broadcasts it; every rank
gets identical arrays with the structure, shapes and dtypes of ``like``. Errors (a missing file, a
full disk, a mismatch with ``like``) are raised on every rank, never on the chief alone.

For ``tf.train.Checkpoint`` use ``mpidist.tensorflow.checkpoint``.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from . import files
from .collectives import Engine, nest, notices

_STRUCTURE = "__structure__"


def _engine(strategy: Any) -> Engine:
    if isinstance(strategy, Engine):
        return strategy
    engine = getattr(getattr(strategy, "extended", None), "engine", None)
    if not isinstance(engine, Engine):
        raise TypeError(f"checkpoint: `strategy` must be an mpidist strategy or Engine, got {type(strategy).__name__}")
    return engine


def _raise_everywhere(engine: Engine, error: Exception | None) -> None:
    """The chief's error (or None), raised on every rank."""
    error = engine.topology.comm.bcast(error, root=0)
    if error is not None:
        raise error


def _write(state: Any, path: str) -> None:
    leaves, tree = nest.flatten(state)
    arrays: dict[str, Any] = {f"leaf_{i:06d}": np.asarray(leaf) for i, leaf in enumerate(leaves)}
    arrays[_STRUCTURE] = np.array(nest.structure_key(tree))

    def dump(tmp: str) -> None:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)

    try:
        for stale in files.stale_temporaries(path):  # left by an interrupted save
            os.remove(stale)
        files.write_atomically(path, dump)
    except OSError as err:
        raise OSError(f"checkpoint.save: could not write {path!r}: {err}") from None


def save(state: Any, path: str, strategy: Any) -> None:
    """Write ``state`` (a nest of arrays and numbers) to ``path`` atomically, once (see the module docstring)."""
    engine = _engine(strategy)
    key = os.path.abspath(path)
    if engine.size == 1:
        return _write(state, path)
    saving = notices.begin(engine, "mpidist.checkpoint.save", key)
    try:
        if engine.rank == 0:
            try:
                _write(state, path)
            except OSError as error:
                notices.publish(engine, saving, key, error=error)
                raise
            notices.publish(engine, saving, key)
            return None
        notice = notices.follow(engine, saving, key)
        if notice is None or notice.path != key:
            return _write(state, path)
        if notice.error is not None:
            raise OSError(f"checkpoint.save: rank 0 (the chief) failed to write {path!r}: {notice.error}")
        return None
    finally:
        notices.finish(engine, saving)


def restore(path: str, like: Any, strategy: Any) -> Any:
    """Read ``path`` on the chief and broadcast it: every rank gets the same state, shaped like ``like``."""
    engine = _engine(strategy)
    leaves, tree = nest.flatten(like)
    expected = [np.asarray(leaf) for leaf in leaves]
    loaded: list[np.ndarray] = expected
    error: Exception | None = None
    if engine.rank == 0:
        try:
            with np.load(path) as data:
                structure = str(data[_STRUCTURE])
                loaded = [data[f"leaf_{i:06d}"] for i in range(len(data.files) - 1)]
            if structure != nest.structure_key(tree) or len(loaded) != len(expected) or any(
                    a.shape != b.shape or a.dtype != b.dtype for a, b in zip(loaded, expected)):
                got = ", ".join(f"{a.dtype}{a.shape}" for a in loaded[:4])
                want = ", ".join(f"{b.dtype}{b.shape}" for b in expected[:4])
                error = ValueError(f"checkpoint.restore: {path!r} holds {structure} with [{got}...], "
                                   f"but `like` is {nest.structure_key(tree)} with [{want}...]")
        except (OSError, KeyError, ValueError) as err:
            error = OSError(f"checkpoint.restore: could not read {path!r}: {err}")
    _raise_everywhere(engine, error)
    restored = engine.broadcast(loaded if engine.rank == 0 else [np.empty_like(a) for a in expected], root=0)
    return nest.unflatten(tree, list(restored))
