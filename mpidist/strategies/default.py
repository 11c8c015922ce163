"""The default strategy: one replica (this rank alone), current outside every scope."""
from __future__ import annotations

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


context.register_default(default_strategy)
