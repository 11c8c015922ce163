"""A Horovod custom training loop that checkpoints as Horovod's examples do: rank 0 alone saves
(``if hvd.rank() == 0: checkpoint.save(...)``); every rank restores the latest checkpoint at start.

Usage: horovod_checkpoint.py DIR EPOCHS [strategy]
With "strategy", the model and optimizer are built under mpidist's MultiWorkerMirroredStrategy
(a program mixing the two APIs), still saved by rank 0 alone. Each rank writes its final weights
to DIR/weights.<rank>.npy.
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import mpidist  # noqa: E402
import mpidist.horovod.tensorflow as hvd  # noqa: E402  (was: import horovod.tensorflow as hvd)

out_dir, epochs = sys.argv[1], int(sys.argv[2])
use_strategy = "strategy" in sys.argv[3:]
GLOBAL_BATCH, STEPS = 24, 4

hvd.init()
rng = np.random.default_rng(0)
x = rng.normal(size=(GLOBAL_BATCH * STEPS, 6)).astype(np.float32)
y = (x[:, :2].sum(axis=1) > 0).astype(np.int64)
x, y = x[hvd.rank()::hvd.size()], y[hvd.rank()::hvd.size()]  # this rank's shard
local_batch = GLOBAL_BATCH // hvd.size()
scope = mpidist.MultiWorkerMirroredStrategy().scope() if use_strategy else tf.name_scope("plain")
with scope:
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((6,)), tf.keras.layers.Dense(8, activation="relu"),
                                 tf.keras.layers.Dense(2)])
    opt = tf.keras.optimizers.SGD(0.1, momentum=0.9)
    opt.build(model.trainable_variables)
step = tf.Variable(0, dtype=tf.int64)
loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
checkpoint_dir = os.path.join(out_dir, "checkpoints")
checkpoint = tf.train.Checkpoint(model=model, optimizer=opt, step=step)
latest = tf.train.latest_checkpoint(checkpoint_dir)
if latest:
    checkpoint.restore(latest)
    print(f"rank {hvd.rank()}: restored {os.path.basename(latest)} at step {int(step.numpy())}", flush=True)


@tf.function
def training_step(features, labels):
    with tf.GradientTape() as tape:
        loss = loss_fn(labels, model(features, training=True))
    tape = hvd.DistributedGradientTape(tape)
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    return loss


hvd.broadcast_variables(model.variables, root_rank=0)
hvd.broadcast_variables(opt.variables, root_rank=0)
while int(step.numpy()) < epochs * STEPS:
    k = int(step.numpy()) % STEPS
    loss = training_step(x[k * local_batch:(k + 1) * local_batch], y[k * local_batch:(k + 1) * local_batch])
    step.assign_add(1)
    if int(step.numpy()) % STEPS == 0 and hvd.rank() == 0:
        path = checkpoint.save(os.path.join(checkpoint_dir, "ckpt"))
        print(f"rank 0: saved {os.path.basename(path)}", flush=True)

np.save(os.path.join(out_dir, f"weights.{hvd.rank()}.npy"), np.concatenate([w.ravel() for w in model.get_weights()]))
print(f"rank {hvd.rank()}: finished", flush=True)
