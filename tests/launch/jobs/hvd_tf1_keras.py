"""A TensorFlow 1-style tf_keras program on mpidist.horovod: a v1 graph
(``tf.compat.v1.disable_eager_execution()``), a ``keras.optimizers.legacy.SGD`` wrapped in
``hvd.DistributedOptimizer``, ``BroadcastGlobalVariablesCallback(0)``; every rank starts from its
own weights and trains on its own rows. The final weights must equal NumPy's: each step the
gradients averaged over the ranks, and after the first batch rank 0's weights on every rank
(Horovod's callback broadcasts then). Prints "rank R: tf1 keras equals numpy"."""
import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import numpy as np
import tensorflow as tf

tf.compat.v1.disable_eager_execution()

import mpidist.horovod.tensorflow.keras as hvd  # noqa: E402

keras = tf.keras
hvd.init()
me, n = hvd.rank(), hvd.size()
batch, steps, epochs, lr = 8, 3, 2, 0.1
rng = np.random.default_rng(0)
xs = rng.normal(size=(n, steps * batch, 4)).astype(np.float32)
ys = rng.normal(size=(n, steps * batch, 1)).astype(np.float32)
w0 = [np.random.default_rng(10 + r).normal(size=(4, 1)).astype(np.float32) for r in range(n)]
b0 = [np.full([1], 0.1 * r, np.float32) for r in range(n)]

model = keras.Sequential([keras.layers.Dense(1, input_shape=(4,),
                                             kernel_initializer=keras.initializers.Constant(w0[me]),
                                             bias_initializer=keras.initializers.Constant(b0[me]))])
model.compile(hvd.DistributedOptimizer(keras.optimizers.legacy.SGD(lr)), "mse")
model.fit(xs[me], ys[me], batch_size=batch, epochs=epochs, shuffle=False, verbose=0,
          callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
w, b = model.get_weights()

ws = [x.astype(np.float64) for x in w0]
bs = [x.astype(np.float64) for x in b0]
for step in range(epochs * steps):
    rows = slice((step % steps) * batch, (step % steps + 1) * batch)
    residuals = [xs[r][rows] @ ws[r] + bs[r] - ys[r][rows] for r in range(n)]
    gw = np.mean([2.0 / batch * xs[r][rows].T @ residuals[r] for r in range(n)], axis=0)
    gb = np.mean([2.0 / batch * residuals[r].sum(axis=0) for r in range(n)], axis=0)
    ws = [x - lr * gw for x in ws]
    bs = [x - lr * gb for x in bs]
    if step == 0:  # BroadcastGlobalVariablesCallback: rank 0's weights after the first batch
        ws, bs = [ws[0]] * n, [bs[0]] * n
np.testing.assert_allclose(w, ws[0], rtol=1e-4, atol=1e-5)
np.testing.assert_allclose(b, bs[0], rtol=1e-4, atol=1e-5)
print(f"rank {me}: tf1 keras equals numpy", flush=True)
