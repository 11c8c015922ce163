"""TensorFlow's tutorial "Multi-worker training with Keras", as its program does it, under mpirun
with mpidist (a small synthetic data set instead of MNIST), and Horovod's chief-only callbacks.

Usage: tutorial_keras.py DIR
Parts (each rank writes its weights after each part to DIR/<part>.<rank>.npy):
  fit          model.fit under the strategy
  save         model.save: the chief to DIR/keras-model.keras, the others to a temporary directory of
               their own that they delete; every rank loads the chief's model and trains on
  checkpoint   tf.train.Checkpoint + CheckpointManager saved on every rank (non-chief workers to a
               temporary directory they delete), restored from the chief's latest, training goes on
  backup       BackupAndRestore(DIR/backup): training interrupted at epoch 2 on every rank, resumed
  backup_steps BackupAndRestore(DIR/backup, save_freq=2): backups every 2 batches
  chief_only   a ModelCheckpoint callback on rank 0 only (as Horovod programs add it); Keras 3 only:
               Keras 2 (TF_USE_LEGACY_KERAS=1) saves the metrics' sync-on-read variables, whose
               saved value is their sum over ranks, so there a save on one rank is an error
The same program runs under Keras 2 (tf_keras), the Keras the tutorial was written for.
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import mpidist  # noqa: E402

out_dir = sys.argv[1]
GLOBAL_BATCH_SIZE = 24  # divisible by 1, 2 and 3 workers: every run sees the same global batches
STEPS = 4


def mnist_dataset(batch_size):
    rng = np.random.default_rng(0)
    x_train = rng.random((480, 12, 12)).astype(np.float32)
    y_train = rng.integers(0, 10, 480).astype(np.int64)
    dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(480, seed=1).repeat().batch(batch_size)
    options = tf.data.Options()  # what the tutorial's auto-sharding does with in-memory data, said explicitly
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return dataset.with_options(options)


def build_and_compile_cnn_model():
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([
        tf.keras.layers.InputLayer(input_shape=(12, 12)),
        tf.keras.layers.Reshape(target_shape=(12, 12, 1)),
        tf.keras.layers.Conv2D(4, 3, activation="relu"),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(16, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=tf.keras.optimizers.SGD(learning_rate=0.05), metrics=["accuracy"])
    return model


def _is_chief(task_type, task_id):
    return task_type is None or task_type == "chief" or (task_type == "worker" and task_id == 0)


def _get_temp_dir(dirpath, task_id):
    temp_dir = os.path.join(dirpath, "workertemp_" + str(task_id))
    tf.io.gfile.makedirs(temp_dir)
    return temp_dir


def write_filepath(filepath, task_type, task_id):
    dirpath = os.path.dirname(filepath)
    base = os.path.basename(filepath)
    if not _is_chief(task_type, task_id):
        dirpath = _get_temp_dir(dirpath, task_id)
    return os.path.join(dirpath, base)


strategy = mpidist.MultiWorkerMirroredStrategy()  # was: tf.distribute.MultiWorkerMirroredStrategy()
task_type, task_id = strategy.cluster_resolver.task_type, strategy.cluster_resolver.task_id


def record(part, model):
    np.save(os.path.join(out_dir, f"{part}.{task_id}.npy"), np.concatenate([w.ravel() for w in model.get_weights()]))
    print(f"rank {task_id}: {part} done", flush=True)


with strategy.scope():
    multi_worker_dataset = mnist_dataset(GLOBAL_BATCH_SIZE)
    multi_worker_model = build_and_compile_cnn_model()
multi_worker_model.fit(multi_worker_dataset, epochs=2, steps_per_epoch=STEPS, verbose=0)
record("fit", multi_worker_model)

# -- model.save, as the tutorial: the chief to model_path, the others to a temporary directory
model_path = os.path.join(out_dir, "keras-model.keras")
write_model_path = write_filepath(model_path, task_type, task_id)
multi_worker_model.save(write_model_path)
if not _is_chief(task_type, task_id):
    tf.io.gfile.rmtree(os.path.dirname(write_model_path))
with strategy.scope():
    loaded_model = tf.keras.models.load_model(model_path)
loaded_model.fit(multi_worker_dataset, epochs=1, steps_per_epoch=STEPS, verbose=0)
record("save", loaded_model)

# -- checkpoint, as the tutorial
checkpoint_dir = os.path.join(out_dir, "ckpt")
checkpoint = tf.train.Checkpoint(model=multi_worker_model)
write_checkpoint_dir = write_filepath(checkpoint_dir, task_type, task_id)
checkpoint_manager = tf.train.CheckpointManager(checkpoint, directory=write_checkpoint_dir, max_to_keep=1)
checkpoint_manager.save()
if not _is_chief(task_type, task_id):
    tf.io.gfile.rmtree(write_checkpoint_dir)
multi_worker_model.fit(multi_worker_dataset, epochs=1, steps_per_epoch=STEPS, verbose=0)  # moves away from it
latest_checkpoint = tf.train.latest_checkpoint(checkpoint_dir)
checkpoint.restore(latest_checkpoint)
multi_worker_model.fit(multi_worker_dataset, epochs=2, steps_per_epoch=STEPS, verbose=0)
record("checkpoint", multi_worker_model)


# -- BackupAndRestore: interrupted at the start of epoch 2 (on every rank), then resumed
class InterruptingCallback(tf.keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        if epoch == 2:
            raise RuntimeError("Interrupting!")


backup_dir = os.path.join(out_dir, "backup")
callbacks = [tf.keras.callbacks.BackupAndRestore(backup_dir=backup_dir)]
with strategy.scope():
    multi_worker_model = build_and_compile_cnn_model()
try:
    multi_worker_model.fit(multi_worker_dataset, epochs=4, steps_per_epoch=STEPS, verbose=0,
                           callbacks=callbacks + [InterruptingCallback()])
except RuntimeError as error:
    print(f"rank {task_id}: interrupted: {error}; backup files {sorted(os.listdir(backup_dir))}", flush=True)
history = multi_worker_model.fit(multi_worker_dataset, epochs=4, steps_per_epoch=STEPS, verbose=0,
                                 callbacks=callbacks)
print(f"rank {task_id}: resumed epochs {history.epoch}; backup left: {os.path.exists(backup_dir)}", flush=True)
record("backup", multi_worker_model)

callbacks = [tf.keras.callbacks.BackupAndRestore(backup_dir=backup_dir, save_freq=2)]
with strategy.scope():
    multi_worker_model = build_and_compile_cnn_model()
multi_worker_model.fit(multi_worker_dataset, epochs=2, steps_per_epoch=STEPS, verbose=0, callbacks=callbacks)
record("backup_steps", multi_worker_model)

if os.environ.get("TF_USE_LEGACY_KERAS") == "1":  # Keras 2: no chief_only part (see the docstring)
    print(f"rank {task_id}: files {sorted(os.listdir(out_dir))}", flush=True)
    print(f"rank {task_id}: finished", flush=True)
    sys.exit(0)

# -- Horovod's way: a checkpoint callback on rank 0 only
chief_path = os.path.join(out_dir, "chief-only.weights.h5")
callbacks = [tf.keras.callbacks.ModelCheckpoint(chief_path, save_weights_only=True)] if task_id == 0 else []
multi_worker_model.fit(multi_worker_dataset, epochs=1, steps_per_epoch=STEPS, verbose=0, callbacks=callbacks)
strategy.reduce("SUM", tf.ones([1]), axis=None)  # a collective: rank 0 has finished writing before it
with strategy.scope():
    reread = build_and_compile_cnn_model()
reread.load_weights(chief_path)
record("chief_only", reread)
print(f"rank {task_id}: files {sorted(os.listdir(out_dir))}", flush=True)
print(f"rank {task_id}: finished", flush=True)
