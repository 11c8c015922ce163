"""CrossDeviceOps: how a strategy reduces and broadcasts across its replicas (ranks).

With one replica per rank, "devices" are ranks: ``destinations`` arguments are accepted for
compatibility and ignored. This module holds the base class, which does all the work on NumPy (and
CuPy) values from a few attributes its subclasses set: ``algorithm`` (None: the engine's choice),
``_packing()`` (``bytes_per_pack`` or ``num_packs``), ``_implementation()`` (for device buffers,
and who asked for it) and ``root`` (None: an allreduce; a rank: reduce to it, then broadcast).
The public classes, one per kind (``MPIAllReduce``, ``NcclAllReduce``, ``HierarchicalCopyAllReduce``,
``ReductionToOneDevice``), are defined once, in the top layer (mpidist/cross_device_ops.py), where they
also take TensorFlow values; strategies that need a default build one here
(``CrossDeviceOps()``: MPI allreduce; :func:`reduction_to_root`).

For device (CuPy) buffers the implementation asked for (``CommunicationOptions.implementation``,
or NCCL for NcclAllReduce) reaches the engine's GPU path in the call's options
(``CallOptions.implementation``, with ``requested_by`` naming this object in errors).

A CrossDeviceOps object is bound to a strategy's engine when the strategy is built; used on its
own it binds to an engine over COMM_WORLD on first use (collective).

The public methods take the public API's options (CommunicationOptions, CollectiveHints, or
TensorFlow's) and turn them into :class:`~mpidist.collectives.options.CallOptions` once; every
method below them (``all_reduce_local``, ``reduce_arrays``, ``broadcast_arrays``,
``implementation_for``: what the strategies and the TensorFlow layer call) takes CallOptions.
"""
from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from ..collectives import Engine
from ..collectives.options import CallOptions
from ..validation import is_integer
from .options import call_options_of
from .reduce_op import ReduceOp, as_reduce_op


def local_value(value: Any) -> Any:
    """The local component of a DistributedValues-like value (anything with ``.values``), or value."""
    values = getattr(value, "values", None)
    if isinstance(values, tuple) and len(values) == 1 and getattr(value, "is_distributed_value", False) is True:
        return values[0]
    return value


_NDARRAY = {np.ndarray}


def host_arrays_only(value: Any) -> bool:
    """Whether ``value`` is one NumPy array or a flat list, tuple or dict of them (checked without
    Python code per leaf): nothing in it for the device paths."""
    kind = type(value)
    if kind is np.ndarray:
        return True
    if kind is list or kind is tuple:
        return set(map(type, value)) == _NDARRAY
    return kind is dict and set(map(type, value.values())) == _NDARRAY


class CrossDeviceOps:
    """Base class: reduce, batch_reduce and broadcast across the replicas of a strategy."""

    algorithm: str | None = None  # None: rc.algorithm decides
    root: int | None = None  # None: allreduce; a rank: reduce to it, then broadcast from it

    def __init__(self) -> None:
        self._engine: Engine | None = None

    # -- binding -------------------------------------------------------------------------------
    def bind(self, engine: Any) -> CrossDeviceOps:
        """Run on ``engine`` (a strategy binds its cross_device_ops to its own engine); returns self."""
        self._engine = engine
        return self

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            self._engine = Engine()
        return self._engine

    def _packing(self) -> dict[str, Any]:
        return {}

    # -- the TensorFlow API ----------------------------------------------------------------------
    def reduce(self, reduce_op: Any, per_replica_value: Any, destinations: Any = None,
               options: Any = None) -> Any:
        """Reduce ``per_replica_value`` across replicas; every rank gets the result."""
        where = f"{type(self).__name__}.reduce"
        op = as_reduce_op(reduce_op, where)
        return self.all_reduce_local(op, local_value(per_replica_value), call_options_of(options, where), where)

    def batch_reduce(self, reduce_op: Any, value_destination_pairs: Iterable[tuple[Any, Any]],
                     options: Any = None) -> list[Any]:
        """Reduce several values in one logical collective; returns one result per pair."""
        where = f"{type(self).__name__}.batch_reduce"
        op = as_reduce_op(reduce_op, where)
        call = call_options_of(options, where)
        values = [local_value(v) for v, _ in value_destination_pairs]
        return list(self.all_reduce_local(op, values, call, where)) if values else []

    def broadcast(self, tensor: Any, destinations: Any = None, root: int = 0) -> Any:
        """The value of ``root`` (default rank 0) delivered to every rank."""
        return self.broadcast_arrays(local_value(tensor), root)

    # -- below the API: CallOptions (what the strategies and the TensorFlow layer call) ----------
    def reduce_arrays(self, reduce_op: Any, value: Any, options: CallOptions | None = None) -> Any:
        """This object's reduction (algorithm, packing, root) of arrays, numbers or a nest of them."""
        where = f"{type(self).__name__}.reduce"
        return self.all_reduce_local(as_reduce_op(reduce_op, where), value, options or _NOTHING_SET, where)

    def broadcast_arrays(self, value: Any, root: int = 0, options: CallOptions | None = None) -> Any:
        """``root``'s arrays (a nest) on every rank (``options``: their timeout)."""
        timeout = None if options is None else options.timeout_seconds
        implementation, who = self._implementation(None)
        return self.engine.broadcast(value, root=root, options=CallOptions(
            timeout_seconds=timeout, implementation=implementation, requested_by=who))

    def implementation_for(self, options: CallOptions | None = None) -> str:
        """The implementation device buffers take: "auto", "ring" or "nccl" (lower case)."""
        return self._implementation(options)[0].lower()

    def _implementation(self, options: CallOptions | None) -> tuple[str, str | None]:
        """(implementation for device buffers, who asked for it): the options' by default."""
        return (options.implementation if options is not None else "auto"), None

    def engine_options(self, options: CallOptions) -> CallOptions:
        """What the engine gets for a call with ``options``: this object's algorithm and packing
        (its ``num_packs`` over the call's ``bytes_per_pack``, its ``bytes_per_pack`` where the call
        sets none), the call's timeout and compression, and the implementation for device buffers
        (this object's, or the call's: :meth:`_implementation`), naming this object as who asked."""
        packing = self._packing()
        num_packs = packing.get("num_packs")
        bpp = None if num_packs is not None else \
            options.bytes_per_pack if options.bytes_per_pack is not None else packing.get("bytes_per_pack")
        implementation, who = self._implementation(options)
        return CallOptions(bpp, options.timeout_seconds, implementation, num_packs, self.algorithm,
                           options.compression, who)

    def all_reduce_local(self, op: ReduceOp, value: Any, options: CallOptions, where: str) -> Any:
        """Reduce this rank's ``value`` (a nest) across the bound engine's ranks: what strategies call."""
        if self.root is not None:
            return self._through_root(op, value, options, where)
        if self.algorithm is None and options.implementation_only and not self._packing() \
                and host_arrays_only(value):
            # host arrays and nothing set per call: the engine's cached fast path, without building
            # per-call arguments (the implementation choice only concerns device arrays)
            return self.engine.allreduce(value, op)
        return self.engine.allreduce(value, op, options=self.engine_options(options))

    def _through_root(self, op: ReduceOp, value: Any, options: CallOptions, where: str) -> Any:
        engine, root = self.engine, self.root
        assert root is not None
        if root >= engine.size:
            raise ValueError(f"{where}: `reduce_to_device` names rank {root}, but the strategy has "
                             f"{engine.size} ranks")
        implementation, who = self._implementation(options)
        call = CallOptions(timeout_seconds=options.timeout_seconds, implementation=implementation, requested_by=who)
        reduced = engine.reduce(value, op, root=root, options=call)
        return engine.broadcast(reduced if engine.rank == root else value, root=root, options=call)

    def __repr__(self) -> str:
        extra = ", ".join(f"{k}={v}" for k, v in self._packing().items())
        return f"{type(self).__name__}({extra})"


_NOTHING_SET = CallOptions()


def reduction_to_root(root: int) -> CrossDeviceOps:
    """A CrossDeviceOps reducing to rank ``root``, then broadcasting (a strategy's default)."""
    ops = CrossDeviceOps()
    ops.root = root
    return ops


def root_of(device: Any) -> int:
    """The rank ``ReductionToOneDevice(reduce_to_device=...)`` reduces to: None -> 0, a rank, or a
    device string's ``task:N`` (another string: 0)."""
    if device is None:
        return 0
    if is_integer(device) and device >= 0:
        return int(device)
    if isinstance(device, str):
        for part in device.split("/"):
            if part.startswith("task:") and part[5:].isdigit():
                return int(part[5:])
        return 0
    raise ValueError(f"ReductionToOneDevice: `reduce_to_device` must be None, a rank or a device string, "
                     f"got {device!r}")
