"""The strategy classes that always build on TensorFlow: ``mpidist.tensorflow.MultiWorkerMirroredStrategy``
and the others, whatever ``rc.framework`` says (importing this package imports TensorFlow anyway).

Each builds mpidist's genuine ``tf.distribute.Strategy`` (``MPIStrategy``), with the constructor
signature of TensorFlow's class of the same name plus ``comm=``. ``isinstance(s, C)`` is true for
the class ``C`` that built ``s`` and for the ``mpidist`` class of the same name (``mpidist.Strategy``
too; see ``mpidist/strategies/base.py``). The NumPy counterparts are in ``mpidist.numpy``.
"""
from __future__ import annotations

from types import SimpleNamespace

from .. import strategies as _strategies


class MultiWorkerMirroredStrategy(_strategies.MultiWorkerMirroredStrategy, framework="tensorflow"):
    __doc__ = _strategies.MultiWorkerMirroredStrategy.__doc__


class MirroredStrategy(_strategies.MirroredStrategy, framework="tensorflow"):
    __doc__ = _strategies.MirroredStrategy.__doc__


class OneDeviceStrategy(_strategies.OneDeviceStrategy, framework="tensorflow"):
    __doc__ = _strategies.OneDeviceStrategy.__doc__


class CentralStorageStrategy(_strategies.CentralStorageStrategy, framework="tensorflow"):
    __doc__ = _strategies.CentralStorageStrategy.__doc__


class ExperimentalMultiWorkerMirroredStrategy(_strategies.ExperimentalMultiWorkerMirroredStrategy,
                                              framework="tensorflow"):
    __doc__ = _strategies.ExperimentalMultiWorkerMirroredStrategy.__doc__


experimental = SimpleNamespace(MultiWorkerMirroredStrategy=ExperimentalMultiWorkerMirroredStrategy,
                               CentralStorageStrategy=CentralStorageStrategy)
