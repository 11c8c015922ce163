"""Strategies layer: contexts, Strategy/StrategyExtended, the concrete strategies."""
from . import default  # registers the default strategy with context
from .base import Strategy, StrategyExtended
from .concrete import (CentralStorageStrategy, ExperimentalMultiWorkerMirroredStrategy, MirroredStrategy,
                       MultiWorkerMirroredStrategy, OneDeviceStrategy)
from .context import (ReplicaContext, experimental_set_strategy, get_loss_reduction, get_replica_context,
                      get_strategy, has_strategy, in_cross_replica_context)

__all__ = ["Strategy", "StrategyExtended", "CentralStorageStrategy", "ExperimentalMultiWorkerMirroredStrategy",
           "MirroredStrategy", "MultiWorkerMirroredStrategy", "OneDeviceStrategy", "ReplicaContext",
           "experimental_set_strategy", "get_loss_reduction", "get_replica_context", "get_strategy",
           "has_strategy", "in_cross_replica_context"]
