"""``mpidist.on_tensorflow``: the strategy classes on TensorFlow, what ``mpidist.X`` builds with
TensorFlow in use; calling one of these always builds on TensorFlow, whatever ``rc.framework`` says.
Importing this module imports TensorFlow. This module only re-exports.

Each derives from ``MPIStrategy`` (mpidist's genuine ``tf.distribute.Strategy``,
mpidist/tensorflow/strategy.py) and from the public class of the same name, whose ``_setup`` builds
the parts from TensorFlow's constructor signature plus ``comm=``: ``isinstance(s, mpidist.X)`` and
``isinstance(s, tf.distribute.Strategy)`` hold by inheritance, and ``type(s) is
mpidist.on_tensorflow.X``. They are defined by ``mpidist.frameworks.tensorflow_classes``.
"""
from __future__ import annotations

from types import SimpleNamespace

from . import frameworks as _public

_classes = _public.tensorflow_classes()
MultiWorkerMirroredStrategy = _classes[_public.MultiWorkerMirroredStrategy]
MirroredStrategy = _classes[_public.MirroredStrategy]
OneDeviceStrategy = _classes[_public.OneDeviceStrategy]
CentralStorageStrategy = _classes[_public.CentralStorageStrategy]
ExperimentalMultiWorkerMirroredStrategy = _classes[_public.ExperimentalMultiWorkerMirroredStrategy]

experimental = SimpleNamespace(MultiWorkerMirroredStrategy=ExperimentalMultiWorkerMirroredStrategy,
                               CentralStorageStrategy=CentralStorageStrategy)
"""``mpidist.on_tensorflow.experimental``: the names of ``tf.distribute.experimental``'s strategies."""

__all__ = ["MultiWorkerMirroredStrategy", "MirroredStrategy", "OneDeviceStrategy", "CentralStorageStrategy",
           "ExperimentalMultiWorkerMirroredStrategy", "experimental"]
