"""``import horovod...`` under ``mpidist run``: every Horovod module a TensorFlow program imports is
the module of ``mpidist.horovod`` with the same path.

``horovod.X.Y`` resolves to ``mpidist.horovod.X.Y`` (the same module object: ``horovod.tensorflow is
mpidist.horovod.tensorflow``), so ``import horovod.tensorflow.keras as hvd``, ``from
horovod.tensorflow.keras.callbacks import ...``, ``import horovod.keras``, ``horovod.run`` and
``horovod.__version__`` work as written. Horovod's other frameworks (``horovod.torch``,
``horovod.mxnet``, ``horovod.spark``, ``horovod.ray``) raise ``ModuleNotFoundError`` saying what
mpidist offers, so a library that tries them and falls back keeps working. Installed by ``mpidist
run`` only: a plain ``python`` process never sees a ``horovod`` module from mpidist.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType
from typing import Any, Sequence

__all__ = ["install", "uninstall", "installed", "target_of", "PREFIX", "TARGET"]

PREFIX = "horovod"
TARGET = "mpidist.horovod"
_OTHER_FRAMEWORKS = ("torch", "mxnet", "spark", "ray", "keras_legacy", "data")


def target_of(name: str) -> str:
    """The mpidist module that ``horovod``-module ``name`` stands for."""
    return TARGET + name[len(PREFIX):]


class _AliasLoader(importlib.abc.Loader):
    """Hands the import system the already-imported mpidist module; keeps that module's own spec."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        # the import system gave the module the alias's spec: give it back its own, so that its
        # relative imports and importlib.reload keep working under its real name
        own = getattr(module, "__mpidist_own_spec__", None)
        if own is not None:
            module.__spec__ = own


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if fullname != PREFIX and not fullname.startswith(PREFIX + "."):
            return None
        real = target_of(fullname)
        parts = fullname.split(".")
        if len(parts) > 1 and parts[1] in _OTHER_FRAMEWORKS:
            raise ModuleNotFoundError(
                f"mpidist run: `import {fullname}`: mpidist provides Horovod's TensorFlow and Keras API only "
                f"(horovod.tensorflow, horovod.tensorflow.keras, horovod.keras), not horovod.{parts[1]}",
                name=fullname)
        try:
            found = importlib.util.find_spec(real)
        except ModuleNotFoundError:
            found = None
        if found is None:
            raise ModuleNotFoundError(
                f"mpidist run: `import {fullname}`: mpidist.horovod has no module {real!r} (see docs/horovod.md "
                f"for the Horovod names mpidist provides)", name=fullname)
        module = importlib.import_module(real)
        if not hasattr(module, "__mpidist_own_spec__"):
            module.__mpidist_own_spec__ = module.__spec__  # type: ignore[attr-defined]
        is_package = hasattr(module, "__path__")
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(real), is_package=is_package)


_finder = _Finder()


def install() -> None:
    """Make ``horovod`` and its submodules resolve to ``mpidist.horovod``'s (idempotent)."""
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def uninstall() -> None:
    """Undo :func:`install` (modules already imported under ``horovod`` names stay in sys.modules)."""
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)


def installed() -> bool:
    return _finder in sys.meta_path
