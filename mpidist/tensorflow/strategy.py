"""The mpidist ``tf.distribute.Strategy``: one MPI rank = one replica.

``MPIStrategy`` is the TensorFlow implementation of every public strategy class: the class that
``mpidist.X`` builds with TensorFlow in use (``mpidist.on_tensorflow.X``) derives from it and from
``mpidist.X``. They differ only in the engine's communicator (chosen by ``mpidist.X._setup``) and in
CentralStorageStrategy's update rule:

- MultiWorkerMirroredStrategy: replicas = the ranks of the communicator (COMM_WORLD by default);
- MirroredStrategy: replicas = the ranks that share this node;
- OneDeviceStrategy: one replica (an engine over COMM_SELF): every rank trains on its own;
- CentralStorageStrategy: as MultiWorkerMirrored, variables and updates on the chief.

The class derives from ``tf.distribute.Strategy`` itself, not from TensorFlow's
MultiWorkerMirroredStrategy (Keras 3 ``fit`` fails on that class's path, keras-team/keras#20585).
``reduce`` and ``gather`` are overridden so that nests, op names in any case, mpidist's ReduceOp
and MIN/MAX/PROD work, each with one engine call.
"""
from __future__ import annotations

import logging
from typing import Any

import tensorflow as tf

from ..cross_device.options import CommunicationImplementation, CommunicationOptions, as_options
from ..strategies.base import pickling_refused
from . import collectives, gpu_bridge, reductions
from .extended import MPIExtended

_log = logging.getLogger("mpidist")

_no_autograph = tf.autograph.experimental.do_not_convert  # library code: never converted


class MPIStrategy(tf.distribute.Strategy):
    """A ``tf.distribute.Strategy`` whose replicas are the ranks of an mpidist engine: the base of
    the TensorFlow strategy classes, which build it through :meth:`_assemble`."""

    def __init__(self, engine: Any, options: CommunicationOptions, device: str, scope_device: str | None = None,
                 cluster_resolver: Any = None) -> None:
        self._engine_ref = engine
        extended = MPIExtended(self, engine, options, device, scope_device,
                               central_storage=getattr(self, "update_on_chief", False),
                               cluster_resolver=cluster_resolver)
        super().__init__(extended)

    def _assemble(self, engine: Any, options: Any, cross_device_ops: Any, cluster_resolver: Any,
                  extra: dict[str, Any]) -> None:
        """Build this strategy on ``engine`` (an mpidist.Engine over its communicator): the hook that
        the public classes' constructor and ``on_engine`` end in (mpidist/frameworks.py).

        options: a CommunicationOptions (``bytes_per_pack`` and ``timeout_seconds`` reach every
        engine call). devices: device names; the rank with node-local rank i uses devices[i % len].
        cross_device_ops: None, or an mpidist CrossDeviceOps that ``reduce``, ``extended.reduce_to`` /
        ``batch_reduce_to`` and ``broadcast_to`` then run through (bound to ``engine``).
        cluster_resolver: what ``strategy.cluster_resolver`` returns (MultiWorkerMirroredStrategy:
        the one its constructor got, else an MPIClusterResolver; None for the other classes).
        """
        where = type(self).__name__
        for name in ("rank", "size", "allreduce", "broadcast", "allgather"):
            if not hasattr(engine, name):
                raise TypeError(f"{where}: `engine` must be an mpidist.Engine (it has no `{name}`), "
                                f"got {type(engine).__name__}")
        if cross_device_ops is not None and not callable(getattr(cross_device_ops, "reduce_arrays", None)):
            raise TypeError(f"{where}: `cross_device_ops` must be an mpidist CrossDeviceOps, got "
                            f"{type(cross_device_ops).__name__}")
        options = as_options(options, where)
        if options.implementation is CommunicationImplementation.NCCL and \
                not tf.config.list_physical_devices("GPU"):
            raise ValueError(f"{where}: `options.implementation` is NCCL, which needs GPUs, but TensorFlow "
                             f"sees none on this rank; use AUTO or RING")
        gpu_bridge.prepare()  # GPU hook (issue 8): memory growth before TensorFlow initializes its GPUs
        device, scope_device = _resolve_device(engine, extra.get("devices"), where)
        MPIStrategy.__init__(self, engine, options, device, scope_device, cluster_resolver)
        if cross_device_ops is not None:
            self.extended.use_cross_device_ops(cross_device_ops)
        _log.debug("mpidist: %r built (options %r, cross_device_ops %r)", self, options, cross_device_ops)

    @property
    def engine(self) -> Any:
        return self._engine_ref

    @property
    def closed(self) -> bool:
        """Whether ``close()`` has run (on this strategy or a copy of it): collectives then raise."""
        return getattr(self, "_engine_closed", False) or self._engine_ref.closed

    def close(self) -> None:
        """Free the communicators of the strategy's engine (collective); collectives raise afterwards,
        and closing again does nothing. ``with strategy:`` closes at the end of the block."""
        if not getattr(self, "_engine_closed", False):
            self._engine_closed = True
            if not self._engine_ref.closed:  # not closed through a copy of this strategy
                self._engine_ref.close()

    def __enter__(self) -> MPIStrategy:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def _require_cross_replica(self, where: str, instead: str) -> None:
        context = tf.distribute.get_replica_context()
        if context is not None and context.strategy is self:
            raise RuntimeError(f"{where}: must be called in cross-replica context (outside strategy.run), "
                               f"but it was called inside a replica function; use "
                               f"tf.distribute.get_replica_context().{instead} there")

    @_no_autograph
    def reduce(self, reduce_op: Any, value: Any, axis: Any = None, experimental_hints: Any = None,
               options: Any = None) -> Any:
        """Reduce ``value`` (a tensor or a nest of them) over all replicas; with ``axis``, also
        along it. MEAN with ``axis`` divides by the global number of elements along ``axis``.
        ``experimental_hints`` (CollectiveHints) / ``options`` (CommunicationOptions): this
        call's ``bytes_per_pack`` and ``timeout_seconds`` (a deadline raises
        ``tf.errors.DeadlineExceededError``, eagerly and inside a ``tf.function``)."""
        where = f"{type(self).__name__}.reduce"
        op = reductions.parse_op(reduce_op, where)
        axis = reductions.parse_axis(axis, where)
        options = reductions.hints_and_options(options, experimental_hints, where)
        self._require_cross_replica(where, "all_reduce(...)")
        return self.extended.reduce_nest(op, value, axis, options, where)

    def experimental_run_v2(self, fn: Any, args: Any = (), kwargs: Any = None, options: Any = None) -> Any:
        """TensorFlow 2.0-2.1's name of ``run``."""
        return self.run(fn, args=args, kwargs=kwargs, options=options)

    def experimental_distribute_datasets_from_function(self, dataset_fn: Any, options: Any = None) -> Any:
        """TensorFlow 2.1-2.3's name of ``distribute_datasets_from_function``."""
        return self.distribute_datasets_from_function(dataset_fn, options)

    @property
    def cluster_resolver(self) -> Any:
        """The cluster resolver given to the constructor, else an ``MPIClusterResolver`` of the
        strategy's communicator (MultiWorkerMirroredStrategy); None for the other kinds, as in
        TensorFlow."""
        return self.extended.cluster_resolver

    @_no_autograph
    def gather(self, value: Any, axis: Any) -> Any:
        """Every replica's ``value`` (a tensor or a nest) concatenated along ``axis`` in rank order."""
        where = f"{type(self).__name__}.gather"
        parsed = reductions.parse_axis(axis, where)
        if parsed is None or isinstance(parsed, tuple):
            raise TypeError(f"{where}: `axis` must be an int, got {axis!r}")
        self._require_cross_replica(where, "all_gather(...)")
        if isinstance(value, tf.IndexedSlices):
            raise NotImplementedError(f"{where}: gather does not support IndexedSlices (`value` is a "
                                      f"tf.IndexedSlices; TensorFlow's does not either)")
        ext = self.extended
        flat = [tf.convert_to_tensor(ext.local_value(v)) for v in tf.nest.flatten(value)]
        axes = [reductions.normalize_axis(parsed, t.shape.rank, where) for t in flat]
        call = ext.default_call_options
        if len(set(axes)) <= 1:
            out = collectives.allgather(ext.engine, flat, axes[0] if axes else 0, call, where)
        else:
            out = [collectives.allgather(ext.engine, [t], a, call, where)[0] for t, a in zip(flat, axes)]
        return tf.nest.pack_sequence_as(value, out)

    def experimental_make_numpy_dataset(self, numpy_input: Any, session: Any = None) -> tf.data.Dataset:
        """``tf.data.Dataset.from_tensor_slices(numpy_input)``: examples along axis 0, to batch with
        the global batch size (TensorFlow 1's Strategy had it; mpidist's NumPy strategies too)."""
        return self.extended.experimental_make_numpy_dataset(numpy_input, session=session)

    def __deepcopy__(self, memo: dict) -> MPIStrategy:
        ext = self.extended
        copy = object.__new__(type(self))
        MPIStrategy.__init__(copy, self._engine_ref, ext.options, ext.device, ext.scope_device,
                             ext.cluster_resolver)
        if ext.cross_device_ops is not None:
            copy.extended.use_cross_device_ops(ext.cross_device_ops)
        memo[id(self)] = copy
        return copy

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError(pickling_refused(self))

    def __repr__(self) -> str:
        return (f"<mpidist {type(self).__name__}: replica {self.extended.rank} of {self.num_replicas_in_sync}, "
                f"device {self.extended.device}>")


def _canonical(name: str) -> str:
    """A full device name, as TensorFlow reports a variable's ``backing_device``
    ("/device:CPU:0" -> "/job:localhost/replica:0/task:0/device:CPU:0")."""
    spec = tf.DeviceSpec.from_string(name)
    spec = spec.replace(job=spec.job or "localhost", replica=0 if spec.replica is None else spec.replica,
                        task=0 if spec.task is None else spec.task)
    if spec.device_type is None:
        spec = spec.replace(device_type="CPU", device_index=0)
    return spec.replace(device_index=spec.device_index or 0).to_string()


def _resolve_device(engine: Any, devices: Any, where: str) -> tuple[str, str | None]:
    """(device name reported in worker_devices, device to scope replica code with or None)."""
    local_rank = getattr(getattr(engine, "topology", None), "local_rank", 0) or 0
    if devices:
        if isinstance(devices, str):
            devices = [devices]
        devices = list(devices)
        if not all(isinstance(d, str) for d in devices):
            raise TypeError(f"{where}: `devices` must be device names (strings), got {devices!r}")
        chosen = tf.DeviceSpec.from_string(devices[local_rank % len(devices)])
        return _canonical(chosen.to_string()), chosen.to_string()
    gpus = tf.config.list_logical_devices("GPU")
    if gpus:
        name = gpus[local_rank % len(gpus)].name
        return _canonical(name), name
    cpus = tf.config.list_logical_devices("CPU")
    return _canonical(cpus[0].name if cpus else "/device:CPU:0"), None
