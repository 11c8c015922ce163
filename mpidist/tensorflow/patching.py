"""How mpidist patches Keras and TensorFlow: one registry through which every replacement goes.

Every replacement of an attribute of TensorFlow, Keras 3 or tf_keras (a wrapped method or
function, a class put in an API module, a method added that Keras 3 lacks) is made here
(``patch``, ``patch_function``, ``replace``) and recorded with its reason and the versions it was
checked against; ``installed()`` lists them all, ``records()`` gives the details, ``original`` the
replaced value. One more kind is recorded here although it changes no attribute of TensorFlow or
Keras: ``adopt`` gives one object (a user's optimizer, a PreemptionCheckpointHandler) a generated
subclass of its own class. Installing is idempotent (a second call for the same attribute does
nothing) and thread-safe (one lock around each check-and-replace). Nothing is patched when a module
is imported: patches are installed when an mpidist TensorFlow strategy is built
(``mpidist.tensorflow.keras.install``) and at ``hvd.init()`` (``mpidist.horovod.tensorflow``);
``tests/unit/test_patch_registry.py`` compares TensorFlow's and Keras's attributes before and after
both and fails on a change this registry does not list. docs/design.md, "Patches", lists them.

Most patches wrap one function or method and call the original unchanged unless the object it
acts on belongs to an mpidist strategy of several ranks (``multi_rank``): a one-rank mpidist
strategy, TensorFlow's own strategies and programs without a strategy see plain Keras.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import sys
import threading
from typing import Any, Callable

# What the patches were checked against (``checked=`` of each record).
KERAS3 = "Keras 3.15 on TensorFlow 2.21"
KERAS2 = "tf_keras 2.16 to 2.21"
TENSORFLOW = "TensorFlow 2.16 to 2.21"


class _Absent:
    """The original of an attribute that did not exist before the patch."""

    def __repr__(self) -> str:
        return "<absent>"


ABSENT: Any = _Absent()


@dataclasses.dataclass(frozen=True)
class Patch:
    """One replacement: ``owner.name`` (a module or class) or, for ``kind == "adopt"``, the class of
    objects of ``owner`` given a subclass one by one."""
    owner: Any
    name: str
    original: Any
    reason: str
    checked: str
    kind: str  # "wrap" (patch), "replace", "adopt"

    @property
    def path(self) -> str:
        """``module.Class.name`` (``module.name`` for a module's attribute)."""
        qual = getattr(self.owner, "__qualname__", None) or getattr(self.owner, "__name__", repr(self.owner))
        module = getattr(self.owner, "__module__", "") if isinstance(self.owner, type) else ""
        return f"{module}.{qual}.{self.name}".lstrip(".")


_PATCHES: dict[tuple[int, str], Patch] = {}  # (id(owner), name) -> its record
_LOCK = threading.RLock()  # around every check-and-replace (patch_function holds it across its modules)


def _check(reason: str, checked: str, where: str) -> None:
    if not (isinstance(reason, str) and reason.strip()):
        raise ValueError(f"patching.{where}: `reason` must say why the patch exists, got {reason!r}")
    if not (isinstance(checked, str) and checked.strip()):
        raise ValueError(f"patching.{where}: `checked` must name the versions checked, got {checked!r}")


def _current(owner: Any, name: str) -> Any:
    """``owner.name`` as stored (a class's attribute found along its MRO without running descriptors:
    a staticmethod stays one), or ABSENT."""
    if isinstance(owner, type):
        return inspect.getattr_static(owner, name, ABSENT)
    found = getattr(owner, "__dict__", {}).get(name, ABSENT)
    return getattr(owner, name, ABSENT) if found is ABSENT else found


def patch(owner: Any, name: str, make: Callable[[Any], Callable[..., Any]], *, reason: str,
          checked: str) -> None:
    """Replace ``owner.name`` by ``make(original)`` (once: a second call does nothing), recorded with
    ``reason`` (why) and ``checked`` (the Keras/TensorFlow versions whose code it was checked against)."""
    _check(reason, checked, "patch")
    with _LOCK:
        key = (id(owner), name)
        if key in _PATCHES:
            return
        original = _current(owner, name)
        if original is ABSENT:
            raise AttributeError(f"patching.patch: {owner!r} has no `{name}` to wrap (use replace to add one)")
        wrapped: Any = make(original)  # a function, marked below as ours
        if callable(original) and not isinstance(original, (staticmethod, classmethod)):
            functools.update_wrapper(wrapped, original)
        wrapped.__mpidist_patch__ = True
        _PATCHES[key] = Patch(owner, name, original, reason, checked, "wrap")
        setattr(owner, name, wrapped)


def patch_function(owner: Any, name: str, make: Callable[[Any], Callable[..., Any]], *, reason: str,
                   checked: str) -> None:
    """``patch`` the module-level function ``owner.name`` wherever it is reachable: in the module
    that defines it, under its own name (so an API module imported later re-exports the patched
    one), and in every module already imported that re-exports it (``owner`` among them).

    Patching only the API module one was handed is not enough: TensorFlow's and Keras's API modules
    can be imported a second time under another name, and the copy replaces the attribute
    (``from tensorflow.saved_model.experimental import ...``, which Keras 3's ``model.export``
    runs, makes a fresh ``tensorflow.saved_model`` module that becomes ``tf.saved_model``)."""
    with _LOCK:
        function = original(owner, name)
        spellings = {name, getattr(function, "__name__", name)}  # tf.random.shuffle is random_ops.random_shuffle
        found = []
        for module in list(sys.modules.values()):  # __dict__, not getattr: no lazy module is imported here
            for spelling in spellings:
                if getattr(module, "__dict__", {}).get(spelling) is function:
                    found.append((module, spelling))
        if not any(module is owner for module, _ in found):
            found.append((owner, name))
        for module, spelling in found:
            patch(module, spelling, make, reason=reason, checked=checked)


def replace(owner: Any, name: str, value: Any, *, reason: str, checked: str) -> None:
    """Set ``owner.name = value`` (a class or constant rather than a wrapper, or an attribute the owner
    lacks), recorded like a patch (once: a second call does nothing)."""
    _check(reason, checked, "replace")
    with _LOCK:
        key = (id(owner), name)
        if key in _PATCHES:
            return
        _PATCHES[key] = Patch(owner, name, _current(owner, name), reason, checked, "replace")
        setattr(owner, name, value)


def adopt(obj: Any, subclass: type, *, reason: str, checked: str) -> Any:
    """Make ``obj`` an instance of ``subclass``, a class mpidist derived from ``type(obj)`` that adds
    no slots: the object keeps its state, and is recorded once per original class (the object's own
    ``__class__`` changes; no attribute of TensorFlow or Keras does). Returns ``obj``."""
    _check(reason, checked, "adopt")
    cls = type(obj)
    if not (isinstance(subclass, type) and issubclass(subclass, cls)):
        raise TypeError(f"patching.adopt: `subclass` must be a subclass of {cls.__qualname__}, got {subclass!r}")
    with _LOCK:
        _PATCHES.setdefault((id(cls), "__class__"), Patch(cls, "__class__", cls, reason, checked, "adopt"))
    obj.__class__ = subclass
    return obj


def original(owner: Any, name: str) -> Any:
    """The value ``patch`` or ``replace`` replaced (``owner.name`` itself when it is not patched)."""
    with _LOCK:
        found = _PATCHES.get((id(owner), name))
    if found is not None and found.kind != "adopt":
        return found.original
    return getattr(owner, name)


def records() -> list[Patch]:
    """Every patch in place, in ``installed()``'s order."""
    with _LOCK:
        return sorted(_PATCHES.values(), key=lambda record: record.path)


def installed() -> list[str]:
    """``module.Class.name`` (``module.name``) of every patch in place, sorted; ``.__class__`` for a
    class some of whose objects ``adopt`` gave a subclass."""
    return [record.path for record in records()]


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


def built_under(obj: Any) -> Any:
    """The strategy a Keras 3 model or TensorFlow variable (``_distribute_strategy``) or a tf_keras
    model (``_distribution_strategy``) was created under, or None."""
    strategy = getattr(obj, "_distribute_strategy", None)
    return strategy if strategy is not None else getattr(obj, "_distribution_strategy", None)


def is_trackable(obj: Any) -> bool:
    """Whether ``obj`` is a TensorFlow trackable (has ``_trackable_children``: tf.train.TrackableView walks it)."""
    return hasattr(obj, "_trackable_children")
