"""Communication options: what ``tf.distribute.experimental`` calls CommunicationOptions,
CollectiveHints and CommunicationImplementation (alias CollectiveCommunication), with the same
constructor signatures, carried down to the engine as ``bytes_per_pack``, ``timeout_seconds`` and
the implementation choice.

- ``AUTO``: mpidist picks per buffer and topology (host buffers: MPI; GPU buffers: NCCL inside the
  node where available).
- ``RING``: the MPI path only (the name TensorFlow uses for its non-NCCL collectives).
- ``NCCL``: NCCL inside the node for GPU buffers; a clear error where NCCL is unavailable.

``timeout_seconds``: None = not set (``rc.timeout_seconds`` applies; when merging, the other
options' value), 0 = no deadline (TensorFlow's "no timeout"; it wins over ``rc.timeout_seconds``),
> 0 = seconds. :meth:`CommunicationOptions.call_options` gives the engine's per-call options.

``compression`` is an **mpidist extension** (TensorFlow's CommunicationOptions has no such
argument): "float16" or "bfloat16" sends float32 SUM/MEAN allreduce data in that format and sums
it in float32 after decompression; "none" sends it unchanged; None (the default) = not set
(``rc.compression``, env ``MPIDIST_COMPRESSION``, applies; when merging, the other options'
value). Other dtypes and ops travel unchanged. See docs/compression.md.
"""
from __future__ import annotations

from typing import Any

from ..collectives.options import IMPLEMENTATIONS, CallOptions, CommunicationImplementation
from ..validation import check_bytes_per_pack, check_choice, check_compression, check_timeout


CollectiveCommunication = CommunicationImplementation


def _implementation(value: Any, where: str) -> CommunicationImplementation:
    if isinstance(value, CommunicationImplementation):
        return value
    # TensorFlow's own enum members work too (by name)
    return CommunicationImplementation[check_choice(value, where, "implementation", IMPLEMENTATIONS, upper=True).upper()]


class CommunicationOptions:
    """Options for cross-replica communication (``tf.distribute.experimental.CommunicationOptions``).

    ``bytes_per_pack``: pack size for nests (0 = automatic); ``timeout_seconds``: deadline of each
    collective (None = not set: ``rc.timeout_seconds``; 0 = no deadline); ``implementation``:
    AUTO, RING or NCCL; ``compression`` (mpidist only, keyword): none, float16 or bfloat16 for
    float32 SUM/MEAN allreduce data on the wire (None = not set: ``rc.compression``).
    """

    __slots__ = ("bytes_per_pack", "timeout_seconds", "implementation", "compression")

    def __init__(self, bytes_per_pack: int = 0, timeout_seconds: float | None = None,
                 implementation: Any = CommunicationImplementation.AUTO, *, compression: Any = None) -> None:
        where = "CommunicationOptions"
        self.bytes_per_pack = check_bytes_per_pack(bytes_per_pack, where)
        self.timeout_seconds = check_timeout(timeout_seconds, where)
        self.implementation = _implementation(implementation, where)
        self.compression = check_compression(compression, where, optional=True)

    def merge(self, other: "CommunicationOptions | None") -> "CommunicationOptions":
        """``other``'s non-default fields over this one's (TensorFlow's merge rule)."""
        if other is None:
            return self
        return CommunicationOptions(
            other.bytes_per_pack or self.bytes_per_pack,
            other.timeout_seconds if other.timeout_seconds is not None else self.timeout_seconds,
            other.implementation if other.implementation is not CommunicationImplementation.AUTO
            else self.implementation,
            compression=other.compression if other.compression is not None else self.compression)

    def call_options(self) -> CallOptions:
        """These options as the engine's per-call options (0 bytes_per_pack: not set)."""
        return CallOptions(self.bytes_per_pack or None, self.timeout_seconds, self.implementation.value.lower(),
                           compression=self.compression)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CommunicationOptions) and all(
            getattr(self, n) == getattr(other, n) for n in self.__slots__)

    def __repr__(self) -> str:
        return (f"CommunicationOptions(bytes_per_pack={self.bytes_per_pack}, timeout_seconds="
                f"{self.timeout_seconds}, implementation={self.implementation.name}"
                + (f", compression={self.compression!r})" if self.compression is not None else ")"))


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
                                    getattr(value, "implementation", CommunicationImplementation.AUTO),
                                    compression=getattr(value, "compression", None))
    raise TypeError(f"{where}: `options` must be a CommunicationOptions (or CollectiveHints), "
                    f"got {type(value).__name__}")
