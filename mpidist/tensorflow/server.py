"""``mpidist.Server``: ``tf.distribute.Server`` for a task of the cluster an MPIClusterResolver derives.

TensorFlow's ParameterServerStrategy needs one process per task: a "chief" (the coordinator, which
runs the training program), "ps" tasks (they hold the variables) and "worker" tasks (they run the
functions the coordinator schedules). The ps and worker processes only serve: they start a server
and block in ``server.join()``. The chief runs no ``Server``: the strategy starts the chief's own
server when it connects to the cluster (and waits for the other servers to come up).

From one ``mpirun``/``srun``, with no TF_CONFIG::

    resolver = mpidist.cluster_resolver.MPIClusterResolver(ps=2)   # ranks 0-1 ps, 2 chief, rest workers
    if resolver.serving:
        mpidist.Server(resolver).join()
    else:
        strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
        coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
        ...

TensorFlow's ``Server.join()`` never returns. This one returns when the job is over: every
serving rank's ``join()`` and the chief's ``resolver.shutdown()`` (called for it when the chief's
interpreter exits) enter one barrier over MPI, which completes once all have entered; the serving
ranks then return from ``join()`` and end normally, so every process leaves and the launcher
returns. (TensorFlow servers cannot be stopped; they end with their process.)
"""
from __future__ import annotations

import logging
from typing import Any

import tensorflow as tf

_log = logging.getLogger("mpidist")


def _is_mpi_resolver(value: Any) -> bool:
    return hasattr(value, "cluster_spec") and hasattr(value, "shutdown") and hasattr(value, "comm")


class Server(tf.distribute.Server):
    """``tf.distribute.Server`` whose ``join()`` returns when the chief is done.

    ``Server(server_or_cluster_def, job_name=None, task_index=None, protocol=None, config=None,
    start=True, *, cluster_resolver=None)``: TensorFlow's signature. ``server_or_cluster_def`` may be
    an :class:`mpidist.cluster_resolver.MPIClusterResolver`: the cluster, job name, task index and
    protocol then come from it (arguments given explicitly win). With a cluster spec instead, pass
    the resolver as ``cluster_resolver=`` for ``join()`` to know the job's end.
    """

    def __init__(self, server_or_cluster_def: Any, job_name: str | None = None, task_index: int | None = None,
                 protocol: str | None = None, config: Any = None, start: bool = True, *,
                 cluster_resolver: Any = None) -> None:
        if _is_mpi_resolver(server_or_cluster_def):
            if cluster_resolver is not None and cluster_resolver is not server_or_cluster_def:
                raise ValueError("Server: give the MPIClusterResolver once (as the first argument or as "
                                 "`cluster_resolver`), not two different ones")
            cluster_resolver = server_or_cluster_def
            server_or_cluster_def = cluster_resolver.cluster_spec()
            job_name = cluster_resolver.task_type if job_name is None else job_name
            task_index = cluster_resolver.task_id if task_index is None else task_index
            protocol = (cluster_resolver.rpc_layer or "grpc") if protocol is None else protocol
        elif cluster_resolver is not None and not _is_mpi_resolver(cluster_resolver):
            raise TypeError(f"Server: `cluster_resolver` must be an mpidist MPIClusterResolver, got "
                            f"{type(cluster_resolver).__name__}")
        super().__init__(server_or_cluster_def, job_name=job_name, task_index=task_index, protocol=protocol,
                         config=config, start=start)
        self._resolver = cluster_resolver
        _log.debug("mpidist: Server %s:%s started (%s)", job_name, task_index, self.target)

    @property
    def cluster_resolver(self) -> Any:
        """The MPIClusterResolver whose job end ``join()`` waits for (None: none was given)."""
        return self._resolver

    def join(self) -> None:
        """Serve until the job is over: returns once the chief has finished (see the module docstring)."""
        resolver = self._resolver
        if resolver is None or not resolver.has_roles:
            raise RuntimeError("Server.join: the job's end comes from an MPIClusterResolver with roles "
                               "(MPIClusterResolver(ps=N) or roles=[...]); build the server with "
                               "Server(resolver) or Server(..., cluster_resolver=resolver). Without one, "
                               "TensorFlow's join would block forever")
        resolver.shutdown()
