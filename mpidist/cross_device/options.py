"""Communication options: what ``tf.distribute.experimental`` calls CommunicationOptions,
CollectiveHints and CommunicationImplementation (alias CollectiveCommunication), with the same
constructor signatures, carried down to the engine as ``bytes_per_pack``, ``timeout_seconds`` and
the implementation choice.

- ``AUTO``: mpidist picks per buffer and topology (host buffers: MPI; GPU buffers: NCCL inside the
  node where available).
- ``RING``: the MPI path only (the name TensorFlow uses for its non-NCCL collectives).
- ``NCCL``: NCCL inside the node for GPU buffers; a clear error where NCCL is unavailable.

Each field is None when not set (the default: ``mpidist.rc`` applies; when merging, the other
options' value), and 0 is a value over ``rc``, as in every layer (mpidist/validation.py):

- ``bytes_per_pack``: None = not set, 0 = automatic packing, > 0 = pack size in bytes
  (TensorFlow's default is 0 and its objects cannot tell "not set" from 0: their 0 is taken as not
  set, :func:`as_options`);
- ``timeout_seconds``: None = not set, 0 = no deadline (TensorFlow's "no timeout"), > 0 = seconds.

These are the public API's options. They become the one per-call options type of every layer
below, :class:`~mpidist.collectives.options.CallOptions`, once, where they come in
(:meth:`CommunicationOptions.call_options`; :func:`call_options_of` for an argument).

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
    name = check_choice(value, where, "implementation", IMPLEMENTATIONS, upper=True)
    return CommunicationImplementation[name.upper()]


class CommunicationOptions:
    """Options for cross-replica communication (``tf.distribute.experimental.CommunicationOptions``).

    ``bytes_per_pack``: pack size for nests (None = not set: ``rc.bytes_per_pack``; 0 = automatic);
    ``timeout_seconds``: deadline of each collective (None = not set: ``rc.timeout_seconds``; 0 =
    no deadline); ``implementation``:
    AUTO, RING or NCCL; ``compression`` (mpidist only, keyword): none, float16 or bfloat16 for
    float32 SUM/MEAN allreduce data on the wire (None = not set: ``rc.compression``).
    """

    __slots__ = ("bytes_per_pack", "timeout_seconds", "implementation", "compression")

    def __init__(self, bytes_per_pack: int | None = None, timeout_seconds: float | None = None,
                 implementation: Any = CommunicationImplementation.AUTO, *, compression: Any = None) -> None:
        where = "CommunicationOptions"
        self.bytes_per_pack = check_bytes_per_pack(bytes_per_pack, where, optional=True)
        self.timeout_seconds = check_timeout(timeout_seconds, where)
        self.implementation = _implementation(implementation, where)
        self.compression = check_compression(compression, where, optional=True)

    def merge(self, other: CommunicationOptions | None) -> CommunicationOptions:
        """``other``'s non-default fields over this one's (TensorFlow's merge rule)."""
        if other is None:
            return self
        return CommunicationOptions(
            other.bytes_per_pack if other.bytes_per_pack is not None else self.bytes_per_pack,
            other.timeout_seconds if other.timeout_seconds is not None else self.timeout_seconds,
            other.implementation if other.implementation is not CommunicationImplementation.AUTO
            else self.implementation,
            compression=other.compression if other.compression is not None else self.compression)

    def call_options(self) -> CallOptions:
        """These options as the per-call options of every layer below (the one conversion)."""
        return CallOptions(self.bytes_per_pack, self.timeout_seconds, self.implementation.value.lower(),
                           compression=self.compression)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CommunicationOptions) and all(
            getattr(self, n) == getattr(other, n) for n in self.__slots__)

    def __repr__(self) -> str:
        return (f"CommunicationOptions(bytes_per_pack={self.bytes_per_pack}, timeout_seconds="
                f"{self.timeout_seconds}, implementation={self.implementation.name}"
                + (f", compression={self.compression!r})" if self.compression is not None else ")"))


class CollectiveHints(CommunicationOptions):
    """Deprecated TensorFlow name: ``CollectiveHints(bytes_per_pack=None, timeout_seconds=None)``."""

    __slots__ = ()

    def __init__(self, bytes_per_pack: int | None = None, timeout_seconds: float | None = None) -> None:
        super().__init__(bytes_per_pack=bytes_per_pack, timeout_seconds=timeout_seconds)


def as_options(value: Any, where: str) -> CommunicationOptions:
    """Accept None, our options, or TensorFlow's CommunicationOptions/CollectiveHints objects."""
    if value is None:
        return CommunicationOptions()
    if isinstance(value, CommunicationOptions):
        return value
    if hasattr(value, "bytes_per_pack") and hasattr(value, "timeout_seconds"):  # TensorFlow's: 0 is its default
        return CommunicationOptions(value.bytes_per_pack or None, value.timeout_seconds,
                                    getattr(value, "implementation", CommunicationImplementation.AUTO),
                                    compression=getattr(value, "compression", None))
    raise TypeError(f"{where}: `options` must be a CommunicationOptions (or CollectiveHints), "
                    f"got {type(value).__name__}")


def hints_and_options(options: Any, experimental_hints: Any, where: str) -> CommunicationOptions | None:
    """``experimental_hints`` (CollectiveHints, TensorFlow 2.2-2.4's keyword) with ``options``' set
    fields over it, as one CommunicationOptions (ours or TensorFlow's objects); None when neither
    is given."""
    if experimental_hints is None:
        return None if options is None else as_options(options, where)
    return as_options(experimental_hints, where).merge(as_options(options, where))


def call_options_of(options: Any, where: str, experimental_hints: Any = None) -> CallOptions:
    """A call's ``options`` (and ``experimental_hints``) argument as the per-call options of the
    layers below: the one conversion at the API's edge."""
    merged = hints_and_options(options, experimental_hints, where)
    return _NOTHING_SET if merged is None else merged.call_options()


_NOTHING_SET = CallOptions()
