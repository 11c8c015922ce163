"""What each strategy is built from: its engine, options, cross-device ops, cluster resolver and the
rest, from TensorFlow's constructor arguments plus ``comm=``.

MultiWorkerMirrored and CentralStorage build their engine over the whole communicator, Mirrored over
the ranks of this node, OneDevice over this rank alone. The public classes (mpidist/frameworks.py)
call these builders from their constructors, on NumPy and on TensorFlow alike; building is collective
(the engine clones the communicator) and binds this rank's GPU where the program uses CuPy.
"""
from __future__ import annotations

from typing import Any, cast

from mpi4py import MPI

from ..cluster_resolver import MPIClusterResolver, check_agreement
from ..collectives import Engine, gpu
from ..cross_device import (
    CommunicationImplementation,
    CommunicationOptions,
    CrossDeviceOps,
    as_options,
    reduction_to_root,
)
from ..errors import GpuUnavailableError
from ..topology import Topology, validate_comm


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


def multi_worker(where: str, cluster_resolver: Any = None, communication_options: Any = None, comm: Any = None,
                 communication: Any = None) -> Parts:
    """MultiWorkerMirroredStrategy: every rank of ``comm`` (default COMM_WORLD) or of the resolver's;
    ``communication``: the experimental class's first argument (a CommunicationImplementation)."""
    comm = validate_comm(_resolver_comm(cluster_resolver, comm, where), where)
    options = as_options(communication_options, where)
    if communication is not None:
        options = CommunicationOptions(options.bytes_per_pack, options.timeout_seconds, communication,
                                       compression=options.compression)
    engine = Engine(comm)
    _check_implementation(options, engine, where)
    _bind_gpu(engine)
    return engine, options, CrossDeviceOps(), _default_resolver(cluster_resolver, comm), {}


def mirrored(where: str, devices: Any = None, cross_device_ops: Any = None, comm: Any = None) -> Parts:
    """MirroredStrategy: the ranks of ``comm`` that share this node; at most one device per rank."""
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


def one_device(where: str, device: Any = None) -> Parts:
    """OneDeviceStrategy: this rank alone (an engine over COMM_SELF), no communication."""
    return Engine(MPI.COMM_SELF), CommunicationOptions(), None, None, {"devices": [device] if device else None}


def central_storage(where: str, compute_devices: Any = None, parameter_device: Any = None, comm: Any = None) -> Parts:
    """CentralStorageStrategy: every rank of ``comm``, reductions to the chief and back."""
    engine = Engine(validate_comm(comm, where))
    _bind_gpu(engine)
    return engine, CommunicationOptions(), reduction_to_root(0), None, {"devices": compute_devices}
