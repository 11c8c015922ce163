"""The public CrossDeviceOps classes, one per kind: ``mpidist.CrossDeviceOps``, ``MPIAllReduce``,
``NcclAllReduce``, ``HierarchicalCopyAllReduce`` and ``ReductionToOneDevice``.

Each sets what the base class of the cross-device layer (mpidist/cross_device/ops.py) works from:
its algorithm, packing, implementation for device buffers, or root. They sit in the top layer
because ``reduce``, ``batch_reduce`` and ``broadcast`` also take TensorFlow values (tensors,
variables, distributed values, nests of them) once the program has imported TensorFlow: those go to
``mpidist.tensorflow.cross_device``, which runs this object's own reduction on their arrays. NumPy
values never load TensorFlow.

- ``MPIAllReduce(bytes_per_pack=None)``: the engine's automatic choice (flat or hierarchical);
  ``bytes_per_pack`` as everywhere (None: the call's, else ``rc``'s; 0: automatic packing);
- ``NcclAllReduce(num_packs=1)``: NCCL inside the node for GPU buffers and MPI across nodes; host
  buffers take the MPI path, said once in the log; GPU buffers where NCCL is unusable are an error
  on every rank (``NcclAllReduce: NCCL is not available: <why>``);
- ``HierarchicalCopyAllReduce(num_packs=1)``: reduce inside the node, allreduce across node leaders,
  broadcast inside the node;
- ``ReductionToOneDevice(reduce_to_device=None)``: reduce to the root rank, then broadcast.
"""
from __future__ import annotations

import logging
import sys
from types import ModuleType
from typing import Any, Iterable

from . import cross_device as _cd
from .collectives.options import CallOptions
from .validation import check_bytes_per_pack, check_num_packs

_log = logging.getLogger("mpidist")

_tf_values_state: list[Any] = []  # [mpidist.tensorflow.cross_device or None] once TensorFlow was seen


def _tf_values() -> ModuleType | None:
    """``mpidist.tensorflow.cross_device`` when the program has imported TensorFlow, else None (never
    imports TensorFlow). An untested TensorFlow that breaks it leaves NumPy values working."""
    if _tf_values_state:
        return _tf_values_state[0]
    if "tensorflow" not in sys.modules:
        return None
    try:
        from .tensorflow import cross_device as found
    except ImportError as error:
        _log.warning("mpidist: CrossDeviceOps cannot take TensorFlow values in this process: %s", error)
        _tf_values_state.append(None)
        return None
    found.not_converted(CrossDeviceOps)  # library code: AutoGraph must not convert it
    _tf_values_state.append(found)
    return found


def _taker(values: Iterable[Any]) -> ModuleType | None:
    module = _tf_values()
    return module if module is not None and any(module.handles(v) for v in values) else None


class CrossDeviceOps(_cd.CrossDeviceOps):
    """Base class: reduce, batch_reduce and broadcast across the replicas of a strategy, on NumPy
    and CuPy values (``mpidist.cross_device.CrossDeviceOps``) and on TensorFlow values: those are
    reduced or broadcast in one call of the TensorFlow bridge, and come back as ``tf.Tensor`` results
    in the same nest."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _tf_values()  # built after `import tensorflow`: mark the methods before any tf.function calls them

    def reduce(self, reduce_op: Any, per_replica_value: Any, destinations: Any = None, options: Any = None) -> Any:
        taker = _taker([per_replica_value])
        if taker is None:
            return super().reduce(reduce_op, per_replica_value, destinations, options)
        where = f"{type(self).__name__}.reduce"
        return taker.reduce(self, _cd.as_reduce_op(reduce_op, where), per_replica_value,
                            _cd.call_options_of(options, where), where)

    def batch_reduce(self, reduce_op: Any, value_destination_pairs: Iterable[tuple[Any, Any]],
                     options: Any = None) -> list[Any]:
        pairs = list(value_destination_pairs)
        taker = _taker([v for v, _ in pairs])
        if taker is None:
            return super().batch_reduce(reduce_op, pairs, options)
        where = f"{type(self).__name__}.batch_reduce"
        return list(taker.batch_reduce(self, _cd.as_reduce_op(reduce_op, where), [v for v, _ in pairs],
                                       _cd.call_options_of(options, where), where))

    def broadcast(self, tensor: Any, destinations: Any = None, root: int = 0) -> Any:
        taker = _taker([tensor])
        if taker is None:
            return super().broadcast(tensor, destinations, root)
        return taker.broadcast(self, tensor, root, f"{type(self).__name__}.broadcast")


class MPIAllReduce(CrossDeviceOps):
    """MPI allreduce, flat or hierarchical as the engine picks (``rc.algorithm``)."""

    def __init__(self, bytes_per_pack: int | None = None) -> None:
        super().__init__()
        self.bytes_per_pack = check_bytes_per_pack(bytes_per_pack, "MPIAllReduce", optional=True)

    def _packing(self) -> dict[str, Any]:
        return {"bytes_per_pack": self.bytes_per_pack} if self.bytes_per_pack is not None else {}


_nccl_host_told = False  # NcclAllReduce logged once that host buffers use MPI


class NcclAllReduce(CrossDeviceOps):
    """NCCL inside the node for GPU buffers, MPI across nodes; host buffers use MPI."""

    def __init__(self, num_packs: int = 1) -> None:
        super().__init__()
        self.num_packs = check_num_packs(num_packs, "NcclAllReduce")

    def _packing(self) -> dict[str, Any]:
        return {"num_packs": self.num_packs}

    def _implementation(self, options: CallOptions | None) -> tuple[str, str | None]:
        return "nccl", "NcclAllReduce"

    def all_reduce_local(self, op: _cd.ReduceOp, value: Any, options: CallOptions, where: str) -> Any:
        global _nccl_host_told
        if not _nccl_host_told:
            _nccl_host_told = True
            if self.engine.rank == 0:
                _log.info("NcclAllReduce: host (NumPy) buffers are reduced with MPI; NCCL serves GPU "
                          "(CuPy) buffers")
        return super().all_reduce_local(op, value, options, where)


class HierarchicalCopyAllReduce(CrossDeviceOps):
    """Reduce inside the node, allreduce across node leaders, broadcast inside the node."""

    algorithm = "hierarchical"

    def __init__(self, num_packs: int = 1) -> None:
        super().__init__()
        self.num_packs = check_num_packs(num_packs, "HierarchicalCopyAllReduce")

    def _packing(self) -> dict[str, Any]:
        return {"num_packs": self.num_packs}


class ReductionToOneDevice(CrossDeviceOps):
    """Reduce to one rank (``reduce_to_device`` names it: a rank number or a device string whose
    ``task:N`` gives it; default rank 0), then broadcast from there."""

    def __init__(self, reduce_to_device: Any = None, accumulation_fn: Any = None) -> None:
        super().__init__()
        self.root = _cd.root_of(reduce_to_device)
        if accumulation_fn is not None:
            _log.info("ReductionToOneDevice: `accumulation_fn` is ignored; the reduction runs in MPI")


__all__ = ["CrossDeviceOps", "MPIAllReduce", "NcclAllReduce", "HierarchicalCopyAllReduce", "ReductionToOneDevice"]
