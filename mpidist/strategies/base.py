"""Strategy and StrategyExtended without TensorFlow: one replica per rank, values are NumPy (or
anything the engine's array adapters take).

When TensorFlow has been imported, the concrete strategies build mpidist's genuine
``tf.distribute.Strategy`` subclasses instead (see backends.py); the API is the same.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

from mpi4py import MPI

from ..collectives import Engine
from ..cross_device import (CommunicationOptions, CrossDeviceOps, MPIAllReduce, ReduceOp, as_options,
                            as_reduce_op)
from ..values import PerReplica, ValueContext
from . import context
from .context import hints_and_options
from .reductions import gather_along_axis, map_local, reduce_along_axis


_input_layer: list[Any] = []


def register_input_layer(module: Any) -> None:
    """Called by ``mpidist.input`` (the layer above) to provide the dataset methods."""
    _input_layer[:] = [module]


def _input(where: str) -> Any:
    if not _input_layer:
        raise RuntimeError(f"{where}: the input layer is not loaded; `import mpidist` loads it")
    return _input_layer[0]


class StrategyExtended:
    """The extended API: explicit reductions, broadcasts and updates, and device/role facts."""

    def __init__(self, container: "Strategy", engine: Engine, options: CommunicationOptions,
                 cross_device_ops: CrossDeviceOps | None = None) -> None:
        self._container = container
        self._engine = engine
        self._options = options
        self._cross_device_ops = (cross_device_ops or MPIAllReduce())._bind(engine)

    # -- facts ---------------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self._engine.rank

    @property
    def num_replicas_in_sync(self) -> int:
        return self._engine.size

    @property
    def should_checkpoint(self) -> bool:
        """True on the chief (rank 0) only: let one rank write checkpoints."""
        return self._engine.rank == 0

    @property
    def should_save_summary(self) -> bool:
        return self._engine.rank == 0

    experimental_should_init = True
    experimental_between_graph = True

    @property
    def worker_devices(self) -> tuple[str, ...]:
        return (f"/job:worker/replica:0/task:{MPI.COMM_WORLD.Get_rank()}/device:CPU:0",)

    @property
    def parameter_devices(self) -> tuple[str, ...]:
        return self.worker_devices

    # -- communication ---------------------------------------------------------------------------
    def _all_reduce(self, op: ReduceOp, value: Any, options: CommunicationOptions) -> Any:
        return self._cross_device_ops._reduce(op, map_local(value), options, "all_reduce")

    def _gather(self, value: Any, axis: Any, options: CommunicationOptions, where: str) -> Any:
        return gather_along_axis(self._engine, value, axis, self._options.merge(options), where)

    def reduce_to(self, reduce_op: Any, value: Any, destinations: Any = None, options: Any = None,
                  experimental_hints: Any = None) -> Any:
        """Reduce ``value`` across replicas; every rank gets the result (``destinations`` is accepted
        and ignored: one device per rank)."""
        where = f"{type(self._container).__name__}.extended.reduce_to"
        op = as_reduce_op(reduce_op, where)
        return self._all_reduce(op, value, self._options.merge(hints_and_options(options, experimental_hints, where)))

    def batch_reduce_to(self, reduce_op: Any, value_destination_pairs: Any, options: Any = None,
                        experimental_hints: Any = None) -> list[Any]:
        """Reduce several values in one logical collective."""
        where = f"{type(self._container).__name__}.extended.batch_reduce_to"
        op = as_reduce_op(reduce_op, where)
        values = [v for v, _ in value_destination_pairs]
        if not values:
            return []
        opts = self._options.merge(hints_and_options(options, experimental_hints, where))
        return list(self._all_reduce(op, values, opts))

    def broadcast_to(self, tensor: Any, destinations: Any = None) -> Any:
        """Rank 0's value on every rank."""
        return self._cross_device_ops.broadcast(map_local(tensor), destinations)

    def update(self, var: Any, fn: Callable[..., Any], args: tuple = (), kwargs: dict | None = None,
               group: bool = True) -> Any:
        """Run ``fn(var, *args, **kwargs)`` in the cross-replica context (mirrored: on every rank)."""
        context.push(self._container, None)
        try:
            return fn(var, *map_local(tuple(args)), **map_local(kwargs or {}))
        finally:
            context.pop()

    def value_container(self, value: Any) -> Any:
        return value


class Strategy:
    """A distribution strategy whose replicas are the ranks of a communicator."""

    _extended_class = StrategyExtended

    def __init__(self, engine: Engine, options: CommunicationOptions,
                 cross_device_ops: CrossDeviceOps | None = None, cluster_resolver: Any = None) -> None:
        self._extended = self._extended_class(self, engine, options, cross_device_ops)
        self._cluster_resolver = cluster_resolver

    @property
    def extended(self) -> StrategyExtended:
        return self._extended

    @property
    def num_replicas_in_sync(self) -> int:
        return self._extended.num_replicas_in_sync

    @property
    def cluster_resolver(self) -> Any:
        return self._cluster_resolver

    @contextlib.contextmanager
    def scope(self) -> Iterator["Strategy"]:
        """Make this strategy current (cross-replica context) inside the ``with`` block."""
        context.push(self, None)
        try:
            yield self
        finally:
            context.pop()

    def run(self, fn: Callable[..., Any], args: tuple = (), kwargs: dict | None = None, options: Any = None) -> Any:
        """Call ``fn`` once on this rank, in a replica context whose id is the rank; returns its result."""
        if not callable(fn):
            raise TypeError(f"{type(self).__name__}.run: `fn` must be callable, got {type(fn).__name__}")
        context.push(self, context.ReplicaContext(self, self._extended.rank))
        try:
            return fn(*map_local(tuple(args)), **map_local(kwargs or {}))
        finally:
            context.pop()

    experimental_run_v2 = run

    def reduce(self, reduce_op: Any, value: Any, axis: Any = None, experimental_hints: Any = None,
               options: Any = None) -> Any:
        """Reduce ``value`` across replicas; with ``axis``, also along that axis (MEAN: over the global
        number of elements along it)."""
        where = f"{type(self).__name__}.reduce"
        op = as_reduce_op(reduce_op, where)
        opts = self._extended._options.merge(hints_and_options(options, experimental_hints, where))
        if axis is None:
            return self._extended._all_reduce(op, value, opts)
        return reduce_along_axis(self._extended._engine, op, value, axis, opts, where)

    def gather(self, value: Any, axis: Any) -> Any:
        """Concatenate every replica's value along ``axis`` (sizes along it may differ per rank)."""
        return self._extended._gather(value, axis, CommunicationOptions(), f"{type(self).__name__}.gather")

    def experimental_local_results(self, value: Any) -> tuple[Any]:
        """The values of the local replicas: a 1-tuple (one replica per rank)."""
        return (map_local(value),)

    def experimental_distribute_values_from_function(self, value_fn: Callable[[ValueContext], Any]) -> PerReplica:
        return PerReplica(value_fn(ValueContext(self._extended.rank, self.num_replicas_in_sync)))

    def experimental_distribute_dataset(self, dataset: Any, options: Any = None) -> Any:
        """Per-replica batches for this rank from an iterable of global batches (see mpidist.input)."""
        return _input("experimental_distribute_dataset").distribute_dataset(self, dataset, options)

    def distribute_datasets_from_function(self, dataset_fn: Callable[..., Any], options: Any = None) -> Any:
        """``dataset_fn(InputContext)`` builds this rank's input pipeline (see mpidist.input)."""
        return _input("distribute_datasets_from_function").distribute_datasets_from_function(
            self, dataset_fn, options)

    experimental_distribute_datasets_from_function = distribute_datasets_from_function

    def experimental_make_numpy_dataset(self, numpy_input: Any) -> Any:
        """An in-memory dataset of examples along axis 0; ``.batch(global_batch_size)`` it."""
        return _input("experimental_make_numpy_dataset").make_numpy_dataset(self, numpy_input)

    def _default_replica_context(self) -> context.ReplicaContext:
        return context.ReplicaContext(self, self._extended.rank)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_replicas_in_sync={self.num_replicas_in_sync})"
