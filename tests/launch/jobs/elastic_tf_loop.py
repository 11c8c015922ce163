"""Elastic TensorFlow custom loop: a Keras model trained with strategy.run and SGD; one rank
SIGKILLs itself. Usage: elastic_tf_loop.py STEPS RANK:STEP

Each replica's batch depends on its ORIGINAL rank and the step; every survivor prints
``RESULT {json}`` with its final weights and the state (weights, step, ranks) of every segment,
and the test replays the segments with the same model in one process.
"""
import json
import os
import signal
import sys
import time

import numpy as np
import tensorflow as tf
from mpi4py import MPI

import mpidist

steps = int(sys.argv[1])
kills = {int(r): int(s) for r, s in (a.split(":") for a in sys.argv[2:])}
me = MPI.COMM_WORLD.Get_rank()


def batch(rank: int, step: int):
    rng = np.random.default_rng(1000 * rank + step)
    return rng.normal(size=(4, 3)).astype("float32"), rng.normal(size=(4, 1)).astype("float32")


strategy = mpidist.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1, kernel_initializer="ones")])
    optimizer = tf.keras.optimizers.SGD(0.1)
    optimizer.build(model.trainable_variables)
state = mpidist.elastic.TensorFlowKerasState(strategy, model, optimizer, step=0)
segments = []


@mpidist.elastic.run
def train(state):
    ranks = strategy.gather(tf.constant([me]), axis=0).numpy().tolist()
    segments.append({"step": state.step, "weights": [w.tolist() for w in model.get_weights()], "ranks": ranks,
                     "t": time.time()})

    @tf.function
    def step_fn(x, y):
        def replica(x, y):
            with tf.GradientTape() as tape:
                # per-replica loss over the live replica count: apply_gradients sums the replicas'
                # gradients, so this is the mean over the replicas of this segment
                loss = tf.reduce_mean((model(x) - y) ** 2) / strategy.num_replicas_in_sync
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
        strategy.run(replica, args=(x, y))

    while state.step < steps:
        if kills.get(me) == state.step:
            print(f"KILLING rank={me} step={state.step} t={time.time():.6f}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        step_fn(*batch(me, state.step))
        state.step += 1
        state.commit()


train(state)
print("RESULT " + json.dumps({"rank": me, "step": state.step, "weights": [w.tolist() for w in model.get_weights()],
                              "segments": segments, "size": strategy.num_replicas_in_sync}), flush=True)
mpidist.elastic.shutdown()  # skips MPI_Finalize after a recovery (see its docstring)
