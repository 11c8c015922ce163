"""``mpidist.cluster_resolver``: the cluster from the MPI communicator, never from TF_CONFIG.

``MPIClusterResolver(comm=None)`` is collective over ``comm``: every rank picks a free TCP port on
its host and the ranks exchange ``host:port``. It answers what TensorFlow's cluster resolvers
answer (``task_type``, ``task_id``, ``cluster_spec()``, ``master()``, ``num_accelerators()``), so it
can also hand TensorFlow's own strategies a cluster without hand-written TF_CONFIG::

    resolver = mpidist.cluster_resolver.MPIClusterResolver()     # every rank a "worker", task_id = rank
    tf_strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
    # or, for code that reads the environment:  os.environ["TF_CONFIG"] = json.dumps(resolver.tf_config())

Roles by rank, for TensorFlow's ParameterServerStrategy from ONE mpirun/srun: ``ps=N`` makes ranks
0..N-1 the parameter servers ("ps"), rank N the "chief" (the coordinator) and the rest "worker"s;
``roles=[...]`` names every rank's task type. The servers run :class:`mpidist.Server`; see its
docstring for how they leave ``join()`` when the chief is done::

    resolver = MPIClusterResolver(ps=1)
    if resolver.task_type in ("ps", "worker"):
        mpidist.Server(resolver).join()          # returns when the chief has finished
    else:
        strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
        ...                                      # ClusterCoordinator(strategy), training
        resolver.shutdown()                      # optional: the chief's exit does it too

The end of such a job is one non-blocking barrier on a private duplicate of ``comm``: each rank
enters it once, a serving rank in ``Server.join()``, any other rank in :meth:`shutdown` (called for
it when its interpreter exits). It completes when every rank has entered, so the servers return
from ``join()`` once the chief is done, and no rank waits for a message that never comes. A rank
that dies of an exception ends the whole job (mpidist's abort hook), as always.
"""
from __future__ import annotations

import atexit
import socket
import sys
import time
from typing import Any, Sequence

from mpi4py import MPI

from ._config import rc
from .topology import abort, validate_comm
from .validation import is_integer

__all__ = ["MPIClusterResolver", "place_in_cluster", "check_agreement"]

TASK_TYPES = ("chief", "worker", "ps", "evaluator")
SERVING = ("worker", "ps")  # the task types that run a server and wait in join()
_POLL_SECONDS = 0.05  # how often a waiting rank tests the end barrier (a blocking wait would spin a core)


def _reserve_port(host: str) -> socket.socket:
    """A socket bound to a free port on ``host``. The caller keeps it open until every rank has
    chosen (ranks on one host then cannot be handed the same port) and closes it before the
    server binds."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind((host, 0))
    except OSError:
        s.close()
        raise
    return s


def place_in_cluster(cluster: dict[str, Any], task_type: Any, task_id: Any) -> int | None:
    """The replica number TensorFlow's MultiWorkerMirroredStrategy gives task ``task_type``:``task_id``
    of ``cluster`` (``{job: [addresses]}``): the chief is 0 and the workers follow it in order;
    None for other task types (ps, evaluator) or an unreadable id."""
    try:
        index = int(task_id)
    except (TypeError, ValueError):
        return None
    if task_type == "chief":
        return 0
    if task_type == "worker":
        return len(cluster.get("chief", [])) + index
    return None


def _resolver_facts(resolver: Any) -> tuple[int, int | None, str] | None:
    """(chief + worker tasks, this task's replica number, "type:id") of a TensorFlow cluster resolver;
    None when its cluster is empty (it describes no cluster: TFConfigClusterResolver without TF_CONFIG)."""
    spec = resolver.cluster_spec()
    jobs = spec.as_dict() if hasattr(spec, "as_dict") else dict(spec)
    if not jobs:
        return None
    tasks = len(jobs.get("chief", [])) + len(jobs.get("worker", []))
    return tasks, place_in_cluster(jobs, resolver.task_type, resolver.task_id), \
        f"{resolver.task_type}:{resolver.task_id}"


def check_agreement(resolver: Any, comm: MPI.Intracomm, where: str) -> None:
    """Raise ValueError on every rank of ``comm`` (collective) unless the cluster ``resolver``
    describes (TFConfigClusterResolver, SlurmClusterResolver, SimpleClusterResolver, ...) is the
    communicator's: as many chief/worker tasks as ranks, each rank's task at the rank's place. A
    resolver describing no cluster (empty) agrees with any communicator."""
    try:
        facts: Any = _resolver_facts(resolver)
    except Exception as error:  # reported on every rank, after the exchange
        facts = f"{type(error).__name__}: {error}"
    private = comm.Dup()  # never matches the program's messages
    try:
        everyone = private.allgather(facts)
    finally:
        private.Free()
    name, size = type(resolver).__name__, comm.Get_size()
    failed = [(r, f) for r, f in enumerate(everyone) if isinstance(f, str)]
    if failed:
        raise ValueError(f"{where}: `cluster_resolver` ({name}) cannot say its cluster on rank {failed[0][0]}: "
                         f"{failed[0][1]}")
    problems = []
    counts = sorted({f[0] for f in everyone if f is not None})
    if any(c != size for c in counts):
        problems.append(f"it describes {' or '.join(map(str, counts))} chief/worker task(s)")
    misplaced = [(r, f) for r, f in enumerate(everyone) if f is not None and f[1] != r]
    problems += [f"rank {r} is task {f[2]} there (replica {f[1]})" for r, f in misplaced[:3]]
    if len(misplaced) > 3:
        problems.append(f"and {len(misplaced) - 3} more ranks are elsewhere")
    if any(f is None for f in everyone) and any(f is not None for f in everyone):
        problems.append("it describes no cluster on some ranks only")
    if problems:
        raise ValueError(f"{where}: `cluster_resolver` ({name}) disagrees with the MPI communicator of {size} "
                         f"rank(s): {'; '.join(problems)}. Start one rank per task in the resolver's order, or "
                         f"leave the resolver out: mpidist takes the cluster from MPI")


def _gpu_count() -> int:
    tf = sys.modules.get("tensorflow")
    if tf is not None:
        return len(tf.config.list_physical_devices("GPU"))
    try:
        import cupy
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # no cupy, or no CUDA driver
        return 0


def _roles(ps: Any, roles: Any, size: int) -> list[str] | None:
    where = "MPIClusterResolver"
    if roles is not None and ps:
        raise ValueError(f"{where}: give `ps` or `roles`, not both")
    if not is_integer(ps) or not 0 <= ps < size:
        raise ValueError(f"{where}: `ps` must be an int in [0, {size}) (the chief needs a rank of its own), "
                         f"got {ps!r}")
    if roles is not None:
        if isinstance(roles, str) or len(roles) != size:
            raise ValueError(f"{where}: `roles` must list one task type per rank ({size}), got {roles!r}")
        bad = [r for r in roles if r not in TASK_TYPES]
        if bad:
            raise ValueError(f"{where}: `roles` must be task types from {TASK_TYPES}, got {bad[0]!r}")
        if list(roles).count("chief") > 1:
            raise ValueError(f"{where}: `roles` names {list(roles).count('chief')} chiefs; a cluster has at most one")
        return list(roles)
    if ps:
        return ["ps"] * ps + ["chief"] + ["worker"] * (size - ps - 1)
    return None


class MPIClusterResolver:
    """The cluster of the ranks of ``comm`` (default COMM_WORLD); collective over ``comm``.

    ``MPIClusterResolver(comm=None, *, rpc_layer="grpc", port=None, ps=0, roles=None, host=None)``.
    By default every rank is a "worker" task whose ``task_id`` is its rank. ``ps=N``: ranks 0..N-1
    are "ps", rank N the "chief", the others "worker"s; ``roles``: one task type per rank (chief,
    worker, ps, evaluator). Task ids count the ranks of each type in rank order. ``host``: the
    address the others reach this rank at (default the host name; "127.0.0.1" keeps a one-node
    job on loopback); ``port``: a fixed port instead of a free one.
    """

    def __init__(self, comm: MPI.Intracomm | None = None, *, rpc_layer: str = "grpc", port: int | None = None,
                 ps: int = 0, roles: Sequence[str] | None = None, host: str | None = None) -> None:
        where = "MPIClusterResolver"
        self.comm = validate_comm(comm, where)
        if port is not None and (not is_integer(port) or not 0 < port < 65536):
            raise ValueError(f"{where}: `port` must be None or a TCP port number, got {port!r}")
        if host is not None and (not isinstance(host, str) or not host):
            raise ValueError(f"{where}: `host` must be None or a host name or address, got {host!r}")
        rank, size = self.comm.Get_rank(), self.comm.Get_size()
        self._roles = _roles(ps, roles, size)
        reserved: socket.socket | None = None
        try:  # a free port on the given address, or on every interface
            if port is None:
                reserved = _reserve_port(host or "")
                port_text = str(reserved.getsockname()[1])
            else:
                port_text = str(port)
            mine = f"{host or socket.gethostname()}:{port_text}"
            error = None
        except OSError as err:  # reported on every rank, after the exchange (no rank left waiting)
            mine, error = "", f"rank {rank}: {err}"
        try:
            gathered = self.comm.allgather((mine, error))
        finally:  # every rank has chosen: the ports are distinct per host, and free for the server
            if reserved is not None:
                reserved.close()
        failed = [e for _, e in gathered if e is not None]
        if failed:
            raise OSError(f"{where}: no free TCP port on `host` {host!r} ({failed[0]})")
        self._addresses: list[str] = [address for address, _ in gathered]
        first: dict[str, int] = {}
        for r, address in enumerate(self._addresses):
            if address in first:
                raise ValueError(f"{where}: ranks {first[address]} and {r} both serve at {address} "
                                 f"(a fixed `port` needs one rank per host)")
            first[address] = r
        types = self._roles or ["worker"] * size
        self._tasks = [(t, types[:r].count(t)) for r, t in enumerate(types)]  # rank -> (type, id)
        self.task_type, self.task_id = self._tasks[rank]
        self.rpc_layer = rpc_layer
        self.environment = ""
        self._control: MPI.Intracomm | None = None
        self._end: MPI.Request | None = None
        if self._roles is not None:  # the job's end is one barrier on a communicator of our own
            if rc.abort_on_error:  # servers wait in join(): a failing chief must end the job
                abort.install()
            self._control = self.comm.Dup()
            atexit.register(self._at_exit)

    # -- the cluster ------------------------------------------------------------------------------

    def _jobs(self) -> dict[str, list[str]]:
        jobs: dict[str, list[str]] = {}
        for (task_type, _), address in zip(self._tasks, self._addresses):
            jobs.setdefault(task_type, []).append(address)
        return jobs

    def cluster_spec(self) -> Any:
        """``{task type: [host:port, ...]}`` (each job in rank order); a ``tf.train.ClusterSpec``
        when TensorFlow is loaded."""
        spec = self._jobs()
        tf = sys.modules.get("tensorflow")
        return tf.train.ClusterSpec(spec) if tf is not None else spec

    def rank_of(self, task_type: str, task_id: int) -> int:
        """The rank of ``comm`` that runs task ``task_type``:``task_id``."""
        where = "MPIClusterResolver.rank_of"
        jobs = self._jobs()
        if task_type not in jobs:
            raise ValueError(f"{where}: `task_type` must be one of {sorted(jobs)}, got {task_type!r}")
        if not is_integer(task_id) or not 0 <= task_id < len(jobs[task_type]):
            raise ValueError(f"{where}: `task_id` must be in [0, {len(jobs[task_type])}) for {task_type!r}, "
                             f"got {task_id!r}")
        return self._tasks.index((task_type, task_id))

    def master(self, task_type: str | None = None, task_id: int | None = None, rpc_layer: str | None = None) -> str:
        """The address of a task (default: this one), with the rpc layer prefix."""
        where = "MPIClusterResolver.master"
        task_type = self.task_type if task_type is None else task_type
        task_id = self.task_id if task_id is None else task_id
        jobs = self._jobs()
        if task_type not in jobs:
            raise ValueError(f"{where}: `task_type` must be one of {sorted(jobs)} or None, got {task_type!r}")
        if not is_integer(task_id) or not 0 <= task_id < len(jobs[task_type]):
            raise ValueError(f"{where}: `task_id` must be in [0, {len(jobs[task_type])}), got {task_id}")
        address = jobs[task_type][task_id]
        layer = self.rpc_layer if rpc_layer is None else rpc_layer
        return f"{layer}://{address}" if layer else address

    def num_accelerators(self, task_type: str | None = None, task_id: int | None = None,
                         config_proto: Any = None) -> dict[str, int]:
        """Accelerators visible to this rank: ``{"GPU": n}`` (empty dict when there are none)."""
        n = _gpu_count()
        return {"GPU": n} if n else {}

    def tf_config(self) -> dict[str, Any]:
        """The TF_CONFIG dictionary equivalent to this resolver (for code that reads the environment)."""
        return {"cluster": self._jobs(), "task": {"type": self.task_type, "index": self.task_id}}

    # -- the end of a job with roles --------------------------------------------------------------

    @property
    def has_roles(self) -> bool:
        """Whether ranks were given roles (``ps=`` or ``roles=``): then the job ends with :meth:`shutdown`."""
        return self._roles is not None

    @property
    def serving(self) -> bool:
        """Whether this rank's task runs a server ("ps" or "worker" in a job with roles)."""
        return self._roles is not None and self.task_type in SERVING

    def shutdown(self) -> None:
        """This rank is done with the cluster; returns when every rank is (see the module docstring).

        Serving ranks call it from ``mpidist.Server.join()``; the chief (and an evaluator) call it
        when training is over, or leave it to their interpreter's exit. A second call only waits.
        """
        if self._control is None:
            raise RuntimeError("MPIClusterResolver.shutdown: only a resolver with roles (`ps=` or `roles=`) "
                               "has a job end to wait for; this one makes every rank a worker")
        if self._end is None:
            self._end = self._control.Ibarrier()
        while not self._end.Test():  # Test, not Wait: a blocking MPI wait spins a core the servers need
            time.sleep(_POLL_SECONDS)

    def _at_exit(self) -> None:
        if not MPI.Is_finalized():
            self.shutdown()

    def __repr__(self) -> str:
        jobs = ", ".join(f"{t}={len(a)}" for t, a in self._jobs().items())
        return f"MPIClusterResolver(task_type={self.task_type!r}, task_id={self.task_id}, {jobs})"
