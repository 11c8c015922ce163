"""``tf.train.Checkpoint.save`` / ``write``, ``tf.train.CheckpointManager.save`` and
``tf.saved_model.save`` under an mpidist strategy of several ranks: whichever ranks call them (every
rank, to one path or paths of its own, or the chief alone), one complete copy where each rank
expects it, never a hang.

Patched, they become ``mpidist.tensorflow.checkpoint.save`` / ``write`` / ``save_manager`` (see that
module and mpidist/collectives/notices.py): the chief writes and tells the others; a rank that
saves the chief's path returns once the chief's files are complete (its ``save_counter`` and its
manager's list of checkpoints become the chief's); a rank that names a path of its own writes it.
Every rank saving one shared directory with TensorFlow's own code races (a rank finds another's
``ckpt-1_temp`` gone); here it does not.

``tf.saved_model.save`` (also what Keras 3's ``model.export`` calls) becomes one ``save_once`` of
the export directory: the chief writes it in place (a directory: not atomically), a rank naming the
same directory returns once it is complete (every rank writing it raced: NotFoundError in
MergeV2Checkpoints), and sync-on-read variables in what is saved are aggregated first (so such a
save must be made on every rank).

A checkpoint, or an object given to ``tf.saved_model.save``, belongs to a strategy when it is saved
inside that strategy's scope, or when it or an object it tracks at any depth (a Keras model or
optimizer, a variable; for Keras 3's ``model.export`` the export archive's lists of the model's
variables) was built in that strategy's scope.
"""
from __future__ import annotations

import os
from typing import Any, Callable

from .. import _tf_private, checkpoint, owners, patching
from . import files, flavor


def strategy_of(ckpt: Any) -> Any:
    """The multi-rank mpidist strategy ``ckpt`` belongs to (see the module docstring), or None."""
    import tensorflow as tf
    if tf.distribute.has_strategy():
        return owners.multi_rank(tf.distribute.get_strategy())
    return owners.tracked_strategy(ckpt)


def _routed(helper: Callable[..., str]) -> Callable[[Any], Callable[..., Any]]:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def method(self: Any, file_prefix: Any, options: Any = None, **kwargs: Any) -> Any:
            # inside a save (the helper's own call, or a callback's) it is TensorFlow's
            strategy = None if (checkpoint.inside_save() or kwargs) else strategy_of(self)
            if strategy is None:
                return original(self, file_prefix, options=options, **kwargs)
            return helper(self, file_prefix, strategy=strategy, options=options)
        return method
    return make


def _manager_save(original: Callable[..., Any]) -> Callable[..., Any]:
    def save(self: Any, checkpoint_number: Any = None, check_interval: bool = True, options: Any = None) -> Any:
        strategy = None if checkpoint.inside_save() else strategy_of(self.checkpoint)
        if strategy is None:
            return original(self, checkpoint_number, check_interval, options)
        def followed(notice: Any) -> None:  # the chief wrote this directory: take its state from disk
            import tensorflow as tf
            state = tf.train.get_checkpoint_state(self.directory)
            if state is None:
                return
            paths = list(state.all_model_checkpoint_paths)
            stamps = list(state.all_model_checkpoint_timestamps) or [0.0] * len(paths)
            _tf_private.set_manager_state(self, notice.result or state.model_checkpoint_path, dict(zip(paths, stamps)))

        return checkpoint.save_manager(self, checkpoint_number, strategy=strategy, check_interval=check_interval,
                                       options=options, on_followed=followed)
    return save


def _saved_model_save(original: Callable[..., Any]) -> Callable[..., Any]:
    def save(obj: Any, export_dir: Any, *args: Any, **kwargs: Any) -> Any:
        # inside a save (Keras 2's model.save of a SavedModel, a callback's): the caller decided who writes
        strategy = None if checkpoint.inside_save() else strategy_of(obj)
        if strategy is None or not isinstance(export_dir, (str, os.PathLike)):
            return original(obj, export_dir, *args, **kwargs)
        return checkpoint.save_once(strategy, "tf.saved_model.save", export_dir,
                                    lambda: original(obj, export_dir, *args, **kwargs),
                                    trackable=_saved_model_reads(strategy, obj))[0]
    return save


def _saved_model_reads(strategy: Any, obj: Any) -> Any:
    """What ``tf.saved_model.save(obj)`` may read (for ``save_once``'s aggregation of sync-on-read
    variables): ``obj``'s dependencies, and where one of them is a Keras 2 model, every sync-on-read
    variable of the strategy still alive (``files.keras2_saved_variables``: Keras 2 saves a compiled
    model's metrics, which are not its dependencies; without them the chief read them alone, a
    collective no other rank joined, and every rank waited)."""
    import tensorflow as tf
    if any(flavor.is_keras2_model(node) for node in tf.train.TrackableView(obj).descendants()):
        return [obj, *files.keras2_saved_variables(strategy)]
    return obj


def install() -> None:
    import tensorflow as tf
    patching.patch(tf.train.Checkpoint, "save", _routed(checkpoint.save), checked=patching.TENSORFLOW,
                   reason='each path written once, atomically, whichever ranks save')
    patching.patch(tf.train.Checkpoint, "write", _routed(checkpoint.write), checked=patching.TENSORFLOW,
                   reason='each path written once, atomically, whichever ranks write')
    patching.patch(tf.train.CheckpointManager, "save", _manager_save, checked=patching.TENSORFLOW,
                   reason='each path written once, atomically, whichever ranks save')
    # tf.compat.v2's too, and later copies
    patching.patch_function(tf.saved_model, "save", _saved_model_save, checked=patching.TENSORFLOW,
                            reason='each path written once, atomically, whichever ranks save')
