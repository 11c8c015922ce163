"""Every private TensorFlow symbol mpidist.tensorflow uses, imported here and nowhere else.

A genuine ``tf.distribute.Strategy`` needs a few of TensorFlow's internals (found with TF 2.21 /
Keras 3.15; see docs/design.md). Each one is imported under a guard: when a TensorFlow
release moves or drops one, importing mpidist.tensorflow fails with an error that names the
symbol and the TensorFlow version, instead of an AttributeError deep inside a training step.
Optional symbols (a faster path only) fall back silently. ``TF_PRIVATE`` lists the private
attributes and methods of TensorFlow classes that mpidist reads here or overrides in its
subclasses (checked against the installed TensorFlow by tests/unit/test_keras_private_names.py).

Required:
- ``distribute_lib.UpdateContext``: the cross-replica update context (``extended.update``) that
  tells distributed variables which replica's component to update.
- ``values.MirroredVariable``: what variables created in the scope become (one component, this
  rank's variable), as under TensorFlow's MultiWorkerMirroredStrategy; replica-context updates
  are aggregated by its own code through ``extended.reduce_to`` / ``broadcast_to``.
- ``values.SyncOnReadVariable``: the variable kind Keras metrics are made of under a strategy;
  reads in cross-replica context aggregate over replicas (global epoch metrics). mpidist uses a
  subclass whose cross-replica ``assign`` (``metric.reset_state()``) returns the aggregate without
  a collective: after such an assign every replica holds the same value, so the aggregate is
  known locally (TensorFlow's reads it back through an all-reduce).
- ``values_util.is_saving_non_distributed`` and ``distribute_lib.get_update_replica_id``: the
  two context checks ``SyncOnReadVariable.assign`` itself makes.
- ``control_flow_util.GraphOrParentsInXlaContext``: whether code is being traced for XLA, where
  a ``tf.numpy_function`` cannot run (and which function: the outermost graph in that context).
- ``trackable.base.CheckpointInitialValue`` / ``CheckpointInitialValueCallable``: initial
  values that come from a checkpoint being restored (equal on every rank, not broadcast).
- ``framework.composite_tensor.CompositeTensor``: the base that lets a distributed iterator be
  passed into a ``tf.function`` as a value (Keras does so every step) without a retrace per epoch.
- ``data.experimental.ops.distribute._AutoShardDataset``: TensorFlow's own graph rewrite that
  shards a dataset by its input files (what TF's MultiWorkerMirroredStrategy applies).
- ``DatasetV2._as_serialized_graph`` (a method): the dataset's GraphDef, read to find the files a
  dataset reads and count them before sharding by file.
- ``Variable._distribute_strategy`` and ``_distributed_container`` (attributes, read with
  ``getattr``: absent means None): the strategy a variable was created under
  (``colocate_vars_with`` checks it) and the distributed variable a component belongs to
  (``extended.value_container``).

Optional:
- ``eager.record.could_possibly_record``: whether a gradient tape may be recording; lets eager
  collectives skip the custom-gradient wrapper when nothing can differentiate through them.
- ``ops.script_ops._py_funcs`` and ``ops.gen_script_ops.py_func``: the registry and the op behind
  ``tf.numpy_function``. Registering the collective's function directly skips the AutoGraph
  wrapper ``tf.numpy_function`` puts around every call (measured here: 90 -> 70 us per op). Without
  them, ``tf.numpy_function`` itself is used.
- ``ops.control_flow_util.IsInCond`` / ``IsInWhileLoop``: whether a v1 graph op sits inside
  control flow v1, where Horovod's v1 collectives are refused (their run-time order needs ops that
  run once per step). Without them nothing is refused.
- ``ops.control_flow_util.InXlaContext``: whether a graph itself (not its parents) is in the XLA
  context, which tells the function being compiled by XLA, named in errors. Without it the
  innermost function is named.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable

import tensorflow as tf

TESTED_WITH = "TensorFlow 2.16 to 2.21"


def _require(module: str, name: str) -> Any:
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as error:
        raise ImportError(
            f"mpidist.tensorflow: this TensorFlow ({tf.__version__}) has no {module}.{name}, a private "
            f"symbol mpidist needs (tested with {TESTED_WITH}); install a tested TensorFlow version "
            f"({type(error).__name__}: {error})") from error


def _optional(module: str, name: str) -> Any:
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


_TF = "tensorflow.python."
REQUIRED = (  # module, symbol
    (_TF + "distribute.distribute_lib", "UpdateContext"),
    (_TF + "distribute.distribute_lib", "get_update_replica_id"),
    (_TF + "distribute.values", "SyncOnReadVariable"),
    (_TF + "distribute.values", "MirroredVariable"),
    (_TF + "distribute.values_util", "is_saving_non_distributed"),
    (_TF + "ops.control_flow_util", "GraphOrParentsInXlaContext"),
    (_TF + "trackable.base", "CheckpointInitialValue"),
    (_TF + "trackable.base", "CheckpointInitialValueCallable"),
    (_TF + "framework.composite_tensor", "CompositeTensor"),
    (_TF + "data.experimental.ops.distribute", "_AutoShardDataset"),
)
REQUIRED_METHODS = (  # class, method
    (tf.data.Dataset, "_as_serialized_graph"),
)
OPTIONAL = (
    (_TF + "eager.record", "could_possibly_record"),
    (_TF + "ops.script_ops", "_py_funcs"),
    (_TF + "ops.gen_script_ops", "py_func"),
    (_TF + "ops.control_flow_util", "IsInCond"),
    (_TF + "ops.control_flow_util", "IsInWhileLoop"),
    (_TF + "ops.control_flow_util", "InXlaContext"),
)

(UpdateContext, _get_update_replica_id, SyncOnReadVariable, MirroredVariable, _is_saving_non_distributed, _graph_in_xla,
 CheckpointInitialValue, CheckpointInitialValueCallable, CompositeTensor, _AutoShardDataset) = \
    [_require(m, n) for m, n in REQUIRED]
for _cls, _method in REQUIRED_METHODS:
    if not callable(getattr(_cls, _method, None)):
        raise ImportError(f"mpidist.tensorflow: this TensorFlow ({tf.__version__}) has no {_cls.__name__}.{_method}, "
                          f"a private method mpidist needs (tested with {TESTED_WITH}); install a tested "
                          f"TensorFlow version")
_could_possibly_record, _py_funcs, _py_func_op, _is_in_cond, _is_in_while_loop, _in_xla = \
    [_optional(m, n) for m, n in OPTIONAL]

# The private attributes and methods of TensorFlow classes that mpidist reads, calls or overrides,
# by the class that defines them: read only here (container_strategy, the subclasses above); the
# others are hooks mpidist's subclasses override by name (MPIExtended, MPIIteratorSpec,
# MPIDistributedIterator), which TensorFlow would silently stop calling if it renamed them.
# tests/unit/test_keras_private_names.py checks each exists in the installed TensorFlow.
TF_PRIVATE: dict[str, tuple[str, ...]] = {
    _TF + "distribute.distribute_lib.StrategyExtendedV1": (
        "_container_strategy",
        "_create_variable", "_validate_colocate_with_variable", "_call_for_each_replica", "_local_results",
        "_num_replicas_in_sync", "_in_multi_worker_mode", "_reduce_to", "_batch_reduce_to",
        "_replica_ctx_all_reduce", "_broadcast_to", "_gather_to_implementation", "_update", "_update_non_slot",
        "_experimental_distribute_dataset", "_distribute_datasets_from_function",
        "_experimental_distribute_values_from_function", "_make_dataset_iterator", "_make_input_fn_iterator",
        "_experimental_make_numpy_dataset"),
    _TF + "distribute.values.DistributedValues": ("_values",),
    _TF + "distribute.values.DistributedVariable": ("_distribute_strategy", "_get_on_device_or_primary",
                                                     "_update_replica"),
    _TF + "framework.type_spec.TypeSpec": ("_serialize", "_deserialize", "_component_specs", "_to_components",
                                           "_from_components", "_without_tensor_names"),
    _TF + "framework.composite_tensor.CompositeTensor": ("_type_spec",),
    _TF + "trackable.base.Trackable": ("_trackable_children",),
    _TF + "data.ops.dataset_ops.DatasetV2": ("_as_serialized_graph",),
    _TF + "checkpoint.checkpoint_management.CheckpointManager": ("_latest_checkpoint", "_maybe_delete"),
    _TF + "ops.resource_variable_ops.BaseResourceVariable": ("_as_graph_element",),  # what a v1 Session fetches
    _TF + "client.session.BaseSession": ("_make_callable_from_options",),  # how tf_keras runs v1 graphs
    _TF + "eager.polymorphic_function.polymorphic_function.Function": ("_autograph",),  # xla.split: as tf.function
}


def make_session_fetchable(cls: type) -> None:
    """Let a ``tf.compat.v1.Session`` fetch instances of ``cls``, a variable class holding a TensorFlow
    variable as its ``value``, as it fetches that variable (TensorFlow's ``_as_graph_element``
    protocol). Nothing is replaced where ``cls`` has the protocol already."""
    if hasattr(cls, "_as_graph_element"):
        return

    def _as_graph_element(self: Any) -> Any:  # None eagerly: then the Session's own error stands
        convert = getattr(self.value, "_as_graph_element", None)
        return convert() if callable(convert) else None

    cls._as_graph_element = _as_graph_element  # type: ignore[attr-defined]  # pylint: disable=protected-access


def wrap_session_callables(wrap: Any) -> None:
    """Replace ``tf.compat.v1.Session``'s (and ``InteractiveSession``'s) ``_make_callable_from_options``
    (how ``make_callable`` and tf_keras's v1 graph functions run a graph) by ``wrap(original)``."""
    original = getattr(tf.compat.v1.Session, "_make_callable_from_options", None)
    if not callable(original):
        raise AttributeError(f"mpidist: this TensorFlow ({tf.__version__}) has no "
                             f"Session._make_callable_from_options, a private name mpidist relies on "
                             f"(tested with {TESTED_WITH}); install a tested TensorFlow version")
    wrapped = wrap(original)
    for cls in (tf.compat.v1.Session, tf.compat.v1.InteractiveSession):
        cls._make_callable_from_options = wrapped  # pylint: disable=protected-access


def container_strategy(extended: Any) -> Any:
    """The ``tf.distribute.Strategy`` whose ``extended`` this is (``StrategyExtended._container_strategy``)."""
    return extended._container_strategy()  # pylint: disable=protected-access


def set_latest_checkpoint(manager: Any, path: str) -> None:
    """Make ``tf.train.CheckpointManager.latest_checkpoint`` report ``path`` (``_latest_checkpoint``)."""
    if not hasattr(manager, "_latest_checkpoint"):
        raise AttributeError(f"mpidist: this TensorFlow ({tf.__version__}) has no "
                             f"tf.train.CheckpointManager._latest_checkpoint, a private name mpidist relies on "
                             f"(tested with {TESTED_WITH}); install a tested TensorFlow version")
    manager._latest_checkpoint = path  # pylint: disable=protected-access


def set_manager_state(manager: Any, latest: str, kept: dict[str, float]) -> None:
    """Make ``tf.train.CheckpointManager`` report ``latest`` and keep ``kept`` (path -> timestamp,
    oldest first) as the checkpoints it manages (``_latest_checkpoint``, ``_maybe_delete``): what a
    manager that saved them itself would hold."""
    import collections
    if not hasattr(manager, "_maybe_delete"):
        raise AttributeError(f"mpidist: this TensorFlow ({tf.__version__}) has no "
                             f"tf.train.CheckpointManager._maybe_delete, a private name mpidist relies on "
                             f"(tested with {TESTED_WITH}); install a tested TensorFlow version")
    manager._maybe_delete = collections.OrderedDict(kept)  # pylint: disable=protected-access
    set_latest_checkpoint(manager, latest)


def in_xla_context() -> bool:
    """True while tracing code that XLA will compile (``tf.function(jit_compile=True)``)."""
    if tf.executing_eagerly():
        return False
    return bool(_graph_in_xla(tf.compat.v1.get_default_graph()))


def xla_function_name() -> str:
    """The name of the function being compiled by XLA whose trace is in progress, or "?".

    Calling a ``tf.function(jit_compile=True)`` enters the XLA context on the CALLER's graph, so
    that function is the graph (from the current one outwards) whose outer graph is itself in the
    XLA context; without ``InXlaContext``, the innermost function graph."""
    graph = tf.compat.v1.get_default_graph()
    innermost = graph
    while True:
        outer = getattr(graph, "outer_graph", None)
        if outer is None:
            break
        if _in_xla is not None and _in_xla(outer):
            return str(getattr(graph, "name", "?"))
        graph = outer
    return str(getattr(innermost, "name", "?"))


def function_autograph(function: Any) -> bool:
    """Whether a ``tf.function`` converts its Python function with AutoGraph (``Function._autograph``;
    True, tf.function's default, where it has no such attribute)."""
    return bool(getattr(function, "_autograph", True))


def in_v1_control_flow(op: Any) -> bool:
    """Whether graph op ``op`` is inside ``tf.compat.v1`` control flow (control flow v1: a cond's
    Switch/Merge or a while loop's frame), where it may run zero or many times in one step."""
    return any(bool(check(op)) for check in (_is_in_cond, _is_in_while_loop) if check is not None)


def may_record_gradients() -> bool:
    """False only when nothing can differentiate through an op made now: eagerly, with no
    gradient tape recording. While tracing a graph it is True: ``tf.gradients`` differentiates
    graphs without a tape (the custom gradient then costs only an IdentityN op)."""
    if _could_possibly_record is None or not tf.executing_eagerly():
        return True
    return bool(_could_possibly_record())


def is_checkpoint_initial_value(initial_value: Any) -> bool:
    """Whether a variable's initial value is being restored from a checkpoint."""
    func = getattr(initial_value, "func", None)  # functools.partial around one (Keras does this)
    return isinstance(initial_value, (CheckpointInitialValue, CheckpointInitialValueCallable)) or \
        isinstance(func, CheckpointInitialValueCallable)


class _SyncOnReadVariable(SyncOnReadVariable):  # type: ignore[valid-type, misc]  # a class loaded by name (guarded)
    """TensorFlow's SyncOnReadVariable; a cross-replica ``assign`` reads its result back locally."""

    def assign(self, value: Any, use_locking: bool = False, name: Any = None, read_value: bool = True) -> Any:
        strategy = self._distribute_strategy
        every_replica = (not _is_saving_non_distributed() and _get_update_replica_id() is None and
                         (not tf.distribute.has_strategy() or (tf.distribute.get_strategy() is strategy and
                                                               tf.distribute.in_cross_replica_context())))
        if not read_value or not every_replica:
            return super().assign(value, use_locking, name, read_value)
        assigned = super().assign(value, use_locking, name, read_value=False)
        with tf.control_dependencies(None if tf.executing_eagerly() or assigned is None else [assigned]):
            local = self._values[0].read_value()
        if self.aggregation == tf.VariableAggregation.SUM:  # every replica holds value / replicas
            return local * tf.cast(strategy.num_replicas_in_sync, local.dtype)
        return local  # MEAN, ONLY_FIRST_REPLICA: every replica holds value


def make_sync_on_read(strategy: Any, variable: Any, aggregation: Any) -> Any:
    """Wrap this rank's ``variable`` as a SyncOnReadVariable of one component."""
    return _SyncOnReadVariable(strategy, [variable], aggregation)


class _MirroredVariable(MirroredVariable):  # type: ignore[valid-type, misc]  # a class loaded by name (guarded)
    """TensorFlow's MirroredVariable; ``int(v)`` and ``float(v)`` read it, as for a plain variable
    (Keras's own tests do ``int(layer.counter.value)``); an integer ONLY_FIRST_REPLICA variable (a
    step counter: Keras's ``optimizer.iterations``, Keras 2's ``model._train_counter``, which Keras 2
    leaves trainable; integers have no gradient either way) updated in a replica context is updated
    on each rank without a collective (every rank counts the same steps): TensorFlow would broadcast
    replica 0's value, one more collective in every Keras training step."""

    def __int__(self) -> int:  # int(v) / float(v) as for a plain variable (TensorFlow's MirroredVariable
        return int(self.read_value())  # raises TypeError); every rank holds the same value

    def __float__(self) -> float:
        return float(self.read_value())

    def _update_replica(self, update_fn: Any, value: Any, **kwargs: Any) -> Any:
        if self.aggregation == tf.VariableAggregation.ONLY_FIRST_REPLICA and self.dtype.is_integer:
            return update_fn(self._get_on_device_or_primary(), value, **kwargs)
        return super()._update_replica(update_fn, value, **kwargs)


def make_mirrored(strategy: Any, variable: Any, aggregation: Any) -> Any:
    """Wrap this rank's ``variable`` as a MirroredVariable of one component (what TensorFlow's
    MultiWorkerMirroredStrategy makes with one device per worker)."""
    return _MirroredVariable(strategy, [variable], aggregation)


def is_sync_on_read(value: Any) -> bool:
    return isinstance(value, SyncOnReadVariable)


def numpy_op(func: Callable[..., Any], inputs: list[Any], dtypes: list[Any], name: str) -> list[Any]:
    """What ``tf.numpy_function(func, inputs, dtypes, stateful=True, name=name)`` builds, without
    the AutoGraph wrapper around every call when TensorFlow's registry is reachable."""
    if _py_funcs is None or _py_func_op is None or not hasattr(_py_funcs, "insert"):
        return tf.numpy_function(func, inputs, dtypes, stateful=True, name=name)
    token = _py_funcs.insert(func)
    graph = tf.compat.v1.get_default_graph()
    while getattr(graph, "outer_graph", None) is not None:  # the outermost graph outlives the function
        graph = graph.outer_graph
    if not hasattr(graph, "_py_funcs_used_in_graph"):
        graph._py_funcs_used_in_graph = []  # pylint: disable=protected-access
    graph._py_funcs_used_in_graph.append(func)  # keeps `func` alive (the registry holds weak references)
    return _py_func_op(input=inputs, token=token, Tout=dtypes, name=name)


def serialized_graph(dataset: tf.data.Dataset) -> Any:
    """The ``tf.compat.v1.GraphDef`` of ``dataset``'s pipeline (functions in its library)."""
    graph = tf.compat.v1.GraphDef()
    ignore = tf.data.experimental.ExternalStatePolicy.IGNORE  # py_function maps etc.: only read, never run
    graph.ParseFromString(dataset._as_serialized_graph(  # pylint: disable=protected-access
        external_state_policy=ignore).numpy())
    return graph


def auto_shard(dataset: tf.data.Dataset, num_workers: int, index: int, policy: Any) -> tf.data.Dataset:
    """TensorFlow's auto-shard graph rewrite with ``policy`` (FILE: worker ``index`` reads files
    index, index + num_workers, ...; HINT: ``shard(SHARD_HINT, SHARD_HINT)`` placeholders filled in)."""
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = policy
    return _AutoShardDataset(dataset.with_options(options), num_workers, index, num_workers)


def owning_strategy(variable: Any) -> Any:
    """The ``tf.distribute.Strategy`` a variable was created under (``Variable._distribute_strategy``), or None."""
    return getattr(variable, "_distribute_strategy", None)


def distributed_container(value: Any) -> Any:
    """The DistributedVariable whose component ``value`` is (``_distributed_container``), or None."""
    container = getattr(value, "_distributed_container", None)
    return container() if callable(container) else None
