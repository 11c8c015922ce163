"""Strategy and StrategyExtended without TensorFlow: one replica per rank, values are NumPy (or
anything the engine's array adapters take).

This is the NumPy implementation of every strategy, and the base of the public classes
(concrete.py). With TensorFlow in use a public class builds its TensorFlow subclass instead
(``mpidist.tensorflow.X``, which derives from it and from ``tf.distribute.Strategy``): ordinary
classes, so ``isinstance``, ``type``, ``copy.deepcopy`` and pickling of the class behave as for
any Python class (docs/design.md, "Strategies in two modes").
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

from mpi4py import MPI

from ..collectives import Engine
from ..collectives.options import CallOptions
from ..cross_device import (
    CommunicationOptions,
    CrossDeviceOps,
    ReduceOp,
    as_options,
    as_reduce_op,
    hints_and_options,
)
from ..input import api as input_api
from ..values import PerReplica, ValueContext
from . import context
from .reductions import gather_along_axis, map_local, map_local_call, reduce_along_axis


class StrategyExtended:
    """The extended API: explicit reductions, broadcasts and updates, and device/role facts."""

    def __init__(self, container: Strategy, engine: Engine, options: CommunicationOptions,
                 cross_device_ops: CrossDeviceOps | None = None) -> None:
        self._container = container
        self._engine = engine
        self._options = options
        self._default_call = options.call_options()
        self._cross_device_ops = (cross_device_ops or CrossDeviceOps()).bind(engine)  # MPI allreduce

    # -- facts ---------------------------------------------------------------------------------
    @property
    def engine(self) -> Engine:
        """The engine whose communicator this strategy's collectives run on."""
        return self._engine

    @property
    def options(self) -> CommunicationOptions:
        """The strategy's CommunicationOptions (the defaults of every call)."""
        return self._options

    @property
    def cross_device_ops(self) -> CrossDeviceOps:
        """The CrossDeviceOps reductions and broadcasts run through (bound to the engine)."""
        return self._cross_device_ops

    @property
    def default_call_options(self) -> CallOptions:
        """The strategy's options as the per-call options of the layers below."""
        return self._default_call

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
    def check_open(self, where: str) -> None:
        """Raise if the strategy was closed (``where`` names the caller)."""
        if self._container.closed:
            raise RuntimeError(f"{where}: the strategy was closed (strategy.close(), or the end of its `with` "
                               f"block), which freed its communicators; build a new strategy")

    def call_options(self, options: Any, where: str) -> CallOptions:
        """The per-call options of a call whose ``options`` argument (ours or TensorFlow's
        CommunicationOptions, or None) is merged over the strategy's: the one conversion, at the API's
        edge (as MPIExtended.call_options). Combine ``experimental_hints`` first (hints_and_options)."""
        if options is None:  # the common case: nothing to merge
            return self._default_call
        return self._options.merge(as_options(options, where)).call_options()

    def all_reduce(self, op: ReduceOp, value: Any, options: CallOptions) -> Any:
        """Reduce this rank's ``value`` (a nest) across replicas with ``options`` (already merged)."""
        if self._container.closed:
            self.check_open(f"{type(self._container).__name__}: all_reduce")
        return self._cross_device_ops.all_reduce_local(op, map_local(value), options, "all_reduce")

    def gather(self, value: Any, axis: Any, options: CallOptions, where: str) -> Any:
        """Concatenate every replica's ``value`` along ``axis`` (``where`` names the caller)."""
        self.check_open(where)
        return gather_along_axis(self._engine, value, axis, options, where)

    def reduce_to(self, reduce_op: Any, value: Any, destinations: Any = None, options: Any = None,
                  experimental_hints: Any = None) -> Any:
        """Reduce ``value`` across replicas; every rank gets the result (``destinations`` is accepted
        and ignored: one device per rank)."""
        where = f"{type(self._container).__name__}.extended.reduce_to"
        op = as_reduce_op(reduce_op, where)
        return self.all_reduce(op, value, self.call_options(hints_and_options(options, experimental_hints, where),
                                                            where))

    def batch_reduce_to(self, reduce_op: Any, value_destination_pairs: Any, options: Any = None,
                        experimental_hints: Any = None) -> list[Any]:
        """Reduce several values in one logical collective."""
        where = f"{type(self._container).__name__}.extended.batch_reduce_to"
        op = as_reduce_op(reduce_op, where)
        values = [v for v, _ in value_destination_pairs]
        if not values:
            return []
        call = self.call_options(hints_and_options(options, experimental_hints, where), where)
        return list(self.all_reduce(op, values, call))

    def broadcast_to(self, tensor: Any, destinations: Any = None) -> Any:
        """Rank 0's value on every rank."""
        self.check_open(f"{type(self._container).__name__}.extended.broadcast_to")
        return self._cross_device_ops.broadcast(map_local(tensor), destinations)

    def update(self, var: Any, fn: Callable[..., Any], args: tuple = (), kwargs: dict | None = None,
               group: bool = True) -> Any:
        """Run ``fn(var, *args, **kwargs)`` in the cross-replica context (mirrored: on every rank)."""
        context.push(self._container, None)
        try:
            args, kwargs = map_local_call(args, kwargs)
            return fn(var, *args, **kwargs)
        finally:
            context.pop()

    def value_container(self, value: Any) -> Any:
        return value


class CentralStorageExtended(StrategyExtended):
    """Variables and updates live on the chief: updates run on rank 0, then rank 0's result is
    broadcast; reductions go to rank 0 and back (ReductionToOneDevice)."""

    def update(self, var: Any, fn: Any, args: tuple = (), kwargs: dict | None = None, group: bool = True) -> Any:
        result = super().update(var, fn, args, kwargs, group) if self.rank == 0 else var
        return self._cross_device_ops.broadcast(result if result is not None else var)


class Strategy:
    """A distribution strategy whose replicas are the ranks of a communicator.

    ``close()`` (or the end of a ``with strategy:`` block) frees the communicators its engine
    cloned; it is collective over the strategy's ranks.
    """

    update_on_chief = False
    """Whether variables and their updates live on the chief (CentralStorageStrategy): read by both
    implementations (here: CentralStorageExtended; on TensorFlow: MPIExtended)."""

    def __init__(self, engine: Engine, options: CommunicationOptions,
                 cross_device_ops: CrossDeviceOps | None = None, cluster_resolver: Any = None) -> None:
        self._closed = False
        extended_class = CentralStorageExtended if self.update_on_chief else StrategyExtended
        self._extended = extended_class(self, engine, options, cross_device_ops)
        self._cluster_resolver = cluster_resolver

    @property
    def engine(self) -> Engine:
        """The engine whose communicator this strategy's collectives run on."""
        return self._extended.engine

    @property
    def closed(self) -> bool:
        """Whether ``close()`` has run (on this strategy or a copy sharing its engine): collectives then raise."""
        return self._closed or self._extended.engine.closed

    def close(self) -> None:
        """Free the communicators of this strategy's engine (collective: every rank of the strategy
        calls it). Collectives raise afterwards; closing again does nothing."""
        if not self.closed:
            self._closed = True
            self._extended.engine.close()

    def __enter__(self) -> Strategy:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

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
    def scope(self) -> Iterator[Strategy]:
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
            args, kwargs = map_local_call(args, kwargs)
            return fn(*args, **kwargs)
        finally:
            context.pop()

    experimental_run_v2 = run

    def reduce(self, reduce_op: Any, value: Any, axis: Any = None, experimental_hints: Any = None,
               options: Any = None) -> Any:
        """Reduce ``value`` across replicas; with ``axis``, also along that axis (MEAN: over the global
        number of elements along it)."""
        where = f"{type(self).__name__}.reduce"
        self._extended.check_open(where)
        op = as_reduce_op(reduce_op, where)
        opts = self._extended.call_options(hints_and_options(options, experimental_hints, where), where)
        if axis is None:
            return self._extended.all_reduce(op, value, opts)
        return reduce_along_axis(self._extended.engine, op, value, axis, opts, where)

    def gather(self, value: Any, axis: Any) -> Any:
        """Concatenate every replica's value along ``axis`` (sizes along it may differ per rank)."""
        return self._extended.gather(value, axis, self._extended.default_call_options,
                                     f"{type(self).__name__}.gather")

    def experimental_local_results(self, value: Any) -> tuple[Any]:
        """The values of the local replicas: a 1-tuple (one replica per rank)."""
        return (map_local(value),)

    def experimental_distribute_values_from_function(self, value_fn: Callable[[ValueContext], Any]) -> PerReplica:
        return PerReplica(value_fn(ValueContext(self._extended.rank, self.num_replicas_in_sync)))

    def experimental_distribute_dataset(self, dataset: Any, options: Any = None) -> Any:
        """Per-replica batches for this rank from an iterable of global batches (see mpidist.input)."""
        self._extended.check_open(f"{type(self).__name__}.experimental_distribute_dataset")
        return input_api.distribute_dataset(self, dataset, options)

    def distribute_datasets_from_function(self, dataset_fn: Callable[..., Any], options: Any = None) -> Any:
        """``dataset_fn(InputContext)`` builds this rank's input pipeline (see mpidist.input)."""
        self._extended.check_open(f"{type(self).__name__}.distribute_datasets_from_function")
        return input_api.distribute_datasets_from_function(self, dataset_fn, options)

    experimental_distribute_datasets_from_function = distribute_datasets_from_function

    def experimental_make_numpy_dataset(self, numpy_input: Any) -> Any:
        """An in-memory dataset of examples along axis 0; ``.batch(global_batch_size)`` it."""
        return input_api.make_numpy_dataset(self, numpy_input)

    def __deepcopy__(self, memo: dict) -> Strategy:
        """A strategy of the same class on the same engine (its communicators are shared, not
        copied: closing either closes both), as TensorFlow copies its strategies."""
        copy = object.__new__(type(self))
        ext = self._extended
        Strategy.__init__(copy, ext.engine, ext.options, ext.cross_device_ops, self._cluster_resolver)
        memo[id(self)] = copy
        return copy

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError(pickling_refused(self))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_replicas_in_sync={self.num_replicas_in_sync})"


def pickling_refused(strategy: Any) -> str:
    """The message of every strategy's refusal to be pickled (NumPy and TensorFlow)."""
    return (f"{type(strategy).__name__}: a strategy holds MPI communicators and cannot be pickled; build "
            f"it in each process (its class pickles: pickle.dumps(type(strategy)))")
