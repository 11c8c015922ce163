"""Distributed values with one replica per rank.

Each rank holds exactly one component, so ``values`` is a 1-tuple. ``PerReplica`` holds values
that differ between replicas (what ``run`` returns in TensorFlow with several local replicas),
``Mirrored`` holds values known to be equal on every rank (results of reductions and broadcasts).
Code written for TensorFlow that calls ``strategy.experimental_local_results(v)`` or reads
``v.values`` works unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..cross_device import local_value


class DistributedValues:
    """Base class of values with one component per replica; here, the one of this rank."""

    is_distributed_value = True  # recognised by lower layers without importing this module
    __slots__ = ("_value",)

    def __init__(self, value: Any) -> None:
        self._value = value

    @property
    def values(self) -> tuple[Any]:
        return (self._value,)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({{0: {self._value!r}}})"


class PerReplica(DistributedValues):
    """Values that may differ between replicas."""

    __slots__ = ()


class Mirrored(DistributedValues):
    """Values equal on every replica."""

    __slots__ = ()


local = local_value  # the local component of a DistributedValues, or the value itself


@dataclass(frozen=True)
class ValueContext:
    """What ``experimental_distribute_values_from_function`` passes to its function."""

    replica_id_in_sync_group: int = 0
    num_replicas_in_sync: int = 1
