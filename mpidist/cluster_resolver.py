"""``mpidist.cluster_resolver``: the cluster from the MPI communicator, never from TF_CONFIG.

``MPIClusterResolver(comm=None)`` is collective over ``comm``: every rank picks a free TCP port and
the ranks exchange ``host:port``. It answers what TensorFlow's cluster resolvers answer
(``task_type`` "worker", ``task_id`` = rank, ``cluster_spec()``, ``master()``, ``num_accelerators()``),
so it can also hand TensorFlow's own strategies a cluster without hand-written TF_CONFIG::

    resolver = mpidist.cluster_resolver.MPIClusterResolver()
    tf_strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
    # or, for code that reads the environment:  os.environ["TF_CONFIG"] = json.dumps(resolver.tf_config())
"""
from __future__ import annotations

import socket
import sys
from typing import Any

from mpi4py import MPI

from .topology import validate_comm

__all__ = ["MPIClusterResolver"]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _gpu_count() -> int:
    tf = sys.modules.get("tensorflow")
    if tf is not None:
        return len(tf.config.list_physical_devices("GPU"))
    try:
        import cupy
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # no cupy, or no CUDA driver
        return 0


class MPIClusterResolver:
    """Cluster of the ranks of ``comm`` (default COMM_WORLD); one "worker" task per rank."""

    def __init__(self, comm: MPI.Intracomm | None = None, *, rpc_layer: str = "grpc", port: int | None = None) -> None:
        self.comm = validate_comm(comm, "MPIClusterResolver")
        if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536):
            raise ValueError(f"MPIClusterResolver: `port` must be None or a TCP port number, got {port!r}")
        host = socket.gethostname()
        self._addresses: list[str] = self.comm.allgather(f"{host}:{port or _free_port()}")
        self.task_type = "worker"
        self.task_id = self.comm.Get_rank()
        self.rpc_layer = rpc_layer
        self.environment = ""

    def cluster_spec(self) -> Any:
        """``{"worker": [host:port, ...]}`` in rank order; a ``tf.train.ClusterSpec`` when TF is loaded."""
        spec = {"worker": list(self._addresses)}
        tf = sys.modules.get("tensorflow")
        return tf.train.ClusterSpec(spec) if tf is not None else spec

    def master(self, task_type: str | None = None, task_id: int | None = None, rpc_layer: str | None = None) -> str:
        """The address of a task (default: this one), with the rpc layer prefix."""
        if task_type not in (None, "worker"):
            raise ValueError(f"MPIClusterResolver.master: `task_type` must be 'worker' or None, got {task_type!r}")
        index = self.task_id if task_id is None else task_id
        if not 0 <= index < len(self._addresses):
            raise ValueError(f"MPIClusterResolver.master: `task_id` must be in [0, {len(self._addresses)}), got {index}")
        layer = self.rpc_layer if rpc_layer is None else rpc_layer
        return f"{layer}://{self._addresses[index]}" if layer else self._addresses[index]

    def num_accelerators(self, task_type: str | None = None, task_id: int | None = None,
                         config_proto: Any = None) -> dict[str, int]:
        """Accelerators visible to this rank: ``{"GPU": n}`` (empty dict when there are none)."""
        n = _gpu_count()
        return {"GPU": n} if n else {}

    def tf_config(self) -> dict[str, Any]:
        """The TF_CONFIG dictionary equivalent to this resolver (for code that reads the environment)."""
        return {"cluster": {"worker": list(self._addresses)}, "task": {"type": "worker", "index": self.task_id}}

    def __repr__(self) -> str:
        return f"MPIClusterResolver(task_id={self.task_id}, workers={len(self._addresses)})"
