"""TensorFlow's "Custom training with tf.distribute.Strategy" tutorial, on MPI ranks.

    mpirun -n 2 python examples/custom_training_loop.py [--epochs 10]

The tutorial's loop unchanged apart from ``tf.distribute`` -> ``mpidist`` and the data (scikit-learn's
digits instead of a download): ``strategy.run`` a ``tf.function`` step, losses scaled by the global
batch with ``tf.nn.compute_average_loss``, per-replica losses summed with ``strategy.reduce``.
"""
from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from mpi4py import MPI  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

import mpidist  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--global-batch", type=int, default=64)
    args = parser.parse_args()

    strategy = mpidist.MultiWorkerMirroredStrategy()
    GLOBAL_BATCH_SIZE = args.global_batch
    digits = load_digits()
    images, labels = (digits.data / 16.0).astype(np.float32), digits.target.astype(np.int64)
    train_dataset = tf.data.Dataset.from_tensor_slices((images, labels)).batch(GLOBAL_BATCH_SIZE)
    train_dist_dataset = strategy.experimental_distribute_dataset(train_dataset)

    tf.keras.utils.set_random_seed(0)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input(shape=(64,)),
                                     tf.keras.layers.Dense(64, activation="relu"),
                                     tf.keras.layers.Dense(10)])
        loss_object = tf.keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction=tf.keras.losses.Reduction.NONE)

        def compute_loss(labels, predictions):
            per_example_loss = loss_object(labels, predictions)
            return tf.nn.compute_average_loss(per_example_loss, global_batch_size=GLOBAL_BATCH_SIZE)

        optimizer = tf.keras.optimizers.SGD(learning_rate=0.1)
        train_accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name="train_accuracy")

    def train_step(inputs):
        images, labels = inputs
        with tf.GradientTape() as tape:
            predictions = model(images, training=True)
            loss = compute_loss(labels, predictions)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        train_accuracy.update_state(labels, predictions)
        return loss

    @tf.function
    def distributed_train_step(dataset_inputs):
        per_replica_losses = strategy.run(train_step, args=(dataset_inputs,))
        return strategy.reduce(mpidist.ReduceOp.SUM, per_replica_losses, axis=None)

    for epoch in range(args.epochs):
        total_loss, num_batches = 0.0, 0
        for x in train_dist_dataset:
            total_loss += float(distributed_train_step(x))
            num_batches += 1
        accuracy = float(train_accuracy.result())  # a global metric: every rank reads it (a collective)
        if strategy.extended.should_checkpoint:
            print(f"Epoch {epoch + 1}, Loss: {total_loss / num_batches:.4f}, "
                  f"Accuracy: {accuracy * 100:.2f}", flush=True)
        train_accuracy.reset_state()
    checksum = float(sum(float(tf.reduce_sum(v)) for v in model.trainable_variables))
    print(f"rank {MPI.COMM_WORLD.Get_rank()}: weights checksum {checksum:.10f}", flush=True)


if __name__ == "__main__":
    main()
