"""The concrete strategies, with TensorFlow's constructor signatures plus ``comm=``.

Each builds its engine from MPI: MultiWorkerMirrored and CentralStorage over the whole
communicator, Mirrored over the ranks of this node, OneDevice over this rank alone. These classes
always build on NumPy. Their ``_setup`` (engine, options, cross-device ops, resolver, the rest) is
shared with the TensorFlow classes (``mpidist.tensorflow.X``, which build mpidist's genuine
``tf.distribute.Strategy`` from it); the public classes (``mpidist.X``, mpidist/frameworks.py)
choose between the two when called.
"""
from __future__ import annotations

import logging
from typing import Any, cast

from mpi4py import MPI

from ..cluster_resolver import MPIClusterResolver, check_agreement
from ..collectives import Engine, gpu
from ..cross_device import (
    CommunicationImplementation,
    CommunicationOptions,
    CrossDeviceOps,
    MPIAllReduce,
    ReductionToOneDevice,
    as_options,
)
from ..errors import GpuUnavailableError
from ..topology import Topology, validate_comm
from .base import Strategy, StrategyExtended

_log = logging.getLogger("mpidist")


def _resolver_comm(cluster_resolver: Any, comm: Any, where: str) -> Any:
    """The communicator of the strategy: ``comm``, or an MPIClusterResolver's. TensorFlow's resolvers
    (TF_CONFIG, Slurm, a ClusterSpec) are accepted when their cluster is ``comm``'s (checked, collective),
    else a ValueError on every rank names the difference (cluster_resolver.check_agreement)."""
    if cluster_resolver is None:
        return comm
    resolver_comm = getattr(cluster_resolver, "comm", None)
    if resolver_comm is None:
        check_agreement(cluster_resolver, validate_comm(comm, where), where)
        return comm
    if comm is not None and comm is not resolver_comm:
        raise ValueError(f"{where}: give `comm` or an MPIClusterResolver, not both")
    return resolver_comm


def _default_resolver(cluster_resolver: Any, comm: Any) -> Any:
    """The resolver given, else an MPIClusterResolver of ``comm`` (collective over ``comm``, as
    building the strategy is), as TensorFlow's MWMS defaults to a TFConfigClusterResolver."""
    return MPIClusterResolver(comm) if cluster_resolver is None else cluster_resolver


def _check_implementation(options: CommunicationOptions, engine: Engine, where: str) -> None:
    """NCCL asked for where some rank cannot use it: the same clear error on every rank (collective)."""
    if options.implementation is not CommunicationImplementation.NCCL:
        return
    reasons = engine.topology.comm.allgather(gpu.nccl_reason())
    missing = [r for r, reason in enumerate(reasons) if reason is not None]
    if missing:
        reason = reasons[missing[0]]
        if len(missing) < len(reasons) or len(set(reasons)) > 1:
            reason = f"on rank {missing[0]}: {reason}"
        engine.close()  # every rank is here (the allgather above), so the collective close is safe
        raise GpuUnavailableError(gpu.unavailable_message(where, reason))


def _bind_gpu(engine: Engine) -> None:
    """One GPU per rank by local rank, when the program uses CuPy (see collectives/gpu/binding.py);
    not for OneDeviceStrategy, whose engine of one rank knows no local rank."""
    if engine.size > 1:
        gpu.bind_device(engine.topology)


# What a strategy is built from: engine, options, cross-device ops, cluster resolver, the rest (devices)
Parts = tuple[Engine, CommunicationOptions, "CrossDeviceOps | None", Any, dict[str, Any]]


class _Concrete(Strategy):
    """A strategy built from its constructor's arguments; subclasses define ``_setup``, which
    builds the engine (collective), binds this rank's GPU and returns the parts (``Parts``) that
    the NumPy strategy here and the TensorFlow one (``mpidist.tensorflow.X``) are made of."""

    _kind = ""  # the TensorFlow strategy this class stands for (mpidist.tensorflow.KINDS)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        engine, options, cross_ops, resolver, _ = self._setup(*args, **kwargs)
        super().__init__(engine, options, cross_ops, resolver)

    @classmethod
    def _setup(cls, *args: Any, **kwargs: Any) -> Parts:
        raise NotImplementedError


class MultiWorkerMirroredStrategy(_Concrete):
    """Synchronous data parallelism over every rank of ``comm`` (default COMM_WORLD).

    ``MultiWorkerMirroredStrategy(cluster_resolver=None, communication_options=None, *, comm=None)``.
    """

    _kind = "MultiWorkerMirroredStrategy"

    @classmethod
    def _setup(cls, cluster_resolver: Any = None, communication_options: Any = None, *, comm: Any = None,
               _communication: Any = None) -> Parts:
        where = cls.__name__
        comm = validate_comm(_resolver_comm(cluster_resolver, comm, where), where)
        options = as_options(communication_options, where)
        if _communication is not None:
            options = CommunicationOptions(options.bytes_per_pack, options.timeout_seconds, _communication,
                                           compression=options.compression)
        engine = Engine(comm)
        _check_implementation(options, engine, where)
        _bind_gpu(engine)
        return engine, options, MPIAllReduce(), _default_resolver(cluster_resolver, comm), {}


class ExperimentalMultiWorkerMirroredStrategy(MultiWorkerMirroredStrategy):
    """``tf.distribute.experimental.MultiWorkerMirroredStrategy(communication=AUTO, cluster_resolver=None,
    communication_options=None)``, plus ``comm=``."""

    # TensorFlow's experimental class takes `communication` first, and isinstance(s, MWMS) must hold:
    # a subclass with another constructor signature, on purpose
    @classmethod
    def _setup(cls, communication: Any = CommunicationImplementation.AUTO,  # type: ignore[override]  # see above
               cluster_resolver: Any = None, communication_options: Any = None, *, comm: Any = None) -> Parts:
        return super()._setup(cluster_resolver, communication_options, comm=comm, _communication=communication)


class MirroredStrategy(_Concrete):
    """Synchronous data parallelism over the ranks of this node (one replica per rank).

    ``MirroredStrategy(devices=None, cross_device_ops=None, *, comm=None)``: the replicas are the ranks
    of ``comm`` (default COMM_WORLD) that share this node. ``devices`` may name at most one device:
    launch one rank per device.
    """

    _kind = "MirroredStrategy"

    @classmethod
    def _setup(cls, devices: Any = None, cross_device_ops: Any = None, *, comm: Any = None) -> Parts:
        where = cls.__name__
        if devices is not None and len(list(devices)) > 1:
            raise ValueError(f"{where}: `devices` lists {len(list(devices))} devices, but each rank hosts one "
                             f"replica; launch one rank per device (mpirun -n <devices>) and pass at most one")
        if cross_device_ops is not None and not isinstance(cross_device_ops, CrossDeviceOps):
            raise TypeError(f"{where}: `cross_device_ops` must be an mpidist CrossDeviceOps "
                            f"(NcclAllReduce, HierarchicalCopyAllReduce, ReductionToOneDevice, MPIAllReduce), "
                            f"got {type(cross_device_ops).__name__}")
        topology = Topology(validate_comm(comm, where))
        engine = Engine(cast(MPI.Intracomm, topology.local))  # clones the node's communicator: ours can go
        topology.free()
        _bind_gpu(engine)
        return engine, CommunicationOptions(), cross_device_ops, None, {"devices": devices}


class OneDeviceStrategy(_Concrete):
    """One replica on this rank alone: no communication. ``OneDeviceStrategy(device)``."""

    _kind = "OneDeviceStrategy"

    @classmethod
    def _setup(cls, device: Any = None) -> Parts:
        return Engine(MPI.COMM_SELF), CommunicationOptions(), None, None, {"devices": [device] if device else None}


class CentralStorageExtended(StrategyExtended):
    """Variables and updates live on the chief: updates run on rank 0, then rank 0's result is
    broadcast; reductions go to rank 0 and back (ReductionToOneDevice)."""

    def update(self, var: Any, fn: Any, args: tuple = (), kwargs: dict | None = None, group: bool = True) -> Any:
        result = super().update(var, fn, args, kwargs, group) if self.rank == 0 else var
        return self._cross_device_ops.broadcast(result if result is not None else var)


class CentralStorageStrategy(_Concrete):
    """``tf.distribute.experimental.CentralStorageStrategy(compute_devices=None, parameter_device=None)``,
    plus ``comm=``: replicas are the ranks; variables and their updates live on the chief (rank 0)."""

    _kind = "CentralStorageStrategy"
    _extended_class = CentralStorageExtended

    @classmethod
    def _setup(cls, compute_devices: Any = None, parameter_device: Any = None, *, comm: Any = None) -> Parts:
        where = cls.__name__
        engine = Engine(validate_comm(comm, where))
        _bind_gpu(engine)
        return engine, CommunicationOptions(), ReductionToOneDevice(0), None, {"devices": compute_devices}
