"""Whose is a Keras model, a variable or a checkpoint: the mpidist strategy it was built under.

What the patches (``mpidist.tensorflow.patching``) ask before acting: each acts only for an object
of a multi-rank mpidist strategy (``multi_rank``) and calls the original otherwise. Where a Keras
object keeps its strategy is a Keras private name: ``patching.built_under`` reads it.
"""
from __future__ import annotations

from typing import Any

from .patching import built_under, is_trackable
from .strategy import MPIStrategy


def is_mpidist(strategy: Any) -> bool:
    """Whether ``strategy`` is an mpidist ``tf.distribute.Strategy`` (of any number of ranks)."""
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
    if found is not None or not is_trackable(trackable):
        return found
    for node in tf.train.TrackableView(trackable).descendants():
        found = multi_rank(built_under(node))
        if found is not None:
            return found
    return None


__all__ = ["is_mpidist", "multi_rank", "model_strategy", "tracked_strategy", "built_under"]
