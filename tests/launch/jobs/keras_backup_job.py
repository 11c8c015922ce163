"""Keras BackupAndRestore job.

Usage: keras_backup_job.py BACKUP_DIR OUT.npz run
       keras_backup_job.py BACKUP_DIR OUT.npz fail-after-epoch K [STRAIGHT_BACKUP_DIR]

Trains 5 epochs of Keras ``fit`` under mpidist's MultiWorkerMirroredStrategy with
``BackupAndRestore(BACKUP_DIR)``, unchanged user code. ``fail-after-epoch K``: a callback raises at
the end of epoch K (0-based) on every rank, so the job fails. ``run``: trains to the end (resuming
from BACKUP_DIR if it holds a backup). Each rank prints the epochs it ran; the chief saves the
final weights to OUT.npz. With STRAIGHT_BACKUP_DIR, the failing job first trains the same model
(same seed, a fresh model and optimizer) to the end with ``BackupAndRestore(STRAIGHT_BACKUP_DIR)``,
never interrupted: each rank prints ``straight epochs run``, the chief saves those weights to
OUT.npz (the reference a resumed job must equal, without a launch of its own), then the failing fit.
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import mpidist  # noqa: E402

backup, out, mode = sys.argv[1], sys.argv[2], sys.argv[3]
fail_after = int(sys.argv[4]) if mode == "fail-after-epoch" else None
straight_backup = sys.argv[5] if mode == "fail-after-epoch" and len(sys.argv) > 5 else None

strategy = mpidist.MultiWorkerMirroredStrategy()
rank = strategy.engine.rank
rng = np.random.default_rng(0)
x = rng.normal(size=(96, 8)).astype(np.float32)
y = (x[:, :3].sum(axis=1) > 0).astype(np.int64)


def build():
    tf.keras.utils.set_random_seed(0)  # the same initial weights in every launch and every build
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(16, activation="relu"),
                                     tf.keras.layers.Dense(2)])
        model.compile(optimizer=tf.keras.optimizers.Adam(0.01),
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


class Record(tf.keras.callbacks.Callback):
    def __init__(self, epochs_run, fail_after=None):
        super().__init__()
        self.epochs_run, self.fail_after = epochs_run, fail_after

    def on_epoch_begin(self, epoch, logs=None):
        self.epochs_run.append(epoch)

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.fail_after:
            raise RuntimeError(f"injected failure after epoch {epoch}")


if straight_backup is not None:
    model, straight_epochs = build(), []
    model.fit(x, y, batch_size=16, epochs=5, shuffle=False, verbose=0,
              callbacks=[tf.keras.callbacks.BackupAndRestore(straight_backup), Record(straight_epochs)])
    print(f"rank {rank}: straight epochs run {straight_epochs}", flush=True)
    if rank == 0:
        np.savez(out, *model.get_weights())

model, epochs_run = build(), []
try:
    model.fit(x, y, batch_size=16, epochs=5, shuffle=False, verbose=0,
              callbacks=[tf.keras.callbacks.BackupAndRestore(backup), Record(epochs_run, fail_after)])
finally:
    print(f"rank {rank}: epochs run {epochs_run}", flush=True)
if rank == 0:
    np.savez(out, *model.get_weights())
print(f"rank {rank}: done", flush=True)
