"""A TensorFlow 1-style tf_keras program on mpidist.horovod (the callbacks of Horovod's
keras_mnist_advanced.py): a v1 graph (``tf.compat.v1.disable_eager_execution()``), a
``keras.optimizers.legacy.SGD`` with momentum wrapped in ``hvd.DistributedOptimizer``,
``BroadcastGlobalVariablesCallback(0)``, ``MetricAverageCallback``, ``LearningRateWarmupCallback``;
every rank starts from its own weights and trains on its own rows. The final weights must equal
NumPy's: each step the gradients averaged over the ranks, after the first batch rank 0's weights
(and velocity) on every rank (Horovod's callback broadcasts then), the learning rate of Horovod's
warmup with its momentum correction. Prints "rank R: tf1 keras equals numpy"."""
import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"

import numpy as np
import tensorflow as tf

tf.compat.v1.disable_eager_execution()

import mpidist.horovod.tensorflow.keras as hvd  # noqa: E402

keras = tf.keras
hvd.init()
me, n = hvd.rank(), hvd.size()
batch, steps, epochs, lr, momentum = 8, 3, 2, 0.1, 0.5
rng = np.random.default_rng(0)
xs = rng.normal(size=(n, steps * batch, 4)).astype(np.float32)
ys = rng.normal(size=(n, steps * batch, 1)).astype(np.float32)
w0 = [np.random.default_rng(10 + r).normal(size=(4, 1)).astype(np.float32) for r in range(n)]
b0 = [np.full([1], 0.1 * r, np.float32) for r in range(n)]

model = keras.Sequential([keras.layers.Dense(1, input_shape=(4,),
                                             kernel_initializer=keras.initializers.Constant(w0[me]),
                                             bias_initializer=keras.initializers.Constant(b0[me]))])
model.compile(hvd.DistributedOptimizer(keras.optimizers.legacy.SGD(lr, momentum=momentum)), "mse")
history = model.fit(xs[me], ys[me], batch_size=batch, epochs=epochs, shuffle=False, verbose=0,
                    callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                               hvd.callbacks.MetricAverageCallback(),
                               hvd.callbacks.LearningRateWarmupCallback(initial_lr=lr, warmup_epochs=1)])
w, b = model.get_weights()

def warmup_lr(step: int) -> float:  # Horovod's warmup over epoch 0, then lr
    if step >= steps:
        return lr
    return lr / n * ((step + 1) / steps * (n - 1) / 1 + 1)


ws = [x.astype(np.float64) for x in w0]
bs = [x.astype(np.float64) for x in b0]
vw = [np.zeros_like(x) for x in ws]  # legacy SGD: v = momentum * v - lr * g; w += v
vb = [np.zeros_like(x) for x in bs]
old_lr = lr
for step in range(epochs * steps):
    rows = slice((step % steps) * batch, (step % steps + 1) * batch)
    step_lr = warmup_lr(step)
    # Horovod's momentum correction: momentum * new / old for the batch where the rate changes
    mom = momentum * step_lr / old_lr if step < steps else momentum
    old_lr = step_lr
    residuals = [xs[r][rows] @ ws[r] + bs[r] - ys[r][rows] for r in range(n)]
    gw = np.mean([2.0 / batch * xs[r][rows].T @ residuals[r] for r in range(n)], axis=0)
    gb = np.mean([2.0 / batch * residuals[r].sum(axis=0) for r in range(n)], axis=0)
    vw = [mom * v - step_lr * gw for v in vw]
    vb = [mom * v - step_lr * gb for v in vb]
    ws = [x + v for x, v in zip(ws, vw)]
    bs = [x + v for x, v in zip(bs, vb)]
    if step == 0:  # BroadcastGlobalVariablesCallback: rank 0's weights and velocity after the first batch
        ws, bs, vw, vb = [ws[0]] * n, [bs[0]] * n, [vw[0]] * n, [vb[0]] * n
assert np.isclose(history.history["lr"][-1], lr), history.history
np.testing.assert_allclose(w, ws[0], rtol=1e-4, atol=1e-5)
np.testing.assert_allclose(b, bs[0], rtol=1e-4, atol=1e-5)
print(f"rank {me}: tf1 keras equals numpy", flush=True)
