"""mpidist's TensorFlow integration: genuine ``tf.distribute.Strategy`` objects on an engine.

Importing this package imports TensorFlow; nothing below ``mpidist/tensorflow`` does. This
module only re-exports. The strategy classes (classes.py) build through ``make_strategy``.
"""
from . import checkpoint
from .classes import (
                      CentralStorageStrategy,
                      ExperimentalMultiWorkerMirroredStrategy,
                      MirroredStrategy,
                      MultiWorkerMirroredStrategy,
                      OneDeviceStrategy,
                      experimental,
)
from .collectives import XlaCollectiveError
from .extended import MPIExtended
from .input import MPIDistributedDataset
from .iterator import MPIDistributedIterator
from .replica_context import MPIReplicaContext
from .strategy import KINDS, MPIStrategy, make_strategy

__all__ = ["make_strategy", "KINDS", "MPIStrategy", "MPIExtended", "MPIReplicaContext",
           "MPIDistributedDataset", "MPIDistributedIterator", "XlaCollectiveError", "checkpoint",
           "MultiWorkerMirroredStrategy", "MirroredStrategy", "OneDeviceStrategy", "CentralStorageStrategy",
           "ExperimentalMultiWorkerMirroredStrategy", "experimental"]
