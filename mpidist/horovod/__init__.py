"""Horovod's API on mpidist, for programs written against Horovod.

Change ``import horovod.tensorflow as hvd`` to ``import mpidist.horovod.tensorflow as hvd``
(``horovod.tensorflow.keras`` / ``horovod.keras`` to ``mpidist.horovod.tensorflow.keras`` /
``mpidist.horovod.keras``) and launch with mpirun/srun as before. Importing this package imports
nothing heavy; the framework modules import TensorFlow. See docs/horovod.md.

Under ``mpidist run`` (docs/launch.md) this package is also ``horovod`` itself: ``import
horovod.tensorflow as hvd`` resolves here, ``horovod.run`` is :func:`runner.run` and
``horovod.__version__`` is the Horovod release whose API mpidist follows.
"""
from .runner import run

__version__ = "0.28.1"  # the Horovod release whose API mpidist.horovod follows (mpidist's own: mpidist.__version__)

__all__ = ["run", "__version__", "tensorflow", "keras"]
