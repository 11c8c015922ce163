"""The framework choice: the public strategy and CrossDeviceOps classes, which build on (or take
values of) TensorFlow when the program uses it and NumPy otherwise.

This is the one place that knows both frameworks, so it sits in the top layer and imports the
layers below it the ordinary way; nothing below it knows which framework a program uses
(docs/design.md, "Layers" and "Strategies in two modes").

- ``mpidist.MultiWorkerMirroredStrategy`` (and ``MirroredStrategy``, ``OneDeviceStrategy``,
  ``experimental.CentralStorageStrategy``, ``experimental.MultiWorkerMirroredStrategy``): with
  TensorFlow in use (:func:`tensorflow_in_use`) a call builds ``mpidist.tensorflow.X`` (a genuine
  ``tf.distribute.Strategy``), otherwise the NumPy strategy of ``mpidist.strategies``. Declared with
  ``framework="auto"``: ``isinstance(s, mpidist.X)`` holds for both (``StrategyType``).
- ``mpidist.CrossDeviceOps`` and its four subclasses: ``reduce``, ``batch_reduce`` and ``broadcast``
  also take TensorFlow values (tensors, variables, distributed values, nests of them) when the
  program has imported TensorFlow; they go to ``mpidist.tensorflow.cross_device``. NumPy values
  never load TensorFlow.
"""
from __future__ import annotations

import importlib
import logging
import sys
from types import ModuleType
from typing import Any, Iterable

from . import cross_device as _cd
from . import strategies as _strategies
from ._config import rc

_log = logging.getLogger("mpidist")


def tensorflow_in_use() -> bool:
    """Whether the public strategy classes build on TensorFlow: ``rc.framework``; "auto" means
    TensorFlow is already imported ("tensorflow" imports it)."""
    if rc.framework == "auto":
        return "tensorflow" in sys.modules
    if rc.framework == "tensorflow":
        importlib.import_module("tensorflow")  # the framework itself, not an mpidist module
        return True
    return False


def _on_tensorflow(kind: str, args: tuple, kwargs: dict) -> Any:
    from . import tensorflow as tf_integration  # imports TensorFlow: only when it is in use
    return getattr(tf_integration, kind)(*args, **kwargs)


class MultiWorkerMirroredStrategy(_strategies.MultiWorkerMirroredStrategy, framework="auto"):
    __doc__ = _strategies.MultiWorkerMirroredStrategy.__doc__

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if tensorflow_in_use():
            return _on_tensorflow("MultiWorkerMirroredStrategy", args, kwargs)
        return super().__new__(cls)


class MirroredStrategy(_strategies.MirroredStrategy, framework="auto"):
    __doc__ = _strategies.MirroredStrategy.__doc__

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if tensorflow_in_use():
            return _on_tensorflow("MirroredStrategy", args, kwargs)
        return super().__new__(cls)


class OneDeviceStrategy(_strategies.OneDeviceStrategy, framework="auto"):
    __doc__ = _strategies.OneDeviceStrategy.__doc__

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if tensorflow_in_use():
            return _on_tensorflow("OneDeviceStrategy", args, kwargs)
        return super().__new__(cls)


class CentralStorageStrategy(_strategies.CentralStorageStrategy, framework="auto"):
    __doc__ = _strategies.CentralStorageStrategy.__doc__

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if tensorflow_in_use():
            return _on_tensorflow("CentralStorageStrategy", args, kwargs)
        return super().__new__(cls)


class ExperimentalMultiWorkerMirroredStrategy(_strategies.ExperimentalMultiWorkerMirroredStrategy,
                                              framework="auto"):
    __doc__ = _strategies.ExperimentalMultiWorkerMirroredStrategy.__doc__

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if tensorflow_in_use():
            return _on_tensorflow("ExperimentalMultiWorkerMirroredStrategy", args, kwargs)
        return super().__new__(cls)


# -- CrossDeviceOps ------------------------------------------------------------------------------

_tf_values_state: list[Any] = []  # [mpidist.tensorflow.cross_device or None] once TensorFlow was seen


def _tf_values() -> ModuleType | None:
    """``mpidist.tensorflow.cross_device`` when the program has imported TensorFlow, else None (never
    imports TensorFlow). An untested TensorFlow that breaks it leaves NumPy values working."""
    if _tf_values_state:
        return _tf_values_state[0]
    if "tensorflow" not in sys.modules:
        return None
    try:
        from .tensorflow import cross_device as found
    except ImportError as error:
        _log.warning("mpidist: CrossDeviceOps cannot take TensorFlow values in this process: %s", error)
        _tf_values_state.append(None)
        return None
    found.not_converted(CrossDeviceOps)  # library code: AutoGraph must not convert it
    _tf_values_state.append(found)
    return found


def _taker(values: Iterable[Any]) -> ModuleType | None:
    module = _tf_values()
    return module if module is not None and any(module.handles(v) for v in values) else None


class CrossDeviceOps(_cd.CrossDeviceOps):
    """``mpidist.cross_device.CrossDeviceOps`` that also takes TensorFlow values (see the module
    docstring): they are reduced or broadcast in one call of the TensorFlow bridge, and come back
    as ``tf.Tensor`` results in the same nest."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _tf_values()  # built after `import tensorflow`: mark the methods before any tf.function calls them

    def reduce(self, reduce_op: Any, per_replica_value: Any, destinations: Any = None, options: Any = None) -> Any:
        taker = _taker([per_replica_value])
        if taker is None:
            return super().reduce(reduce_op, per_replica_value, destinations, options)
        where = f"{type(self).__name__}.reduce"
        return taker.reduce(self, _cd.as_reduce_op(reduce_op, where), per_replica_value,
                            _cd.call_options_of(options, where), where)

    def batch_reduce(self, reduce_op: Any, value_destination_pairs: Iterable[tuple[Any, Any]],
                     options: Any = None) -> list[Any]:
        pairs = list(value_destination_pairs)
        taker = _taker([v for v, _ in pairs])
        if taker is None:
            return super().batch_reduce(reduce_op, pairs, options)
        where = f"{type(self).__name__}.batch_reduce"
        return list(taker.batch_reduce(self, _cd.as_reduce_op(reduce_op, where), [v for v, _ in pairs],
                                       _cd.call_options_of(options, where), where))

    def broadcast(self, tensor: Any, destinations: Any = None, root: int = 0) -> Any:
        taker = _taker([tensor])
        if taker is None:
            return super().broadcast(tensor, destinations, root)
        return taker.broadcast(self, tensor, root, f"{type(self).__name__}.broadcast")


class MPIAllReduce(CrossDeviceOps, _cd.MPIAllReduce):
    __doc__ = _cd.MPIAllReduce.__doc__


class NcclAllReduce(CrossDeviceOps, _cd.NcclAllReduce):
    __doc__ = _cd.NcclAllReduce.__doc__


class HierarchicalCopyAllReduce(CrossDeviceOps, _cd.HierarchicalCopyAllReduce):
    __doc__ = _cd.HierarchicalCopyAllReduce.__doc__


class ReductionToOneDevice(CrossDeviceOps, _cd.ReductionToOneDevice):
    __doc__ = _cd.ReductionToOneDevice.__doc__


__all__ = ["tensorflow_in_use", "MultiWorkerMirroredStrategy", "MirroredStrategy", "OneDeviceStrategy",
           "CentralStorageStrategy", "ExperimentalMultiWorkerMirroredStrategy", "CrossDeviceOps", "MPIAllReduce",
           "NcclAllReduce", "HierarchicalCopyAllReduce", "ReductionToOneDevice"]
