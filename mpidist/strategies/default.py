"""The default strategy: one replica (this rank alone), current outside every scope; and the
two functions of the context API that fall back to it (the rest are in context.py)."""
from __future__ import annotations

from typing import Any

from mpi4py import MPI

from ..collectives import Engine
from ..cross_device import CommunicationOptions
from . import context
from .base import Strategy

_default: list[Strategy] = []


class _DefaultDistributionStrategy(Strategy):
    """What ``get_strategy()`` returns outside every scope: no communication with other ranks."""

    def __init__(self) -> None:
        super().__init__(Engine(MPI.COMM_SELF), CommunicationOptions())

    def close(self) -> None:
        """Does nothing: the default strategy stays usable for the whole program."""


def default_strategy() -> Strategy:
    if not _default:
        _default.append(_DefaultDistributionStrategy())
    return _default[0]


def get_strategy() -> Any:
    """The current strategy (the default strategy outside every scope)."""
    top = context.top()
    if top is not None:
        return top[0]
    tfd = context.tf_distribute()
    if tfd is not None and tfd.has_strategy():
        return tfd.get_strategy()
    return default_strategy()


def get_replica_context() -> context.ReplicaContext | None:
    """The replica context inside ``run``; None in a cross-replica context (inside ``scope()``)."""
    top = context.top()
    if top is None:
        tfd = context.tf_distribute()
        if tfd is not None and tfd.has_strategy():
            return tfd.get_replica_context()
        strategy = get_strategy()  # the default strategy: NumPy's, whose replica id is this rank
        return context.ReplicaContext(strategy, strategy.extended.rank)
    return top[1]
