"""How mpidist patches Keras and TensorFlow: one registry, applied once, each patch guarded.

Every patch wraps one function or method and calls the original unchanged unless the object it
acts on belongs to an mpidist strategy of several ranks (``multi_rank``): a one-rank mpidist
strategy, TensorFlow's own strategies and programs without a strategy see plain Keras. The
originals stay reachable (``original``) and ``installed()`` lists what is patched, for tests and
for the README's list.
"""
from __future__ import annotations

import functools
import importlib
from typing import Any, Callable

_PATCHES: dict[tuple[int, str], tuple[Any, str, Any]] = {}  # (id(owner), name) -> (owner, name, original)

# Keras 2 (tf_keras: ``tf.keras`` under TF_USE_LEGACY_KERAS=1) modules whose functions the patches
# wrap, named here only (tested with tf_keras 2.16 to 2.21).
TF_KERAS_INTERNALS = {
    "training": "tf_keras.src.engine.training",  # reduce_per_replica: predict's "concat" of replicas
    "data_adapter": "tf_keras.src.engine.data_adapter",  # TensorLikeDataAdapter: fit(shuffle=True)'s permutation
}


def tf_keras_internal(name: str) -> Any:
    """The tf_keras module of ``TF_KERAS_INTERNALS[name]`` (imports it)."""
    return importlib.import_module(TF_KERAS_INTERNALS[name])


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


def multi_rank(strategy: Any) -> Any:
    """``strategy`` if it is an mpidist ``tf.distribute.Strategy`` of more than one rank, else None."""
    from ..tensorflow.strategy import MPIStrategy
    if isinstance(strategy, MPIStrategy) and strategy.num_replicas_in_sync > 1:
        return strategy
    return None


def model_strategy(model: Any) -> Any:
    """The multi-rank mpidist strategy a Keras model was built under (or the one in scope), or None."""
    strategy = getattr(model, "_distribute_strategy", None) if model is not None else None
    if strategy is None:
        import tensorflow as tf
        strategy = tf.distribute.get_strategy() if tf.distribute.has_strategy() else None
    return multi_rank(strategy)


def child_strategies(trackable: Any) -> list[Any]:
    """The strategies (or None) of the objects a ``tf.train.Checkpoint``-like object tracks
    (TensorFlow's ``_trackable_children`` and each child's ``_distribute_strategy``)."""
    children = getattr(trackable, "_trackable_children", None)
    found = children().values() if callable(children) else ()
    return [getattr(child, "_distribute_strategy", None) for child in found]
