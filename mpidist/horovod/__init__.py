"""Horovod's API on mpidist, for programs written against Horovod.

Change ``import horovod.tensorflow as hvd`` to ``import mpidist.horovod.tensorflow as hvd``
(``horovod.tensorflow.keras`` / ``horovod.keras`` to ``mpidist.horovod.tensorflow.keras`` /
``mpidist.horovod.keras``) and launch with mpirun/srun as before. Importing this package imports
nothing heavy; the framework modules import TensorFlow. See docs/horovod.md.
"""
__all__ = ["tensorflow", "keras"]
