"""``tf.train.Checkpoint.save`` / ``write`` called by every rank under an mpidist strategy.

``tf.train.CheckpointManager.save`` likewise: the chief writes and deletes old checkpoints.

Every rank saving to one shared directory races (TensorFlow's own strategies race too: a rank
finds another's ``ckpt-1_temp`` gone). Patched, when the checkpoint belongs to a multi-rank mpidist
strategy, they become ``mpidist.tensorflow.checkpoint.save`` / ``write``: the chief writes, the
other ranks do not touch the path (they only advance ``save_counter``), every rank returns the
same path once the files are complete, and an error is raised on every rank. So the call is
collective: make it on every rank, as TensorFlow's multi-worker guide says.

A checkpoint belongs to a strategy when it is saved inside that strategy's scope, or when one of
the objects it was given (a Keras model or optimizer) was built in that strategy's scope. Ranks
that each pass a path of their own (one allreduce tells) write it themselves, as without a strategy.
"""
from __future__ import annotations

from typing import Any, Callable

from ..tensorflow import _tf_private, checkpoint
from . import patching


def strategy_of(ckpt: Any) -> Any:
    """The multi-rank mpidist strategy ``ckpt`` belongs to (see the module docstring), or None."""
    import tensorflow as tf
    if tf.distribute.has_strategy():
        return patching.multi_rank(tf.distribute.get_strategy())
    for child_strategy in patching.child_strategies(ckpt):
        found = patching.multi_rank(child_strategy)
        if found is not None:
            return found
    return None


def _collective(helper: Callable[..., str]) -> Callable[[Any], Callable[..., Any]]:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def method(self: Any, file_prefix: Any, options: Any = None, **kwargs: Any) -> Any:
            # the chief's own call inside the collective save is TensorFlow's
            strategy = None if (checkpoint.chief_writing() or kwargs) else strategy_of(self)
            if strategy is None or not checkpoint.same_on_every_rank(strategy, file_prefix):
                return original(self, file_prefix, options=options, **kwargs)
            return helper(self, file_prefix, strategy=strategy, options=options)
        return method
    return make


def _manager_save(original: Callable[..., Any]) -> Callable[..., Any]:
    def save(self: Any, checkpoint_number: Any = None, check_interval: bool = True, options: Any = None) -> Any:
        strategy = None if checkpoint.chief_writing() else strategy_of(self.checkpoint)
        if strategy is None:
            return original(self, checkpoint_number, check_interval, options)
        saved = checkpoint.on_chief(strategy, lambda: original(self, checkpoint_number, check_interval, options)
                                    or "", "tf.train.CheckpointManager.save")
        if strategy.engine.rank != 0 and saved:
            self.checkpoint.save_counter.assign_add(1)
            _tf_private.set_latest_checkpoint(self, saved)  # what the chief's manager now reports
        return saved or None
    return save


def install() -> None:
    import tensorflow as tf
    patching.patch(tf.train.Checkpoint, "save", _collective(checkpoint.save))
    patching.patch(tf.train.Checkpoint, "write", _collective(checkpoint.write))
    patching.patch(tf.train.CheckpointManager, "save", _manager_save)
