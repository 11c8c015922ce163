"""Per-call options of one collective: :class:`CallOptions`, and what they resolve to.

One type carries what a collective gets besides its data, on every path below the public API:
the engine's keyword arguments (``bytes_per_pack=``, ``num_packs=``, ``algorithm=``,
``timeout_seconds=``) are turned into one; the public API's CommunicationOptions /
CollectiveHints are turned into one once, where they come in (``CommunicationOptions.call_options()``),
and from there the strategies, the cross-device ops, the TensorFlow bridge and the engine
(``options=``) all pass this one. Every field means "not set here" when None (``implementation``:
when "auto"), so the defaults in ``mpidist.rc`` apply; 0 is a value, over ``rc``:
``bytes_per_pack=0`` automatic packing, ``timeout_seconds=0`` no deadline (see
mpidist/validation.py for the one meaning of each value). ``compression`` ("none", "float16",
"bfloat16"; None: ``rc.compression``) is carried by ``options=`` only: the engine has no keyword
argument for it (see compression.py).

:meth:`CallOptions.resolve` turns options into :class:`Resolved`: every field concrete, the
defaults filled in, the deadline as seconds or None (no deadline). That is what the pipeline,
the agreement key and the collective modules use.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from .._config import rc
from ..validation import (
    NO_DEADLINE,
    check_bytes_per_pack,
    check_choice,
    check_compression,
    check_num_packs,
    check_timeout,
)

ALGORITHMS = ("auto", "flat", "hierarchical")


class CommunicationImplementation(enum.Enum):
    """``tf.distribute.experimental.CommunicationImplementation``: AUTO, RING (MPI only) or NCCL
    (for device buffers). Defined here, at the bottom, and re-exported by mpidist.cross_device;
    :class:`CallOptions` and the GPU path carry it as its lower-case name (:data:`IMPLEMENTATIONS`)."""

    AUTO = "AUTO"
    RING = "RING"
    NCCL = "NCCL"


IMPLEMENTATIONS = tuple(m.name.lower() for m in CommunicationImplementation)  # "auto", "ring", "nccl"


@dataclass(frozen=True)
class CallOptions:
    """What one collective gets besides the data; None (``implementation``: "auto") = the default.

    ``bytes_per_pack``: pack size in bytes (0: automatic packing); ``num_packs``: split each dtype group
    into this many packs (0: every leaf alone; not with ``bytes_per_pack``); ``algorithm``: auto,
    flat or hierarchical; ``timeout_seconds``: deadline of the whole collective (0: none);
    ``implementation``: for device buffers, auto, ring (MPI only) or nccl (``requested_by``: the API
    that asked for it, named in errors, e.g. "NcclAllReduce"); ``compression``: none, float16 or
    bfloat16 for float32 SUM/MEAN allreduce data on the wire (compression.py).
    """

    bytes_per_pack: int | None = None
    timeout_seconds: float | None = None
    implementation: str = "auto"
    num_packs: int | None = None
    algorithm: str | None = None
    compression: str | None = None
    requested_by: str | None = None
    empty: bool = field(init=False, repr=False, compare=False)  # nothing set: the engine's plain call
    # nothing but the implementation set: the engine's cached fast path still serves the call
    implementation_only: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        checked = _checked("CallOptions", self.bytes_per_pack, self.num_packs, self.algorithm,
                           self.timeout_seconds, self.implementation, self.compression)
        _set(self, checked)

    @classmethod
    def checked(cls, where: str, *, bytes_per_pack: Any = None, num_packs: Any = None, algorithm: Any = None,
                timeout_seconds: Any = None, implementation: Any = "auto", compression: Any = None) -> CallOptions:
        """CallOptions from loose arguments, errors naming ``where`` (e.g. "allreduce")."""
        checked = _checked(where, bytes_per_pack, num_packs, algorithm, timeout_seconds, implementation, compression)
        made = cls.__new__(cls)  # checked already: skip __post_init__'s second check
        _set(made, checked)
        return made

    def merged(self, over: CallOptions | None) -> CallOptions:
        """``over``'s fields that are set (not None; ``implementation``: not "auto"), over this one's.
        ``bytes_per_pack`` and ``num_packs`` go together: either is set by ``over``, or both come
        from this one."""
        if over is None or over.empty:
            return self
        if over.bytes_per_pack is not None or over.num_packs is not None:
            bpp, npk = over.bytes_per_pack, over.num_packs
        else:
            bpp, npk = self.bytes_per_pack, self.num_packs
        implementation, requested_by = (self.implementation, self.requested_by) if over.implementation == "auto" \
            else (over.implementation, over.requested_by)
        return CallOptions(bpp, self.timeout_seconds if over.timeout_seconds is None else over.timeout_seconds,
                           implementation, npk, self.algorithm if over.algorithm is None else over.algorithm,
                           self.compression if over.compression is None else over.compression, requested_by)

    def resolve(self) -> Resolved:
        """Every field concrete, rc's defaults filled in (read now: rc may have changed)."""
        timeout = rc.timeout_seconds if self.timeout_seconds is None else self.timeout_seconds
        return Resolved(rc.bytes_per_pack if self.bytes_per_pack is None else self.bytes_per_pack,
                        self.num_packs, rc.algorithm if self.algorithm is None else self.algorithm,
                        None if timeout == NO_DEADLINE else timeout, self.implementation,
                        rc.compression if self.compression is None else self.compression, self.requested_by)


_FIELDS = ("bytes_per_pack", "num_packs", "algorithm", "timeout_seconds", "implementation",
           "compression")  # _checked's order


def _set(options: CallOptions, checked: tuple) -> None:
    for name, value in zip(_FIELDS, checked):
        object.__setattr__(options, name, value)
    bpp, npk, alg, timeout, impl, comp = checked
    rest = bpp is None and npk is None and alg is None and timeout is None and comp is None
    object.__setattr__(options, "empty", rest and impl == "auto")
    object.__setattr__(options, "implementation_only", rest)


def _checked(where: str, bytes_per_pack: Any, num_packs: Any, algorithm: Any, timeout_seconds: Any,
             implementation: Any, compression: Any = None) -> tuple:
    # (None and "auto" are the common values: skip the calls for them)
    bpp = None if bytes_per_pack is None else check_bytes_per_pack(bytes_per_pack, where)
    npk = None if num_packs is None else check_num_packs(num_packs, where)
    if bpp and npk is not None:
        raise ValueError(f"{where}: give `bytes_per_pack` or `num_packs`, not both "
                         f"(got {bytes_per_pack!r} and {num_packs!r})")
    alg = None if algorithm is None else check_choice(algorithm, where, "algorithm", ALGORITHMS)
    impl = "auto" if implementation == "auto" else \
        check_choice(implementation, where, "implementation", IMPLEMENTATIONS, upper=True)
    comp = None if compression is None else check_compression(compression, where)
    return bpp, npk, alg, None if timeout_seconds is None else check_timeout(timeout_seconds, where), impl, comp


class Resolved:
    """Options with every field concrete: ``timeout`` is the deadline in seconds or None (none)."""

    __slots__ = ("bytes_per_pack", "num_packs", "algorithm", "timeout", "implementation", "compression",
                 "requested_by")

    def __init__(self, bytes_per_pack: int, num_packs: int | None, algorithm: str, timeout: float | None,
                 implementation: str = "auto", compression: str = "none", requested_by: str | None = None) -> None:
        self.bytes_per_pack, self.num_packs, self.algorithm = bytes_per_pack, num_packs, algorithm
        self.timeout, self.implementation, self.compression = timeout, implementation, compression
        self.requested_by = requested_by

    @staticmethod
    def defaults() -> Resolved:
        """rc's defaults (the hot path: no per-call options); shared, rebuilt when rc changes."""
        cached = _defaults[0]
        if cached is None or _defaults[1] != rc.generation:
            cached = _defaults[0] = Resolved(rc.bytes_per_pack, None, rc.algorithm, rc.timeout_seconds,
                                             compression=rc.compression)
            _defaults[1] = rc.generation
        return cached

    @staticmethod
    def from_arguments(where: str, bytes_per_pack: Any, num_packs: Any, algorithm: Any,
                       timeout_seconds: Any) -> Resolved:
        """The engine's keyword arguments, checked and resolved (no CallOptions in between)."""
        bpp, npk, alg, timeout, _, _ = _checked(where, bytes_per_pack, num_packs, algorithm, timeout_seconds, "auto")
        if timeout is None:
            timeout = rc.timeout_seconds
        return Resolved(rc.bytes_per_pack if bpp is None else bpp, npk, rc.algorithm if alg is None else alg,
                        None if timeout == NO_DEADLINE else timeout, compression=rc.compression)

    def __repr__(self) -> str:
        return (f"Resolved(bytes_per_pack={self.bytes_per_pack}, num_packs={self.num_packs}, "
                f"algorithm={self.algorithm!r}, timeout={self.timeout}, implementation={self.implementation!r}, "
                f"compression={self.compression!r})")


_defaults: list[Any] = [None, -1]  # (Resolved of rc's defaults, rc.generation it was built at)
