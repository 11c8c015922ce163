"""The single-process reference of the Horovod-style MNIST jobs: what one process computes on the
global batch of an N-rank job, with plain TensorFlow/Keras (no mpidist, no Horovod API).

    python hvd_mnist_reference.py OUT_DIR keras|tf2:N [keras|tf2:N ...]   (writes OUT_DIR/ref-SCRIPT-N.npz)

``keras``: hvd_keras_mnist.py's fit, the learning rate set before every batch as Horovod's
LearningRateWarmupCallback does for N ranks (from lr/N to lr over the warmup epochs, then lr);
``tf2``: hvd_tf2_mnist.py's loop. Global batch = N x the jobs' per-rank batch, lr = 0.001 x N, the
jobs' number of steps for N ranks. One process computes every reference asked of it (both scripts'
under one Keras: each run builds its model from the same seed), so it imports TensorFlow once.
"""
import os
import sys

import numpy as np
import tensorflow as tf

from synthetic_mnist import BATCH, KERAS_EPOCHS, KERAS_STEPS, TF2_STEPS, WARMUP_EPOCHS, data, model


def warmup_lr(initial_lr, size, epoch, batch, steps, warmup):
    """Horovod's LearningRateWarmupCallback: lr during batch ``batch`` of ``epoch`` (None: unchanged)."""
    if epoch >= warmup:
        return None
    fraction = epoch + float(batch) / steps + 1.0 / steps
    return initial_lr / size * (fraction * (size - 1) / warmup + 1)


def keras_fit(size):
    images, labels = data()
    dataset = tf.data.Dataset.from_tensor_slices((images, labels)).repeat().batch(BATCH * size)
    net = model(tf.keras)
    lr = 0.001 * size
    net.compile(loss=tf.losses.SparseCategoricalCrossentropy(), optimizer=tf.optimizers.Adam(lr), metrics=["accuracy"])
    steps = KERAS_STEPS // size

    class Warmup(tf.keras.callbacks.Callback):
        epoch = 0

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_begin(self, batch, logs=None):
            value = warmup_lr(lr, size, self.epoch, batch, steps, WARMUP_EPOCHS)
            if value is not None:
                self.model.optimizer.learning_rate = value

    net.fit(dataset, steps_per_epoch=steps, epochs=KERAS_EPOCHS, callbacks=[Warmup()], verbose=0)
    return net.get_weights()


def tf2_loop(size):
    images, labels = data()
    dataset = tf.data.Dataset.from_tensor_slices((images, labels)).repeat().batch(BATCH * size)
    net = model(tf.keras)
    loss = tf.losses.SparseCategoricalCrossentropy()
    opt = tf.optimizers.Adam(0.001 * size)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            value = loss(y, net(x, training=True))
        grads = tape.gradient(value, net.trainable_variables)
        opt.apply_gradients(zip(grads, net.trainable_variables))

    for x, y in dataset.take(TF2_STEPS // size):
        step(x, y)
    return net.get_weights()


if __name__ == "__main__":
    out_dir = sys.argv[1]
    print(f"tf.keras: {tf.keras.__name__}", flush=True)  # the launch test checks which Keras ran
    for which, size in (arg.split(":") for arg in sys.argv[2:]):
        weights = {"keras": keras_fit, "tf2": tf2_loop}[which](int(size))
        np.savez(os.path.join(out_dir, f"ref-{which}-{size}.npz"), *weights)
