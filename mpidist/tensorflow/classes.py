"""The strategy classes that always build on TensorFlow: ``mpidist.tensorflow.MultiWorkerMirroredStrategy``
and the others, whatever ``rc.framework`` says (importing this package imports TensorFlow anyway).

Each builds mpidist's genuine ``tf.distribute.Strategy`` (``MPIStrategy``), with the constructor
signature of TensorFlow's class of the same name plus ``comm=``, from the parts the NumPy class
it derives from sets up (``_setup``: engine, options, cross-device ops, resolver), and installs
``mpidist.tensorflow.keras`` on it (:func:`make_tf_strategy`). ``isinstance(s, C)`` is true for the class ``C``
that built ``s`` and for the ``mpidist`` class of the same name (``mpidist.Strategy`` too; see
``mpidist/strategies/base.py``). The NumPy counterparts are in ``mpidist.numpy``; the public
classes that choose between the two are in ``mpidist.frameworks``.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from .. import strategies as _strategies
from . import keras as keras_patches  # above the rest of this package, below this module (test_layering.py)
from .strategy import MPIStrategy, make_strategy


def make_tf_strategy(kind: str, engine: Any, options: Any, **extra: Any) -> MPIStrategy:
    """``make_strategy`` (see strategy.py) with ``mpidist.tensorflow.keras`` installed on the result, as every
    strategy class builds it (collective: the ranks agree on shuffle seeds)."""
    strategy = make_strategy(kind, engine, options, **extra)
    keras_patches.install(strategy)
    return strategy


def _build(cls: Any, *args: Any, **kwargs: Any) -> MPIStrategy:
    """``__new__`` of every class here: the NumPy class's parts, built into a TensorFlow strategy."""
    engine, options, cross_ops, resolver, extra = cls._setup(*args, **kwargs)
    return make_tf_strategy(cls._kind, engine, options, cross_device_ops=cross_ops, cluster_resolver=resolver,
                            **extra)


class MultiWorkerMirroredStrategy(_strategies.MultiWorkerMirroredStrategy, framework="tensorflow"):
    __doc__ = _strategies.MultiWorkerMirroredStrategy.__doc__
    __new__ = _build


class MirroredStrategy(_strategies.MirroredStrategy, framework="tensorflow"):
    __doc__ = _strategies.MirroredStrategy.__doc__
    __new__ = _build


class OneDeviceStrategy(_strategies.OneDeviceStrategy, framework="tensorflow"):
    __doc__ = _strategies.OneDeviceStrategy.__doc__
    __new__ = _build


class CentralStorageStrategy(_strategies.CentralStorageStrategy, framework="tensorflow"):
    __doc__ = _strategies.CentralStorageStrategy.__doc__
    __new__ = _build


class ExperimentalMultiWorkerMirroredStrategy(_strategies.ExperimentalMultiWorkerMirroredStrategy,
                                              framework="tensorflow"):
    __doc__ = _strategies.ExperimentalMultiWorkerMirroredStrategy.__doc__
    __new__ = _build


experimental = SimpleNamespace(MultiWorkerMirroredStrategy=ExperimentalMultiWorkerMirroredStrategy,
                               CentralStorageStrategy=CentralStorageStrategy)
