"""Strategies layer: contexts, Strategy/StrategyExtended, the concrete strategies (always on NumPy;
the public classes that choose the framework are in mpidist.frameworks)."""
from .base import Strategy, StrategyExtended
from .concrete import (
                       CentralStorageStrategy,
                       ExperimentalMultiWorkerMirroredStrategy,
                       MirroredStrategy,
                       MultiWorkerMirroredStrategy,
                       OneDeviceStrategy,
)
from .context import (
                       ReplicaContext,
                       experimental_set_strategy,
                       get_loss_reduction,
                       has_strategy,
                       in_cross_replica_context,
)
from .default import get_replica_context, get_strategy

__all__ = ["Strategy", "StrategyExtended", "CentralStorageStrategy", "ExperimentalMultiWorkerMirroredStrategy",
           "MirroredStrategy", "MultiWorkerMirroredStrategy", "OneDeviceStrategy", "ReplicaContext",
           "experimental_set_strategy", "get_loss_reduction", "get_replica_context", "get_strategy",
           "has_strategy", "in_cross_replica_context"]
