"""TensorFlow's fault-tolerance guide, custom training loop: a PreemptionCheckpointHandler
(tf.distribute.experimental) over mpidist's MultiWorkerMirroredStrategy, launched with mpirun.

Usage: tf_preemption.py DIR EPOCHS [--scope] [--exit-code=N]
  EPOCHS     a number, or +K: no end before a preemption, K more epochs after a restore (one
             command line for a job and its requeued run)
  default    the loop of the handler's documentation: ``handler.run(train_step, x, y)`` for the
             epochs and steps left after ``handler.total_run_calls``; TensorFlow's default exit_fn
  --scope    ``with handler.watch_preemption_scope():`` train_step, then
             ``handler.save_checkpoint_if_preempted()``; the trained step is a variable of the
             checkpoint (as TensorFlow's example of that method does)
  --exit-code=N  TerminationConfig(exit_fn=...) printing EXIT_FN and calling sys.exit(N)
Each step trains Dense(1) on rows of one global batch of 12 that depends on the step alone (each
rank its slice), so a run resumed at any step makes the updates of an uninterrupted one. Every
rank prints ``READY rank pid`` after its second step, ``START rank=.. runs=..`` after the handler
restored, ``EXIT rank=.. runs=.. save_counter=.. trained_step=..`` when it leaves (preempted or not) and ``RESULT
{json}`` when training ends.
"""
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import mpidist  # noqa: E402

checkpoint_dir, epochs_arg = sys.argv[1], sys.argv[2]
scope_mode = "--scope" in sys.argv[3:]
exit_code = next((int(a.split("=")[1]) for a in sys.argv[3:] if a.startswith("--exit-code=")), None)
STEPS_PER_EPOCH = 5
GLOBAL_BATCH = 12  # divisible by 1, 2, 3 and 4 ranks
KERNEL, BIAS = [[0.1], [-0.2], [0.3]], [0.05]


def global_batch(step):  # the test computes the same rows
    rng = np.random.default_rng(step)
    x = rng.normal(size=(GLOBAL_BATCH, 3)).astype(np.float32)
    y = (x @ np.array([[1.0], [2.0], [-1.0]], np.float32) + 0.5 + rng.normal(size=(GLOBAL_BATCH, 1))).astype(np.float32)
    return x, y


strategy = mpidist.MultiWorkerMirroredStrategy()
rank, size = strategy.cluster_resolver.task_id, strategy.num_replicas_in_sync
per_replica = GLOBAL_BATCH // size

config = None
if exit_code is not None:
    def exit_fn():
        print(f"EXIT_FN rank={rank}", flush=True)
        sys.exit(exit_code)
    config = tf.distribute.experimental.TerminationConfig(exit_fn=exit_fn)

trained_step = tf.Variable(0, dtype=tf.int64, name="trained_step")  # --scope: the example's own count
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)])
    model.set_weights([np.array(KERNEL, np.float32), np.array(BIAS, np.float32)])
    optimizer = tf.keras.optimizers.SGD(learning_rate=0.05)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, trained_step=trained_step)
    handler = tf.distribute.experimental.PreemptionCheckpointHandler(strategy.cluster_resolver, checkpoint,
                                                                     checkpoint_dir, config)


@tf.function
def train_step(x, y):
    def step_fn(x, y):
        with tf.GradientTape() as tape:
            per_example = tf.reduce_sum(tf.square(model(x, training=True) - y), axis=1)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(step_fn, args=(x, y)), axis=None)


def my_rows(step):
    x, y = global_batch(step)
    return x[rank * per_replica:(rank + 1) * per_replica], y[rank * per_replica:(rank + 1) * per_replica]


start = {"runs": handler.total_run_calls, "trained_step": int(trained_step.numpy())}
print(f"START rank={rank} runs={start['runs']} trained_step={start['trained_step']}", flush=True)
if not epochs_arg.startswith("+"):
    num_epochs = int(epochs_arg)
elif start["runs"] or start["trained_step"]:  # restored
    num_epochs = max(start["runs"], start["trained_step"]) // STEPS_PER_EPOCH + int(epochs_arg[1:])
else:
    num_epochs = 10 ** 6
steps = num_epochs * STEPS_PER_EPOCH
done = 0
try:
    if not scope_mode:  # the loop of the handler's documentation
        for epoch in range(handler.total_run_calls // STEPS_PER_EPOCH, num_epochs):
            for step in range(handler.total_run_calls % STEPS_PER_EPOCH, STEPS_PER_EPOCH):
                handler.run(train_step, *my_rows(epoch * STEPS_PER_EPOCH + step))
                done += 1
                if done == 2:
                    print(f"READY {rank} {os.getpid()}", flush=True)
    else:
        with handler.watch_preemption_scope():
            while trained_step.numpy() < steps:
                train_step(*my_rows(int(trained_step.numpy())))
                trained_step.assign_add(1)
                done += 1
                if done == 2:
                    print(f"READY {rank} {os.getpid()}", flush=True)
                handler.save_checkpoint_if_preempted()
finally:
    print(f"EXIT rank={rank} runs={handler.total_run_calls} save_counter={int(checkpoint.save_counter.numpy())} "
          f"trained_step={int(trained_step.numpy())}", flush=True)
print("RESULT " + json.dumps({"rank": rank, "start": start, "runs": handler.total_run_calls, "size": size,
                              "trained_step": int(trained_step.numpy()),
                              "weights": [w.tolist() for w in model.get_weights()]}), flush=True)
