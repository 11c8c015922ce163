"""A Horovod elastic TensorFlow 2 program, written from Horovod's elastic guide: a custom loop in
hvd.elastic.run, state committed every batch. Untouched by mpidist (`mpidist run` launches it).

Usage: hvd_elastic.py OUT_DIR   (writes OUT_DIR/kernel.<rank>.npy)"""
import os
import sys

import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd

hvd.init()
rng = np.random.default_rng(3)
x = rng.normal(size=(64, 4)).astype(np.float32)
y = (x @ np.array([1.0, -2.0, 3.0, 0.5], np.float32))[:, None]
x_local, y_local = np.array_split(x, hvd.size())[hvd.rank()], np.array_split(y, hvd.size())[hvd.rank()]
start = np.random.default_rng(hvd.rank()).normal(size=(4, 1)).astype(np.float32)  # differs per rank
model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(
    1, use_bias=False, kernel_initializer=tf.keras.initializers.Constant(start))])
opt = tf.optimizers.SGD(0.1)


@tf.function
def train_one_batch(data, target):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(data, training=True) - target))
    tape = hvd.DistributedGradientTape(tape)
    gradients = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(gradients, model.trainable_variables))
    return loss


state = hvd.elastic.TensorFlowKerasState(model, opt, batch=0, epoch=0)


@hvd.elastic.run
def train(state):
    for state.epoch in range(state.epoch, 3):
        for state.batch in range(state.batch, 4):
            train_one_batch(x_local, y_local)
            state.commit()
        state.batch = 0


train(state)
np.save(os.path.join(sys.argv[1], f"kernel.{hvd.rank()}.npy"), model.get_weights()[0])
print(f"rank {hvd.rank()}: trained {state.epoch + 1} epochs", flush=True)
