"""Atomic file writes: a reader, or a restart after a crash, sees the old file or the complete new one.

Every writer of state in mpidist (``mpidist.checkpoint``, Keras's saving functions and callbacks in
``mpidist.tensorflow.keras``, the elastic preemption snapshot, the merged timeline) goes through
``write_atomically``:

1. the content is written to a temporary file in the same directory as ``path`` (so the rename
   below stays on one file system);
2. the temporary file is flushed and fsync'ed: its bytes are on the disk before its name is;
3. ``os.replace`` renames it over ``path`` (atomic on POSIX file systems);
4. the directory is fsync'ed, so the rename itself survives a crash.

If writing fails at any point the temporary file is removed and ``path`` is left as it was. The
module needs nothing but the standard library (layer 0).
"""
from __future__ import annotations

import glob
import os
from typing import Any, Callable, TypeVar

T = TypeVar("T")
_MARK = ".mpidist-tmp-"


def temporary_name(path: Any, ending: str = "") -> str:
    """A hidden name beside ``path``, unique to this process, that keeps ``ending`` (a format suffix
    such as ``.weights.h5``, which some writers read off the name) when ``path`` has it."""
    folder, base = os.path.split(os.fspath(path))
    if not (ending and base.endswith(ending)):
        ending = ""
    stem = base[: len(base) - len(ending)] if ending else base
    return os.path.join(folder, f".{stem}{_MARK}{os.getpid()}{ending}")


def stale_temporaries(path: Any, ending: str = "") -> list[str]:
    """Temporary files of ``path`` left by writes that were killed midway (any process's)."""
    folder, base = os.path.split(os.fspath(path))
    if not (ending and base.endswith(ending)):
        ending = ""
    stem = base[: len(base) - len(ending)] if ending else base
    return glob.glob(os.path.join(glob.escape(folder), f".{glob.escape(stem)}{_MARK}*{glob.escape(ending)}"))


def fsync_path(path: str, *, directory: bool = False) -> None:
    """Flush a file (or a directory's entries) that is already closed to the disk."""
    fd = os.open(path, os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Any, write: Callable[[str], T], *, temporary: str | None = None) -> T:
    """``write(temporary)`` writes the new content to a file by that name (and closes it); it then
    replaces ``path`` (steps 1-4 of the module docstring). Returns what ``write`` returned.
    ``temporary`` must be in ``path``'s directory (default: ``temporary_name(path)``)."""
    path = os.fspath(path)
    tmp = temporary_name(path) if temporary is None else temporary
    if os.path.dirname(os.path.abspath(tmp)) != os.path.dirname(os.path.abspath(path)):
        raise ValueError(f"write_atomically: `temporary` must be in the directory of {path!r}, got {tmp!r}")
    try:
        result = write(tmp)
        fsync_path(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):
            os.remove(tmp)
    fsync_path(os.path.dirname(os.path.abspath(path)), directory=True)
    return result

