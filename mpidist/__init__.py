"""mpidist: the tf.distribute programming model on MPI. This module only re-exports.

Replace ``tf.distribute`` with ``mpidist`` (and ``tf.distribute.experimental`` with
``mpidist.experimental``) and launch with mpirun/srun: one rank hosts one replica.
"""
from . import cluster_resolver, elastic, errors, experimental, overlap
from ._config import rc
from ._version import __version__
from .collectives import Engine, Op  # Op is ReduceOp: one class, defined in collectives
from .cross_device import ReduceOp
from .cross_device_ops import (
    CrossDeviceOps,
    HierarchicalCopyAllReduce,
    MPIAllReduce,
    NcclAllReduce,
    ReductionToOneDevice,
)
from .frameworks import MirroredStrategy, MultiWorkerMirroredStrategy, OneDeviceStrategy
from .input import DistributedDataset, DistributedIterator, InputContext, InputOptions, InputReplicationMode
from .strategies import (
    ReplicaContext,
    Strategy,
    StrategyExtended,
    experimental_set_strategy,
    get_loss_reduction,
    get_replica_context,
    get_strategy,
    has_strategy,
    in_cross_replica_context,
)
from .topology import Topology
from .values import DistributedValues


def __getattr__(name: str):
    """``mpidist.Server`` imports TensorFlow, so only when first used (``import mpidist`` does not)."""
    if name == "Server":
        from .tensorflow.server import Server
        return Server
    raise AttributeError(f"module 'mpidist' has no attribute {name!r}")


# The abort hook (an uncaught exception on one rank ends the job, rc.abort_on_error) is installed
# by the first Engine, not by this import.

__all__ = ["__version__", "rc", "errors", "Topology", "Engine", "Op",
           "CrossDeviceOps", "HierarchicalCopyAllReduce", "MPIAllReduce", "NcclAllReduce", "ReduceOp",
           "ReductionToOneDevice", "DistributedValues",
           "MirroredStrategy", "MultiWorkerMirroredStrategy", "OneDeviceStrategy", "ReplicaContext", "Strategy",
           "StrategyExtended", "experimental_set_strategy", "get_loss_reduction", "get_replica_context",
           "get_strategy", "has_strategy", "in_cross_replica_context", "DistributedDataset", "DistributedIterator",
           "InputContext", "InputOptions", "InputReplicationMode", "experimental", "cluster_resolver",
           "elastic",
           "overlap"]
