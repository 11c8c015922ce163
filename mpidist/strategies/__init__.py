"""Strategies layer: contexts, Strategy/StrategyExtended (the NumPy implementation every public
strategy class builds on) and what each strategy is built from (parts.py); the public classes are in
mpidist.frameworks."""
from . import parts
from .base import CentralStorageExtended, Strategy, StrategyExtended
from .context import (
                       ReplicaContext,
                       experimental_set_strategy,
                       get_loss_reduction,
                       has_strategy,
                       in_cross_replica_context,
)
from .default import get_replica_context, get_strategy

__all__ = ["Strategy", "StrategyExtended", "CentralStorageExtended", "parts", "ReplicaContext",
           "experimental_set_strategy", "get_loss_reduction", "get_replica_context", "get_strategy",
           "has_strategy", "in_cross_replica_context"]
