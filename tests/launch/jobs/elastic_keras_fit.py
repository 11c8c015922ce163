"""Elastic Keras ``fit``: CommitStateCallback + UpdateEpochStateCallback; one rank SIGKILLs itself
mid-epoch. Usage: elastic_keras_fit.py EPOCHS RANK:EPOCH:BATCH [--batches-per-commit=K]

The data is one global tf.data pipeline (batches of 12 rows, 4 batches an epoch) that the strategy
splits over the replicas. CommitStateCallback commits every K batches (default 1), and every
epoch's end commits. After the death the survivors resume with ``initial_epoch=state.epoch``,
first finishing the interrupted epoch from batch ``state.batch`` (``dataset.skip``). Each survivor
prints ``RESULT {json}``: final weights, epoch/batch of the state at each (re)start of ``train``,
and the position of its last commit when it began its last batch before the death.
"""
import json
import os
import signal
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from mpi4py import MPI  # noqa: E402

import mpidist  # noqa: E402
from mpidist import elastic  # noqa: E402

epochs = int(sys.argv[1])
kills = {int(r): (int(e), int(b)) for r, e, b in (a.split(":") for a in sys.argv[2:] if ":" in a)}
per_commit = int(next((a.split("=")[1] for a in sys.argv[2:] if a.startswith("--batches-per-commit=")), 1))
me = MPI.COMM_WORLD.Get_rank()
BATCHES, GLOBAL_BATCH = 4, 12

rng = np.random.default_rng(0)
x = rng.normal(size=(BATCHES * GLOBAL_BATCH, 3)).astype("float32")
y = (x @ np.array([[1.0], [-2.0], [0.5]], "float32") + 0.3).astype("float32")

strategy = mpidist.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1, kernel_initializer="zeros")])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.05), loss="mse")
    model.optimizer.build(model.trainable_variables)
state = elastic.TensorFlowKerasState(strategy, model, epoch=0, batch=0)
starts, commits = [], []


def data():
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)


class Kill(tf.keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        committed = state.committed()["attributes"]
        commits.append([committed["epoch"], committed["batch"]])
        if kills.get(me) == (self.epoch, state.batch):
            print(f"KILLING rank={me} epoch={self.epoch} batch={state.batch}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


@elastic.run
def train(state):
    starts.append({"epoch": state.epoch, "batch": state.batch, "size": strategy.num_replicas_in_sync,
                   "last_seen": commits[-1] if commits else None})
    callbacks = [elastic.CommitStateCallback(state, per_commit), elastic.UpdateEpochStateCallback(state), Kill()]
    if state.batch:
        model.fit(data().skip(state.batch), initial_epoch=state.epoch, epochs=state.epoch + 1,
                  callbacks=callbacks, verbose=0)
    model.fit(data(), initial_epoch=state.epoch, epochs=epochs, callbacks=callbacks, verbose=0)


train(state)
print("RESULT " + json.dumps({"rank": me, "epoch": state.epoch, "batch": state.batch, "starts": starts,
                              "weights": [w.tolist() for w in model.get_weights()],
                              "size": strategy.num_replicas_in_sync}), flush=True)
elastic.shutdown()  # skips MPI_Finalize after a recovery (see its docstring)
