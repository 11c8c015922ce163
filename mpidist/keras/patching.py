"""How mpidist patches Keras and TensorFlow: one registry, applied once, each patch guarded.

Every patch wraps one function or method and calls the original unchanged unless the object it
acts on belongs to an mpidist strategy of several ranks (``multi_rank``): a one-rank mpidist
strategy, TensorFlow's own strategies and programs without a strategy see plain Keras. The
originals stay reachable (``original``) and ``installed()`` lists what is patched, for tests and
for the list in docs/keras.md.
"""
from __future__ import annotations

import functools
import importlib
import sys
from typing import Any, Callable

_PATCHES: dict[tuple[int, str], tuple[Any, str, Any]] = {}  # (id(owner), name) -> (owner, name, original)

# Keras 2 (tf_keras: ``tf.keras`` under TF_USE_LEGACY_KERAS=1) modules whose functions the patches
# wrap, named here only (tested with tf_keras 2.16 to 2.21).
TF_KERAS_INTERNALS = {
    "training": "tf_keras.src.engine.training",  # reduce_per_replica: predict's "concat" of replicas
    "data_adapter": "tf_keras.src.engine.data_adapter",  # TensorLikeDataAdapter: fit(shuffle=True)'s permutation
    "callbacks": "tf_keras.src.callbacks",  # CSVLogger, BackupAndRestore
    "saving_api": "tf_keras.src.saving.saving_api",  # save_model / save_weights: one writer per path
}


def tf_keras_internal(name: str) -> Any:
    """The tf_keras module of ``TF_KERAS_INTERNALS[name]`` (imports it)."""
    return importlib.import_module(TF_KERAS_INTERNALS[name])


# The private attributes and methods of Keras classes (Keras 3: ``keras``; Keras 2: ``tf_keras``) that
# mpidist reads, writes, calls or overrides, by the class that defines them. Other modules reach them
# only through get_private / set_private / call_private below (a subclass may override one by
# name); tests/unit/test_keras_private_names.py checks each exists in the installed Keras, and
# tests/unit/test_private_reads.py that no other module reads a Keras private name directly.
KERAS_PRIVATE: dict[str, tuple[str, ...]] = {
    "keras.src.callbacks.model_checkpoint.ModelCheckpoint": (
        "_save_model",  # patched: the chief writes
        "_should_save_model", "_get_file_path"),  # the other ranks' same decision, without writing
    "keras.src.callbacks.backup_and_restore.BackupAndRestore": (
        "_save_model",  # patched: the chief writes, atomically
        "_load_model",  # every rank restores the chief's files
        "_training_metadata_path", "_prev_training_metadata_path"),  # the metadata file, renamed in place
    "keras.src.callbacks.tensorboard.TensorBoard": ("_close_writers",),  # before removing a private log_dir
    "keras.src.trainers.data_adapters.array_data_adapter.ArrayDataAdapter": ("_shuffle",),  # fit(shuffle=)
    "keras.src.layers.normalization.batch_normalization.BatchNormalization": (
        "_moments",  # overridden by hvd.SyncBatchNormalization
        "_reduction_axes"),
    "keras.src.optimizers.base_optimizer.BaseOptimizer": (
        "_trainable_variables",  # DistributedOptimizer
        "_clip_gradients"),  # patched: clips the sum over replicas (clipping.py)
    "keras.src.backend.tensorflow.optimizer.TFOptimizer": (
        "_all_reduce_sum_gradients",),  # patched: gradients summed before clipping are not summed again
    "keras.src.backend.tensorflow.trainer.TensorFlowTrainer": (
        "_distribute_strategy",  # a model's strategy
        "_make_function"),  # patched: jit_compile=True compiles the step in two parts (xla.py)
    "keras.src.trainers.trainer.Trainer": ("_resolve_auto_jit_compile",),  # patched: "auto" as without a strategy
    "tf_keras.src.engine.training.Model": ("_distribution_strategy",),  # a tf_keras model's strategy
    "tf_keras.src.callbacks.BackupAndRestore": ("_supported_strategies",),  # mpidist's added: it refuses others
    "tf_keras.src.optimizers.legacy.optimizer_v2.OptimizerV2": ("_compute_gradients",),  # overridden: allreduces
    "tf_keras.src.layers.normalization.batch_normalization.BatchNormalizationBase": (
        "_calculate_mean_and_var",),  # overridden by hvd.SyncBatchNormalization (Keras 2)
}


def _keras_version(cls: type) -> str:
    package = cls.__module__.split(".")[0]
    module = importlib.import_module(package) if package in ("keras", "tf_keras") else None
    return f"{package} {getattr(module, '__version__', '?')}"


def _listed(cls: type, name: str) -> bool:
    return any(name in KERAS_PRIVATE.get(f"{c.__module__}.{c.__qualname__}", ()) for c in cls.__mro__)


def _owner(obj: Any) -> type:
    if isinstance(obj, super):  # super(): the class of the object it was called on
        return obj.__self_class__  # type: ignore[attr-defined]  # typeshed lacks super's attributes
    return type(obj)


def _missing(obj: Any, name: str) -> AttributeError:
    cls = _owner(obj)
    if not _listed(cls, name):
        return AttributeError(f"mpidist: {name} of {cls.__module__}.{cls.__qualname__} is not in "
                              f"patching.KERAS_PRIVATE (list every Keras private name mpidist uses there)")
    return AttributeError(f"mpidist: this Keras ({_keras_version(cls)}) has no {cls.__module__}.{cls.__qualname__}."
                          f"{name}, a private Keras name mpidist relies on (tested with Keras 3.15 and tf_keras "
                          f"2.16 to 2.21); install a tested Keras version")


def get_private(obj: Any, name: str) -> Any:
    """``obj.<name>``, a private Keras attribute listed in KERAS_PRIVATE (``obj`` may be ``super()``);
    a clear AttributeError (class, name, Keras version) when this Keras has no such name."""
    if not _listed(_owner(obj), name):
        raise _missing(obj, name)
    try:
        return getattr(obj, name)
    except AttributeError:
        raise _missing(obj, name) from None


def set_private(obj: Any, name: str, value: Any) -> None:
    """``obj.<name> = value`` for a private Keras attribute listed in KERAS_PRIVATE that ``obj`` has."""
    get_private(obj, name)
    setattr(obj, name, value)


def call_private(obj: Any, name: str, *args: Any, **kwargs: Any) -> Any:
    """``obj.<name>(*args, **kwargs)``, a private Keras method listed in KERAS_PRIVATE."""
    return get_private(obj, name)(*args, **kwargs)


def patch(owner: Any, name: str, make: Callable[[Any], Callable[..., Any]]) -> None:
    """Replace ``owner.name`` by ``make(original)`` (once: a second call does nothing)."""
    key = (id(owner), name)
    if key in _PATCHES:
        return
    original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
    wrapped: Any = make(original)  # a function, marked below as ours
    if callable(original) and not isinstance(original, (staticmethod, classmethod)):
        functools.update_wrapper(wrapped, original)
    wrapped.__mpidist_patch__ = True
    _PATCHES[key] = (owner, name, original)
    setattr(owner, name, wrapped)


def patch_function(owner: Any, name: str, make: Callable[[Any], Callable[..., Any]]) -> None:
    """``patch`` the module-level function ``owner.name`` wherever it is reachable: in the module
    that defines it (so an API module imported later re-exports the patched one) and in every
    module already imported that re-exports it (``owner`` among them).

    Patching only the API module one was handed is not enough: TensorFlow's and Keras's API modules
    can be imported a second time under another name, and the copy replaces the attribute
    (``from tensorflow.saved_model.experimental import ...``, which Keras 3's ``model.export``
    runs, makes a fresh ``tensorflow.saved_model`` module that becomes ``tf.saved_model``)."""
    function = original(owner, name)
    source = sys.modules.get(getattr(function, "__module__", None) or "")
    owners = [source] if source is not None else []
    for module in list(sys.modules.values()):  # __dict__, not getattr: no lazy module is imported here
        if getattr(module, "__dict__", {}).get(name) is function and module is not source:
            owners.append(module)
    if owner not in owners:
        owners.append(owner)
    for each in owners:
        patch(each, name, make)


def replace(owner: Any, name: str, value: Any) -> None:
    """Set ``owner.name = value`` (a class or constant, not a wrapper: ``mpidist run`` puts mpidist's
    strategy classes in ``tf.distribute``), recorded like a patch (once: a second call does nothing)."""
    key = (id(owner), name)
    if key in _PATCHES:
        return
    _PATCHES[key] = (owner, name, getattr(owner, name))
    setattr(owner, name, value)


def original(owner: Any, name: str) -> Any:
    """The function ``patch`` replaced (``owner.name`` itself when it is not patched)."""
    found = _PATCHES.get((id(owner), name))
    return found[2] if found else getattr(owner, name)


def installed() -> list[str]:
    """``module.Class.name`` of every patch in place."""
    out = []
    for owner, name, _ in _PATCHES.values():
        qual = getattr(owner, "__qualname__", None) or getattr(owner, "__name__", repr(owner))
        out.append(f"{getattr(owner, '__module__', '')}.{qual}.{name}".lstrip("."))
    return sorted(out)


def is_mpidist(strategy: Any) -> bool:
    """Whether ``strategy`` is an mpidist ``tf.distribute.Strategy`` (of any number of ranks)."""
    from ..tensorflow.strategy import MPIStrategy
    return isinstance(strategy, MPIStrategy)


def multi_rank(strategy: Any) -> Any:
    """``strategy`` if it is an mpidist ``tf.distribute.Strategy`` of more than one rank, else None."""
    if is_mpidist(strategy) and strategy.num_replicas_in_sync > 1:
        return strategy
    return None


def model_strategy(model: Any) -> Any:
    """The multi-rank mpidist strategy a Keras model was built under (or the one in scope), or None."""
    strategy = built_under(model) if model is not None else None
    if strategy is None:
        import tensorflow as tf
        strategy = tf.distribute.get_strategy() if tf.distribute.has_strategy() else None
    return multi_rank(strategy)


def tracked_strategy(trackable: Any) -> Any:
    """The first multi-rank mpidist strategy (``multi_rank``) that ``trackable`` or an object it tracks,
    at any depth, was built under (``built_under``): a ``tf.train.Checkpoint`` holding a model, a
    ``tf.Module`` holding variables, Keras 3's export archive (lists of the model's variables); None
    when there is none or ``trackable`` is not a TensorFlow trackable."""
    import tensorflow as tf
    found = multi_rank(built_under(trackable))
    if found is not None or not hasattr(trackable, "_trackable_children"):
        return found
    for node in tf.train.TrackableView(trackable).descendants():
        found = multi_rank(built_under(node))
        if found is not None:
            return found
    return None


def built_under(obj: Any) -> Any:
    """The strategy a Keras 3 model or TensorFlow variable (``_distribute_strategy``) or a tf_keras
    model (``_distribution_strategy``) was created under, or None."""
    strategy = getattr(obj, "_distribute_strategy", None)
    return strategy if strategy is not None else getattr(obj, "_distribution_strategy", None)
