"""Run a function right after a top-level module has been imported, without importing it.

``mpidist run`` must change what ``tensorflow`` offers (and which GPU it and CuPy see) before the
program uses them, but must not import TensorFlow for a program that never does. A finder in front
of ``sys.meta_path`` lets the ordinary finders locate the module, and wraps the loader's
``exec_module`` so that the functions registered for that name run once the module's own code has
finished (the module is complete in ``sys.modules`` then). A module imported before the hook was
installed gets its functions at once.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
import threading
from types import ModuleType
from typing import Any, Callable, Sequence

__all__ = ["when_imported", "uninstall"]

_log = logging.getLogger("mpidist")
_lock = threading.Lock()
_pending: dict[str, list[Callable[[ModuleType], None]]] = {}


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: it asks the finders after it, then wraps what they found."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if fullname not in _pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            _fire(fullname, module)

        loader.exec_module = exec_module  # type: ignore[method-assign]  # this spec's loader only
        return spec


_finder = _Finder()


def _fire(name: str, module: ModuleType) -> None:
    with _lock:
        functions = _pending.pop(name, [])
    for function in functions:
        function(module)
    if not _pending:
        uninstall()


def when_imported(name: str, function: Callable[[ModuleType], None]) -> None:
    """Call ``function(module)`` once the top-level module ``name`` is imported (now, if it is)."""
    if "." in name:
        raise ValueError(f"when_imported: `name` must be a top-level module, got {name!r}")
    module = sys.modules.get(name)
    if module is not None:
        function(module)
        return
    with _lock:
        _pending.setdefault(name, []).append(function)
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)


def uninstall() -> None:
    """Forget every pending function and take the finder out of ``sys.meta_path``."""
    with _lock:
        _pending.clear()
        if _finder in sys.meta_path:
            sys.meta_path.remove(_finder)
