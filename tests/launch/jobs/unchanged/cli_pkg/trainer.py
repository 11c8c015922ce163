"""A custom training loop written from the TF 2.1-2.4 tf.distribute guides: the experimental
MultiWorkerMirroredStrategy with `communication=`, `experimental_distribute_datasets_from_function`,
`experimental_run_v2`, `strategy.reduce`, a Keras optimizer applying the gradients in the replica
function. Untouched by mpidist; run as a console command (`mpirun -n 2 mpidist run cli-train ...`).

Usage: cli-train OUT_DIR GLOBAL_BATCH   (writes OUT_DIR/w.<task index>.npy and one line per task)"""
import argparse
import json
import os

import numpy as np
import tensorflow as tf


def main():
    parser = argparse.ArgumentParser(prog="cli-train")
    parser.add_argument("out_dir")
    parser.add_argument("global_batch", type=int)
    args = parser.parse_args()
    strategy = tf.distribute.experimental.MultiWorkerMirroredStrategy(
        communication=tf.distribute.experimental.CollectiveCommunication.RING)
    rng = np.random.default_rng(5)
    x = rng.normal(size=(96, 3)).astype(np.float32)
    y = (x @ np.array([0.5, -1.0, 2.0], np.float32)).astype(np.float32)

    def dataset_fn(input_context):
        batch = input_context.get_per_replica_batch_size(args.global_batch)
        d = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.global_batch)
        return d.unbatch().shard(input_context.num_input_pipelines, input_context.input_pipeline_id).batch(batch)

    dataset = strategy.experimental_distribute_datasets_from_function(dataset_fn)
    with strategy.scope():
        w = tf.Variable(tf.zeros([3]))
        optimizer = tf.keras.optimizers.SGD(learning_rate=0.1)

    def step(features, targets):
        with tf.GradientTape() as tape:
            per_example = tf.square(tf.linalg.matvec(features, w) - targets)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=args.global_batch)
        grads = tape.gradient(loss, [w])
        optimizer.apply_gradients(zip(grads, [w]))
        return loss

    @tf.function
    def train_step(inputs):
        per_replica = strategy.experimental_run_v2(step, args=inputs)
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    losses = [float(train_step(batch)) for batch in dataset]
    task = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    np.save(os.path.join(args.out_dir, f"w.{task}.npy"), w.numpy())
    keras = "tf_keras" if "tf_keras" in type(optimizer).__module__ else "keras"
    print(f"task {task}: {len(losses)} steps, optimizer from {keras}, last loss {losses[-1]:.6f}", flush=True)
    return 0
