"""A Horovod Keras program in Keras 2 code, as Horovod's own examples are (`compile(...,
experimental_run_tf_function=False)`): it trains under `mpidist run --keras 2`, and under Keras 3
fails on that line (Keras itself rejects it), where `mpidist run` adds a one-line hint.

Usage: keras2_code.py"""
import numpy as np
import tensorflow as tf
import horovod.tensorflow.keras as hvd

hvd.init()
x = np.random.default_rng(0).normal(size=(32, 4)).astype(np.float32)
y = x.sum(axis=1, keepdims=True)
model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
opt = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01))
model.compile(loss="mse", optimizer=opt, experimental_run_tf_function=False)
model.fit(x, y, batch_size=8, epochs=1, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
print(f"rank {hvd.rank()}: trained with {tf.keras.__name__.split('.')[0]}", flush=True)
