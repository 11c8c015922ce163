"""``strategy.extended`` of an mpidist strategy: one replica per rank, collectives on the engine.

Built on ``tf.compat.v1.distribute.StrategyExtended`` (the base TensorFlow's own one-device and
mirrored strategies use: it provides ``call_for_each_replica``, which ``Strategy.run`` calls).
The hooks TensorFlow and Keras call are implemented here (listed in docs/design.md, "Hooks").

CentralStorageStrategy semantics (``central_storage=True``): variables and their updates live on
the chief. ``extended.update`` runs the update function on rank 0 only and then broadcasts each
updated variable from rank 0; the other ranks hold read-only copies (optimizer slots are only
kept on the chief). Training gives exactly what the mirrored path gives.
"""
from __future__ import annotations

import contextlib
import weakref
from typing import Any, Callable, ContextManager

import tensorflow as tf

from ..cross_device import local_value
from ..cross_device.options import CommunicationOptions
from ..cross_device.reduce_op import ReduceOp
from . import _tf_private, collectives, cross_device, reductions, variables, xla, xla_record
from . import input as input_lib
from .replica_context import MPIReplicaContext

_no_autograph = tf.autograph.experimental.do_not_convert  # library code: never converted


class MPIExtended(tf.compat.v1.distribute.StrategyExtended):
    """The implementation behind an mpidist ``tf.distribute.Strategy``."""

    def __init__(self, container_strategy: tf.distribute.Strategy, engine: Any, options: CommunicationOptions,
                 device: str, scope_device: str | None, central_storage: bool = False,
                 cluster_resolver: Any = None) -> None:
        super().__init__(container_strategy)
        self._cluster_resolver = cluster_resolver  # what Strategy.cluster_resolver returns
        self._engine = engine
        self._options = options
        self._default_call = options.call_options()
        self._device = device
        self._scope_device = scope_device
        self._central_storage = central_storage
        self._sync_on_read: list[weakref.ref] = []  # in creation order: the same on every rank
        self._saved_reads: dict[int, tf.Tensor] = {}  # SyncOnRead id -> aggregate (checkpoint.save)
        self._cross_device_ops: Any = None
        self._reduce_engine: Any = engine  # what reduce_to/batch_reduce_to/broadcast_to run on

    def use_cross_device_ops(self, cross_device_ops: Any) -> None:
        """Run reductions (``reduce``, ``reduce_to``, ``batch_reduce_to``, SyncOnRead reads) and
        ``broadcast_to`` through ``cross_device_ops`` (its algorithm, packing and root), bound to
        this strategy's engine."""
        self._cross_device_ops = cross_device_ops.bind(self._engine)
        self._reduce_engine = cross_device.OpsEngine(cross_device_ops)

    # -- facts other mpidist modules read --------------------------------------------------------

    @property
    def engine(self) -> Any:
        """The engine of this strategy's communicator (what collectives outside reductions run on)."""
        return self._engine

    @property
    def rank(self) -> int:
        """This process's replica id (its rank in the strategy's communicator), read from the engine
        each time: an elastic recovery (Engine.replace_comm) changes it."""
        return self._engine.rank

    @property
    def options(self) -> CommunicationOptions:
        """The strategy's CommunicationOptions."""
        return self._options

    @property
    def default_call_options(self) -> collectives.CallOptions:
        """The engine's per-call options made from the strategy's CommunicationOptions."""
        return self._default_call

    @property
    def device(self) -> str:
        """The device of this rank's replica (a TensorFlow device string)."""
        return self._device

    @property
    def scope_device(self) -> str | None:
        """The device that ``scope()`` and ``run`` place ops on, or None."""
        return self._scope_device

    @property
    def cluster_resolver(self) -> Any:
        """The cluster resolver the strategy was built with (or None)."""
        return self._cluster_resolver

    @property
    def cross_device_ops(self) -> Any:
        """The CrossDeviceOps given to ``use_cross_device_ops``, or None."""
        return self._cross_device_ops

    @property
    def saved_reads(self) -> dict[int, tf.Tensor]:
        """SyncOnRead variable id -> its aggregate, while ``checkpoint.save`` runs (else empty)."""
        return self._saved_reads

    @saved_reads.setter
    def saved_reads(self, reads: dict[int, tf.Tensor]) -> None:
        self._saved_reads = reads

    def container_strategy(self) -> tf.distribute.Strategy:
        """The strategy this object is the ``extended`` of."""
        return _tf_private.container_strategy(self)

    # -- helpers ----------------------------------------------------------------------------------

    def call_options(self, options: Any, where: str) -> collectives.CallOptions:
        """The engine's per-call options: ``options`` (ours or TensorFlow's, or None) over the strategy's."""
        return self._default_call if options is None else reductions.merge_options(self._options, options, where)

    def device_scope(self) -> ContextManager:
        """``tf.device(scope_device)``, or a no-op when there is none."""
        return tf.device(self._scope_device) if self._scope_device else contextlib.nullcontext()

    def local_value(self, value: Any) -> Any:
        """This rank's component of a distributed value, or the value itself."""
        if isinstance(value, tf.distribute.DistributedValues):
            return value.values[0]
        return local_value(value)  # mpidist's own DistributedValues too

    def reduce_nest(self, op: ReduceOp, value: Any, axis: Any, options: Any, where: str) -> Any:
        """One engine call for the whole nest ``value`` (see reductions.reduce_tensors)."""
        flat = tf.nest.flatten(value)
        if not flat:
            return value
        if self._saved_reads and axis is None:
            found = [self._saved_reads.get(id(v)) for v in flat]
            if all(f is not None for f in found):
                return tf.nest.pack_sequence_as(value, found)
        leaves = [tf.convert_to_tensor(self.local_value(v)) for v in flat]
        if axis is None and xla_record.reading_locally():  # a placeholder traced by xla.defer_output
            return tf.nest.pack_sequence_as(value, leaves)
        call = self.call_options(options, where)
        reduced = reductions.reduce_tensors(self._reduce_engine, op, leaves, axis, call, where)
        return tf.nest.pack_sequence_as(value, reduced)

    def live_sync_on_read_variables(self) -> list[Any]:
        """The SyncOnRead variables created in this strategy's scope that are still alive."""
        alive = [r() for r in self._sync_on_read]
        self._sync_on_read = [r for r, v in zip(self._sync_on_read, alive) if v is not None]
        return [v for v in alive if v is not None]

    # -- variables --------------------------------------------------------------------------------

    def _create_variable(self, next_creator: Callable[..., Any], **kwargs: Any) -> Any:
        variable = variables.create_variable(self, next_creator, **kwargs)
        if _tf_private.is_sync_on_read(variable):
            self._sync_on_read.append(weakref.ref(variable))
        return variable

    def _validate_colocate_with_variable(self, colocate_with_variable: Any) -> None:
        owner = _tf_private.owning_strategy(colocate_with_variable)
        if owner is not None and owner is not self.container_strategy():
            raise ValueError(f"{type(self).__name__}.colocate_vars_with: `colocate_with_variable` must be a "
                             f"variable created in this strategy's scope, got {colocate_with_variable!r}")

    def read_var(self, replica_local_var: Any) -> tf.Tensor:
        if _tf_private.is_sync_on_read(replica_local_var):
            aggregation = replica_local_var.aggregation
            if aggregation == tf.VariableAggregation.ONLY_FIRST_REPLICA:
                return tf.identity(replica_local_var.values[0])
            op = ReduceOp.from_variable_aggregation(aggregation)
            return self.reduce_nest(op, replica_local_var, None, None, "read_var")
        return tf.identity(replica_local_var)

    def value_container(self, value: Any) -> Any:
        container = _tf_private.distributed_container(value)
        return value if container is None else container

    # -- replicas ---------------------------------------------------------------------------------

    def _call_for_each_replica(self, fn: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        fn = xla.maybe_split(fn)  # a tf.function(jit_compile=True): compiled in two parts (xla.py)
        with self.device_scope(), MPIReplicaContext(self.container_strategy(), self.rank):
            return fn(*args, **kwargs)

    def _local_results(self, value: Any) -> tuple:
        if isinstance(value, tf.distribute.DistributedValues):
            return tuple(value.values)
        if tf.nest.is_nested(value):
            return (tf.nest.map_structure(self.local_value, value),)
        return (value,)

    @property
    def _num_replicas_in_sync(self) -> int:
        return self._engine.size

    @property
    def worker_devices(self) -> tuple[str, ...]:
        return (self._device,)

    @property
    def parameter_devices(self) -> tuple[str, ...]:
        return (self._device,)

    def non_slot_devices(self, var_list: Any) -> tuple[str, ...]:
        return (self._device,)

    def _get_local_replica_id(self, replica_id_in_sync_group: Any) -> int:
        return 0  # one replica per process: its variables' only component

    def _get_replica_id_in_sync_group(self, replica_id: Any) -> int:
        return self.rank

    def _in_multi_worker_mode(self) -> bool:
        return self._engine.size > 1

    @property
    def _task_type(self) -> str:
        return "worker"  # as MultiWorkerMirroredStrategy's extended (Keras 2 names its workers' temp dirs by these)

    @property
    def _task_id(self) -> int:
        return self.rank

    @property
    def experimental_should_init(self) -> bool:
        return True

    @property
    def experimental_between_graph(self) -> bool:
        return True

    @property
    def should_checkpoint(self) -> bool:
        return self.rank == 0

    @property
    def should_save_summary(self) -> bool:
        return self.rank == 0

    @property
    def _global_batch_size(self) -> bool:
        return True

    # -- collectives in cross-replica context -------------------------------------------------------

    @_no_autograph
    def reduce_to(self, reduce_op: Any, value: Any, destinations: Any, options: Any = None,
                  experimental_hints: Any = None) -> Any:
        """Reduce ``value`` over all ranks (any ReduceOp spelling, MIN/MAX/PROD too); every rank
        gets the result (one replica per rank: ``destinations`` only names this rank's device)."""
        where = f"{type(self).__name__}.reduce_to"
        options = reductions.hints_and_options(options, experimental_hints, where)
        self._require_cross_replica(where)
        op = reductions.parse_op(reduce_op, where)
        reduced = xla_record.pre_reduced(op, [self.local_value(v) for v in tf.nest.flatten(value)], where)
        if reduced is not None:  # in the compiled update of a split step (xla.py)
            return tf.nest.pack_sequence_as(value, reduced)
        return self.reduce_nest(op, value, None, options, where)

    @_no_autograph
    def batch_reduce_to(self, reduce_op: Any, value_destination_pairs: Any, options: Any = None,
                        experimental_hints: Any = None) -> list[Any]:
        """``reduce_to`` of every value, in ONE engine call."""
        where = f"{type(self).__name__}.batch_reduce_to"
        options = reductions.hints_and_options(options, experimental_hints, where)
        self._require_cross_replica(where)
        values = [v for v, _ in value_destination_pairs]
        op = reductions.parse_op(reduce_op, where)
        reduced = xla_record.pre_reduced(op, [self.local_value(v) for v in values], where)
        if reduced is not None:  # in the compiled update of a split step (xla.py)
            return reduced
        return list(self.reduce_nest(op, values, None, options, where))

    _reduce_to = reduce_to
    _batch_reduce_to = batch_reduce_to

    def _require_cross_replica(self, where: str) -> None:
        context = tf.distribute.get_replica_context()
        if context is not None and context.strategy is self.container_strategy():
            raise RuntimeError(f"{where}: must be called in cross-replica context (outside strategy.run, or "
                               f"inside merge_call), but it was called inside a replica function")

    def _replica_ctx_all_reduce(self, reduce_op: Any, value: Any, options: Any = None) -> Any:
        return tf.distribute.get_replica_context().all_reduce(reduce_op, value, options)

    def _broadcast_to(self, tensor: Any, destinations: Any) -> Any:
        """Rank 0's value on every rank (the whole nest in one broadcast)."""
        dtype = getattr(destinations, "dtype", None)  # a Python number broadcast to a variable gets its dtype
        flat = [tf.convert_to_tensor(self.local_value(v), dtype_hint=dtype) for v in tf.nest.flatten(tensor)]
        out = collectives.broadcast(self._reduce_engine, flat, 0, self._default_call, "MPIExtended.broadcast_to")
        return tf.nest.pack_sequence_as(tensor, out)

    def _gather_to_implementation(self, value: Any, destinations: Any, axis: Any, options: Any) -> Any:
        where = "MPIExtended.gather"
        x = tf.convert_to_tensor(self.local_value(value))
        axis = reductions.normalize_axis(axis, x.shape.rank, where)
        return collectives.allgather(self._engine, [x], axis, self.call_options(options, where), where)[0]

    # -- updates ----------------------------------------------------------------------------------

    def _update(self, var: Any, fn: Callable[..., Any], args: Any, kwargs: Any, group: bool) -> Any:
        if not self._central_storage:
            return self._update_non_slot(var, fn, (var,) + tuple(args), kwargs, group)
        # Program order (eager, or automatic control dependencies in a tf.function) puts the
        # broadcast after the chief's update of `var`.
        with self.device_scope(), _tf_private.UpdateContext(0):
            result = fn(var, *args, **kwargs) if self.rank == 0 else None
            value = collectives.broadcast(self._engine, [var.read_value()], 0, self._default_call,
                                          "CentralStorageStrategy update (broadcast from the chief)")[0]
            if self.rank != 0:
                result = var.assign(value, read_value=False)
        return result if group else tf.nest.map_structure(self._local_results, result)

    def _update_non_slot(self, colocate_with: Any, fn: Callable[..., Any], args: Any, kwargs: Any,
                         group: bool) -> Any:
        with self.device_scope(), _tf_private.UpdateContext(0):
            result = fn(*args, **kwargs)
        return result if group else tf.nest.map_structure(self._local_results, result)

    # -- input ------------------------------------------------------------------------------------

    def _experimental_distribute_dataset(self, dataset: Any, options: Any) -> Any:
        return input_lib.distribute_dataset(self.container_strategy(), dataset, options)

    def _distribute_datasets_from_function(self, dataset_fn: Any, options: Any) -> Any:
        return input_lib.distribute_from_function(self.container_strategy(), dataset_fn, options)

    def _experimental_distribute_values_from_function(self, value_fn: Any) -> Any:
        return input_lib.distribute_values(self.container_strategy(), value_fn)

    def _make_dataset_iterator(self, dataset: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__}.make_dataset_iterator: TensorFlow 1 input API; use "
                                  f"strategy.experimental_distribute_dataset(dataset)")

    def _make_input_fn_iterator(self, input_fn: Any, replication_mode: Any = None) -> Any:
        raise NotImplementedError(f"{type(self).__name__}.make_input_fn_iterator: TensorFlow 1 input API; use "
                                  f"strategy.distribute_datasets_from_function(dataset_fn)")

    def _experimental_make_numpy_dataset(self, numpy_input: Any, session: Any) -> Any:
        return tf.data.Dataset.from_tensor_slices(numpy_input)
