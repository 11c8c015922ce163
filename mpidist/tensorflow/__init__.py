"""mpidist's TensorFlow integration: genuine ``tf.distribute.Strategy`` objects on an engine.

Importing this package imports TensorFlow; nothing below ``mpidist/tensorflow`` does. This
module only re-exports. The strategy classes that build on TensorFlow (``mpidist.on_tensorflow``)
derive from ``MPIStrategy`` and from the public classes of the same names.
"""
from . import checkpoint
from .collectives import XlaCollectiveError
from .extended import MPIExtended
from .input import MPIDistributedDataset
from .iterator import MPIDistributedIterator
from .replica_context import MPIReplicaContext
from .strategy import MPIStrategy

__all__ = ["MPIStrategy", "MPIExtended", "MPIReplicaContext",
           "MPIDistributedDataset", "MPIDistributedIterator", "XlaCollectiveError", "checkpoint"]
