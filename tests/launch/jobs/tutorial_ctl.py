"""TensorFlow's tutorial "Custom training loop with Keras and MultiWorkerMirroredStrategy", as its
program does it, under mpirun with mpidist (a small synthetic data set instead of MNIST).

Usage: tutorial_ctl.py DIR EPOCHS SAVE
  SAVE tutorial: every worker saves through its CheckpointManager, non-chief workers into a
                 temporary directory of their own which they then delete (tf.io.gfile.rmtree)
  SAVE chief:    only the chief saves (``if strategy.extended.should_checkpoint``)
  SAVE chief-sync-on-read: the chief alone saves a checkpoint that holds a sync-on-read variable
The checkpoint (model, epoch, step_in_epoch) lives in DIR/ckpt; a run restores the latest one and
trains until EPOCHS. Each rank writes its final weights to DIR/weights.<rank>.npy.
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import mpidist  # noqa: E402

out_dir, num_epochs, save_mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
num_steps_per_epoch = 4
global_batch_size = 24  # divisible by 1, 2 and 3 workers: every run sees the same global batches


def mnist_dataset():
    rng = np.random.default_rng(0)
    x_train = rng.random((480, 12, 12)).astype(np.float32)
    y_train = rng.integers(0, 10, 480).astype(np.int64)
    return tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(480, seed=1)


def dataset_fn(global_batch_size, input_context):
    batch_size = input_context.get_per_replica_batch_size(global_batch_size)
    dataset = mnist_dataset()
    dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return dataset.batch(batch_size)


def build_cnn_model():
    tf.keras.utils.set_random_seed(0)
    return tf.keras.Sequential([
        tf.keras.Input(shape=(12, 12)),
        tf.keras.layers.Reshape(target_shape=(12, 12, 1)),
        tf.keras.layers.Conv2D(4, 3, activation="relu"),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(16, activation="relu"),
        tf.keras.layers.Dense(10),
    ])


def _is_chief(task_type, task_id, cluster_spec):
    return (task_type is None or task_type == "chief"
            or (task_type == "worker" and task_id == 0 and "chief" not in cluster_spec.as_dict()))


def _get_temp_dir(dirpath, task_id):
    temp_dir = os.path.join(dirpath, "workertemp_" + str(task_id))
    tf.io.gfile.makedirs(temp_dir)
    return temp_dir


def write_filepath(filepath, task_type, task_id, cluster_spec):
    dirpath = os.path.dirname(filepath)
    base = os.path.basename(filepath)
    if not _is_chief(task_type, task_id, cluster_spec):
        dirpath = _get_temp_dir(dirpath, task_id)
    return os.path.join(dirpath, base)


checkpoint_dir = os.path.join(out_dir, "ckpt")
strategy = mpidist.MultiWorkerMirroredStrategy()
with strategy.scope():
    multi_worker_model = build_cnn_model()
    multi_worker_dataset = strategy.distribute_datasets_from_function(
        lambda input_context: dataset_fn(global_batch_size, input_context))
    optimizer = tf.keras.optimizers.RMSprop(learning_rate=0.001)
    train_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name="train_accuracy")
    seen = tf.Variable(0.0, synchronization=tf.VariableSynchronization.ON_READ,
                       aggregation=tf.VariableAggregation.SUM)  # examples seen, over every rank


@tf.function
def train_step(iterator):
    def step_fn(inputs):
        x, y = inputs
        with tf.GradientTape() as tape:
            predictions = multi_worker_model(x, training=True)
            per_batch_loss = tf.keras.losses.SparseCategoricalCrossentropy(
                from_logits=True, reduction="none")(y, predictions)
            loss = tf.nn.compute_average_loss(per_batch_loss, global_batch_size=global_batch_size)
        grads = tape.gradient(loss, multi_worker_model.trainable_variables)
        optimizer.apply_gradients(zip(grads, multi_worker_model.trainable_variables))
        train_accuracy.update_state(y, predictions)
        seen.assign_add(tf.cast(tf.shape(x)[0], tf.float32))
        return loss

    per_replica_losses = strategy.run(step_fn, args=(next(iterator),))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_losses, axis=None)


epoch = tf.Variable(initial_value=tf.constant(0, dtype=tf.dtypes.int64), name="epoch")
step_in_epoch = tf.Variable(initial_value=tf.constant(0, dtype=tf.dtypes.int64), name="step_in_epoch")
task_type, task_id, cluster_spec = (strategy.cluster_resolver.task_type, strategy.cluster_resolver.task_id,
                                    strategy.cluster_resolver.cluster_spec())
tracked = dict(model=multi_worker_model, epoch=epoch, step_in_epoch=step_in_epoch)
if save_mode == "chief-sync-on-read":
    tracked["seen"] = seen
checkpoint = tf.train.Checkpoint(**tracked)
if save_mode == "tutorial":
    write_checkpoint_dir = write_filepath(checkpoint_dir, task_type, task_id, cluster_spec)
else:
    write_checkpoint_dir = checkpoint_dir
checkpoint_manager = tf.train.CheckpointManager(checkpoint, directory=write_checkpoint_dir, max_to_keep=1)

latest_checkpoint = tf.train.latest_checkpoint(checkpoint_dir)
if latest_checkpoint:
    checkpoint.restore(latest_checkpoint)
    print(f"rank {task_id}: restored {os.path.basename(latest_checkpoint)} at epoch {int(epoch.numpy())}",
          flush=True)

while epoch.numpy() < num_epochs:
    iterator = iter(multi_worker_dataset)
    total_loss = 0.0
    num_batches = 0
    while step_in_epoch.numpy() < num_steps_per_epoch:
        total_loss += train_step(iterator)
        num_batches += 1
        step_in_epoch.assign_add(1)
    # the tutorial saves before advancing `epoch`, so a resumed run redoes no step of that epoch
    train_loss = total_loss / max(num_batches, 1)
    print("rank %d: Epoch: %d, accuracy: %f, train_loss: %f." % (task_id, epoch.numpy(), train_accuracy.result(),
                                                                 train_loss), flush=True)
    train_accuracy.reset_state()
    if save_mode == "tutorial":
        checkpoint_manager.save()
        if not _is_chief(task_type, task_id, cluster_spec):
            tf.io.gfile.rmtree(write_checkpoint_dir)
    elif strategy.extended.should_checkpoint:
        checkpoint_manager.save()
    epoch.assign_add(1)
    step_in_epoch.assign(0)

np.save(os.path.join(out_dir, f"weights.{task_id}.npy"),
        np.concatenate([w.ravel() for w in multi_worker_model.get_weights()]))
print(f"rank {task_id}: finished", flush=True)
