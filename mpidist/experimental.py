"""``mpidist.experimental``: the names of ``tf.distribute.experimental``. This module re-exports, and
hands the strategies layer the default cluster resolver (``mpidist.cluster_resolver``, a layer above it)."""
from .cluster_resolver import MPIClusterResolver as _MPIClusterResolver
from .cross_device import (CollectiveCommunication, CollectiveHints, CommunicationImplementation,
                           CommunicationOptions)
from .strategies import CentralStorageStrategy
from .strategies import ExperimentalMultiWorkerMirroredStrategy as MultiWorkerMirroredStrategy
from .strategies.concrete import register_cluster_resolver as _register_cluster_resolver
from .values import ValueContext

_register_cluster_resolver(_MPIClusterResolver)

__all__ = ["CollectiveCommunication", "CollectiveHints", "CommunicationImplementation", "CommunicationOptions",
           "CentralStorageStrategy", "MultiWorkerMirroredStrategy", "ValueContext"]
