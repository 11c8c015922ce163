"""Communication options: what ``tf.distribute.experimental`` calls CommunicationOptions,
CollectiveHints and CommunicationImplementation (alias CollectiveCommunication), with the same
constructor signatures, carried down to the engine as ``bytes_per_pack``, ``timeout_seconds`` and
the implementation choice.

- ``AUTO``: mpidist picks per buffer and topology (host buffers: MPI; GPU buffers: NCCL inside the
  node where available).
- ``RING``: the MPI path only (the name TensorFlow uses for its non-NCCL collectives).
- ``NCCL``: NCCL inside the node for GPU buffers; a clear error where NCCL is unavailable.
"""
from __future__ import annotations

import enum
from typing import Any

from ..collectives.deadline import check_timeout


class CommunicationImplementation(enum.Enum):
    AUTO = "AUTO"
    RING = "RING"
    NCCL = "NCCL"


CollectiveCommunication = CommunicationImplementation


def _implementation(value: Any, where: str) -> CommunicationImplementation:
    if isinstance(value, CommunicationImplementation):
        return value
    name = getattr(value, "name", value)  # TensorFlow's own enum members work too
    if isinstance(name, str) and name.upper() in CommunicationImplementation.__members__:
        return CommunicationImplementation[name.upper()]
    raise ValueError(f"{where}: `implementation` must be one of AUTO, RING, NCCL, got {value!r}")


def _bytes_per_pack(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{where}: `bytes_per_pack` must be an integer >= 0, got {value!r}")
    return value


class CommunicationOptions:
    """Options for cross-replica communication (``tf.distribute.experimental.CommunicationOptions``).

    ``bytes_per_pack``: pack size for nests (0 = automatic); ``timeout_seconds``: deadline of each
    collective (None = none); ``implementation``: AUTO, RING or NCCL.
    """

    __slots__ = ("bytes_per_pack", "timeout_seconds", "implementation")

    def __init__(self, bytes_per_pack: int = 0, timeout_seconds: float | None = None,
                 implementation: Any = CommunicationImplementation.AUTO) -> None:
        where = "CommunicationOptions"
        self.bytes_per_pack = _bytes_per_pack(bytes_per_pack, where)
        self.timeout_seconds = check_timeout(timeout_seconds, where)
        self.implementation = _implementation(implementation, where)

    def merge(self, other: "CommunicationOptions | None") -> "CommunicationOptions":
        """``other``'s non-default fields over this one's (TensorFlow's merge rule)."""
        if other is None:
            return self
        return CommunicationOptions(
            other.bytes_per_pack or self.bytes_per_pack,
            other.timeout_seconds if other.timeout_seconds is not None else self.timeout_seconds,
            other.implementation if other.implementation is not CommunicationImplementation.AUTO
            else self.implementation)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CommunicationOptions) and all(
            getattr(self, n) == getattr(other, n) for n in self.__slots__)

    def __repr__(self) -> str:
        return (f"CommunicationOptions(bytes_per_pack={self.bytes_per_pack}, timeout_seconds="
                f"{self.timeout_seconds}, implementation={self.implementation.name})")


class CollectiveHints(CommunicationOptions):
    """Deprecated TensorFlow name: ``CollectiveHints(bytes_per_pack=0, timeout_seconds=None)``."""

    __slots__ = ()

    def __init__(self, bytes_per_pack: int = 0, timeout_seconds: float | None = None) -> None:
        super().__init__(bytes_per_pack=bytes_per_pack, timeout_seconds=timeout_seconds)


def as_options(value: Any, where: str) -> CommunicationOptions:
    """Accept None, our options, or TensorFlow's CommunicationOptions/CollectiveHints objects."""
    if value is None:
        return CommunicationOptions()
    if isinstance(value, CommunicationOptions):
        return value
    if hasattr(value, "bytes_per_pack") and hasattr(value, "timeout_seconds"):
        return CommunicationOptions(value.bytes_per_pack, value.timeout_seconds,
                                    getattr(value, "implementation", CommunicationImplementation.AUTO))
    raise TypeError(f"{where}: `options` must be a CommunicationOptions (or CollectiveHints), "
                    f"got {type(value).__name__}")
