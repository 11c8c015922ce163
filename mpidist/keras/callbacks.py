"""Keras callbacks that write files, under an mpidist strategy of several ranks.

Every rank runs the same callbacks at the same points of ``fit``, so each rank would write the
same files (HDF5 then fails with "unable to lock file"; directory creation races). With these
patches, which apply only when the model was built under a multi-rank mpidist strategy:

- ``ModelCheckpoint`` (every mode: ``save_best_only``, ``save_weights_only``, ``.keras`` /
  ``.weights.h5``, ``save_freq`` "epoch" or an int): the chief decides and writes, atomically
  (temporary name, then rename); the other ranks only update the callback's state (``best``).
- ``BackupAndRestore``: the chief writes the weights and the training metadata, atomically, and
  deletes the directory at the end; every rank restores from the chief's files when training
  starts (they read the same files, so every rank resumes at the same epoch with the same weights).
- ``TensorBoard``: the chief writes the event files to ``log_dir``; the other ranks write theirs
  to a private temporary directory, removed when training ends (as TensorFlow's Keras did).
- ``CSVLogger``: the chief writes the file; the other ranks write to ``os.devnull``.

Every write is followed by one small collective (``checkpoint.on_chief``): when the callback
returns, the chief's file is complete on every rank, and an error on any rank (the chief's write
failing, say) is raised on every rank instead of leaving the others waiting. Logs are global
(metrics are aggregated over ranks), so ``save_best_only`` and ``EarlyStopping`` decide the same
on every rank.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any, Callable

from ..tensorflow import checkpoint
from . import files, patching


def _collective(strategy: Any, on_chief: Callable[[], Any], where: str,
                on_others: Callable[[], Any] | None = None, aggregate: bool = False) -> None:
    checkpoint.on_chief(strategy, on_chief, where, on_others=on_others, aggregate=aggregate)


# -- ModelCheckpoint ------------------------------------------------------------------------------

def _model_checkpoint_save(original: Callable[..., Any]) -> Callable[..., Any]:
    def _save_model(self: Any, epoch: Any, batch: Any, logs: Any) -> Any:
        strategy = patching.model_strategy(self.model)
        if strategy is None:
            return original(self, epoch, batch, logs)

        def chief() -> None:
            with files.atomic_saves():
                original(self, epoch, batch, logs)

        def others() -> None:  # the same decision (logs are global), without writing or printing
            verbose, self.verbose = self.verbose, 0
            try:
                patching.call_private(self, "_should_save_model", epoch, batch, logs,
                                      patching.call_private(self, "_get_file_path", epoch, batch, logs))
            finally:
                self.verbose = verbose

        _collective(strategy, chief, "ModelCheckpoint", others)  # Keras saves no metric (sync-on-read) state
    return _save_model


# -- BackupAndRestore -----------------------------------------------------------------------------

def _backup_save(original: Callable[..., Any]) -> Callable[..., Any]:
    def _save_model(self: Any) -> Any:
        strategy = patching.model_strategy(self.model)
        if strategy is None:
            return original(self)

        def chief() -> None:
            real = patching.get_private(self, "_training_metadata_path")
            if files.is_remote(real):
                with files.atomic_saves():
                    return original(self)
            if self.double_checkpoint and os.path.exists(real):
                shutil.copyfile(real, patching.get_private(self, "_prev_training_metadata_path"))
            tmp = files.temporary_name(real)
            patching.set_private(self, "_training_metadata_path", tmp)  # Keras writes it here; renamed below
            try:
                with files.atomic_saves():
                    original(self)
                os.replace(tmp, real)
            finally:
                patching.set_private(self, "_training_metadata_path", real)
                if os.path.exists(tmp):
                    os.remove(tmp)

        _collective(strategy, chief, "BackupAndRestore")
    return _save_model


def _backup_begin(original: Callable[..., Any]) -> Callable[..., Any]:
    def on_train_begin(self: Any, logs: Any = None) -> Any:
        strategy = patching.model_strategy(self.model)
        if strategy is None:
            return original(self, logs)
        try:  # every rank reads the chief's files
            patching.call_private(self, "_load_model")
            error = None
        except OSError as e:  # a damaged file: Keras falls back to the previous one (a write)
            error = e
        if not checkpoint.any_rank(strategy, error is not None):
            return None
        # Keras's fallback (copy the previous checkpoint over the damaged one) on the chief only,
        # then every rank loads what it left
        _collective(strategy, lambda: original(self, logs), "BackupAndRestore.on_train_begin")
        patching.call_private(self, "_load_model")
        return None
    return on_train_begin


def _backup_end(original: Callable[..., Any]) -> Callable[..., Any]:
    def on_train_end(self: Any, logs: Any = None) -> Any:
        strategy = patching.model_strategy(self.model)
        if strategy is None:
            return original(self, logs)
        _collective(strategy, lambda: original(self, logs), "BackupAndRestore.on_train_end")
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

