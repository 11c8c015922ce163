"""Keras callbacks that write files, under an mpidist strategy of several ranks.

The same callbacks usually run on every rank at the same points of ``fit`` (each rank would write
the same files: HDF5 then fails with "unable to lock file", directory creation races); Horovod
programs add them on rank 0 only. With these patches, which apply only when the model was built
under a multi-rank mpidist strategy, both work (``mpidist.tensorflow.checkpoint.save_once``):

- ``ModelCheckpoint`` (every mode: ``save_best_only``, ``save_weights_only``, ``.keras`` /
  ``.weights.h5``, ``save_freq`` "epoch" or an int): the chief decides and writes, atomically
  (temporary name, then rename), and tells the others; a rank whose callback saves the same path
  only updates the callback's state (``best``) and returns once the chief's file is complete.
- ``BackupAndRestore``: the chief writes the weights and the training metadata, atomically, and
  deletes the directory at the end; every rank restores from the chief's files when training
  starts, after the chief has (repaired a damaged backup from the previous one, and) loaded it, so
  every rank resumes at the same epoch with the same weights.
- ``TensorBoard``: the chief writes the event files to ``log_dir``; the other ranks write theirs
  to a private temporary directory, removed when training ends (as TensorFlow's Keras did).
- ``CSVLogger``: the chief writes the file; the other ranks write to ``os.devnull`` (Keras 3, and
  tf_keras's CSVLogger under ``TF_USE_LEGACY_KERAS=1``: ``install_keras2``).
- every callback (``CallbackList``'s ``on_*`` hooks, Keras 3 and tf_keras): the variables it
  creates are this rank's own (``mpidist.tensorflow.variables.own_variables``: no broadcast of the
  initial value, not mirrored), so a callback may create one on the chief alone, also when ``fit``
  runs inside ``strategy.scope()`` (and tf_keras's ``fit``, which always enters it).

A callback on the chief alone writes without waiting for anyone. Where every rank runs it, an error
of the chief's write is raised on every rank. Logs are global (metrics are aggregated over ranks),
so ``save_best_only`` and ``EarlyStopping`` decide the same on every rank.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any, Callable

from ..tensorflow import checkpoint, variables
from . import files, patching

# -- every callback: the variables it creates are this rank's own -----------------------------------

def _own_variables(original: Callable[..., Any]) -> Callable[..., Any]:
    def hook(self: Any, *args: Any, **kwargs: Any) -> Any:
        if patching.model_strategy(getattr(self, "model", None)) is None:
            return original(self, *args, **kwargs)
        with variables.own_variables():
            return original(self, *args, **kwargs)
    return hook


def _patch_hooks(callback_list: type) -> None:
    for name in sorted(n for n, f in vars(callback_list).items() if n.startswith("on_") and callable(f)):
        patching.patch(callback_list, name, _own_variables)


# -- ModelCheckpoint ------------------------------------------------------------------------------

def _model_checkpoint_save(original: Callable[..., Any]) -> Callable[..., Any]:
    def _save_model(self: Any, epoch: Any, batch: Any, logs: Any) -> Any:
        strategy = patching.model_strategy(self.model)
        if strategy is None or checkpoint.inside_save():
            return original(self, epoch, batch, logs)

        def same_decision(notice: Any) -> None:  # the chief wrote it; logs are global: decide the same
            verbose, self.verbose = self.verbose, 0
            try:
                patching.call_private(self, "_should_save_model", epoch, batch, logs, path)
            finally:
                self.verbose = verbose

        path = patching.call_private(self, "_get_file_path", epoch, batch, logs)
        checkpoint.save_once(strategy, "keras.callbacks.ModelCheckpoint", path,
                             lambda: original(self, epoch, batch, logs), on_followed=same_decision)
    return _save_model


# -- BackupAndRestore -----------------------------------------------------------------------------

def _backup_save(original: Callable[..., Any]) -> Callable[..., Any]:
    def _save_model(self: Any) -> Any:
        strategy = patching.model_strategy(self.model)
        if strategy is None or checkpoint.inside_save():
            return original(self)

        def write() -> None:
            real = patching.get_private(self, "_training_metadata_path")
            if files.is_remote(real):
                return original(self)
            if self.double_checkpoint and os.path.exists(real):
                previous = patching.get_private(self, "_prev_training_metadata_path")
                files.write_atomically(previous, lambda tmp: shutil.copyfile(real, tmp))

            def to(tmp: str) -> None:
                patching.set_private(self, "_training_metadata_path", tmp)  # Keras writes it here; renamed after
                try:
                    original(self)
                finally:
                    patching.set_private(self, "_training_metadata_path", real)

            files.write_atomically(real, to)

        checkpoint.save_once(strategy, "keras.callbacks.BackupAndRestore.save", self.backup_dir, write)
    return _save_model


def _backup_begin(original: Callable[..., Any]) -> Callable[..., Any]:
    def on_train_begin(self: Any, logs: Any = None) -> Any:
        strategy = patching.model_strategy(self.model)
        if strategy is None or checkpoint.inside_save():
            return original(self, logs)
        # the chief loads (and repairs a damaged backup from the previous one, Keras's fallback);
        # a rank using the same directory then loads what the chief left
        checkpoint.save_once(strategy, "keras.callbacks.BackupAndRestore.begin", self.backup_dir,
                             lambda: original(self, logs),
                             on_followed=lambda notice: patching.call_private(self, "_load_model"))
        return None
    return on_train_begin


def _backup_end(original: Callable[..., Any]) -> Callable[..., Any]:
    def on_train_end(self: Any, logs: Any = None) -> Any:
        strategy = patching.model_strategy(self.model)
        if strategy is None or checkpoint.inside_save():
            return original(self, logs)
        checkpoint.save_once(strategy, "keras.callbacks.BackupAndRestore.end", self.backup_dir,
                             lambda: original(self, logs))
        return None
    return on_train_end


# -- TensorBoard, CSVLogger -----------------------------------------------------------------------

def _tensorboard_set_model(original: Callable[..., Any]) -> Callable[..., Any]:
    def set_model(self: Any, model: Any) -> Any:
        strategy = patching.model_strategy(model)
        if strategy is not None and strategy.engine.rank != 0:
            if getattr(self, "_mpidist_private_dir", None) is None:
                self._mpidist_private_dir = tempfile.mkdtemp(prefix="mpidist-tensorboard-")
                self._mpidist_log_dir = self.log_dir
            self.log_dir = self._mpidist_private_dir
        return original(self, model)
    return set_model


def _tensorboard_end(original: Callable[..., Any]) -> Callable[..., Any]:
    def on_train_end(self: Any, logs: Any = None) -> Any:
        try:
            return original(self, logs)
        finally:
            private = getattr(self, "_mpidist_private_dir", None)
            if private is not None:
                patching.call_private(self, "_close_writers")
                shutil.rmtree(private, ignore_errors=True)
                self.log_dir, self._mpidist_private_dir = self._mpidist_log_dir, None
    return on_train_end


def _csv_begin(original: Callable[..., Any]) -> Callable[..., Any]:
    def on_train_begin(self: Any, logs: Any = None) -> Any:
        strategy = patching.model_strategy(self.model)
        if strategy is None or strategy.engine.rank == 0:
            if getattr(self, "_mpidist_filename", None) is not None:
                self.filename, self._mpidist_filename = self._mpidist_filename, None
            return original(self, logs)
        if getattr(self, "_mpidist_filename", None) is None:
            self._mpidist_filename = self.filename
        self.filename, append = os.devnull, self.append
        self.append = False  # nothing to read back from os.devnull
        try:
            return original(self, logs)
        finally:
            self.append = append
    return on_train_begin


def install() -> None:
    from keras.src.callbacks.backup_and_restore import BackupAndRestore
    from keras.src.callbacks.callback_list import CallbackList
    from keras.src.callbacks.csv_logger import CSVLogger
    from keras.src.callbacks.model_checkpoint import ModelCheckpoint
    from keras.src.callbacks.tensorboard import TensorBoard
    patching.patch(ModelCheckpoint, "_save_model", _model_checkpoint_save)
    patching.patch(BackupAndRestore, "_save_model", _backup_save)
    patching.patch(BackupAndRestore, "on_train_begin", _backup_begin)
    patching.patch(BackupAndRestore, "on_train_end", _backup_end)
    patching.patch(TensorBoard, "set_model", _tensorboard_set_model)
    patching.patch(TensorBoard, "on_train_end", _tensorboard_end)
    patching.patch(CSVLogger, "on_train_begin", _csv_begin)
    _patch_hooks(CallbackList)


def _keras2_backup_begin(original: Callable[..., Any]) -> Callable[..., Any]:
    def on_train_begin(self: Any, logs: Any = None) -> Any:
        strategy = patching.built_under(self.model)
        if patching.is_mpidist(strategy):
            supported = patching.get_private(self, "_supported_strategies")
            if not isinstance(strategy, supported):
                patching.set_private(self, "_supported_strategies", (*supported, type(strategy)))
        return original(self, logs)
    return on_train_begin


def install_keras2() -> None:
    """tf_keras's CSVLogger (same attributes as Keras 3's): the chief writes the file; variables its
    callbacks create are this rank's own (as Keras 3's, above). tf_keras's
    BackupAndRestore accepts mpidist's strategies (it refuses every strategy but TensorFlow's own);
    its files are then tf_keras's own multi-worker ones: the chief writes ``backup_dir/chief``
    through ``tf.train.CheckpointManager`` (one writer, atomically: ``tf_checkpoint``), the other
    ranks write temporary directories they remove, and every rank restores the chief's backup."""
    module = patching.tf_keras_internal("callbacks")
    patching.patch(module.CSVLogger, "on_train_begin", _csv_begin)
    patching.patch(module.BackupAndRestore, "on_train_begin", _keras2_backup_begin)
    _patch_hooks(module.CallbackList)
