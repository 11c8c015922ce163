"""Values layer: DistributedValues with one component per rank."""
from .distributed import DistributedValues, Mirrored, PerReplica, ValueContext, local

__all__ = ["DistributedValues", "Mirrored", "PerReplica", "ValueContext", "local"]
