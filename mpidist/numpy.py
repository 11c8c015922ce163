"""``mpidist.numpy``: the strategies on NumPy, never on TensorFlow, whatever the program imported.

``mpidist.MultiWorkerMirroredStrategy()`` builds on TensorFlow when TensorFlow has been imported
(``rc.framework``); these classes always build the NumPy strategies of ``mpidist.strategies`` (and
never import TensorFlow), and ``isinstance(s, mpidist.numpy.X)`` means "an X built on NumPy", by
whichever class. Their objects are instances of the ``mpidist`` classes of the same names too. The
TensorFlow counterparts are in ``mpidist.tensorflow``.
"""
from __future__ import annotations

from types import SimpleNamespace

from . import strategies as _strategies


class MultiWorkerMirroredStrategy(_strategies.MultiWorkerMirroredStrategy, framework="numpy"):
    __doc__ = _strategies.MultiWorkerMirroredStrategy.__doc__


class MirroredStrategy(_strategies.MirroredStrategy, framework="numpy"):
    __doc__ = _strategies.MirroredStrategy.__doc__


class OneDeviceStrategy(_strategies.OneDeviceStrategy, framework="numpy"):
    __doc__ = _strategies.OneDeviceStrategy.__doc__


class CentralStorageStrategy(_strategies.CentralStorageStrategy, framework="numpy"):
    __doc__ = _strategies.CentralStorageStrategy.__doc__


class ExperimentalMultiWorkerMirroredStrategy(_strategies.ExperimentalMultiWorkerMirroredStrategy,
                                              framework="numpy"):
    __doc__ = _strategies.ExperimentalMultiWorkerMirroredStrategy.__doc__


experimental = SimpleNamespace(MultiWorkerMirroredStrategy=ExperimentalMultiWorkerMirroredStrategy,
                               CentralStorageStrategy=CentralStorageStrategy)
"""``mpidist.numpy.experimental``: the names of ``tf.distribute.experimental``'s strategies."""

__all__ = ["MultiWorkerMirroredStrategy", "MirroredStrategy", "OneDeviceStrategy", "CentralStorageStrategy",
           "ExperimentalMultiWorkerMirroredStrategy", "experimental"]
