"""A Horovod Keras training script on scikit-learn's digits, run on mpidist.

    mpirun -n 2 python examples/horovod_keras.py [--epochs 20]

Written as the Horovod documentation writes Keras scripts; the only change from a Horovod script
is the import line (``import horovod.tensorflow.keras as hvd``). Each rank trains on its shard of
the data with the learning rate scaled by the number of ranks, DistributedOptimizer averages the
gradients, rank 0's initial weights are broadcast, the metrics are averaged over ranks and the
learning rate is warmed up. Nothing is downloaded: the digits ship with scikit-learn.
"""
import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

import mpidist.horovod.tensorflow.keras as hvd  # noqa: E402  (was: import horovod.tensorflow.keras as hvd)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    args = parser.parse_args()

    hvd.init()

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(x, digits.target, test_size=0.25, random_state=0)
    x_train, y_train = x_train[hvd.rank()::hvd.size()], y_train[hvd.rank()::hvd.size()]  # this rank's shard

    model = keras.Sequential([
        keras.Input(shape=(64,)),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])
    scaled_lr = 1e-3 * hvd.size()
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(scaled_lr))
    model.compile(optimizer=opt, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])

    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=2, verbose=1),
    ]
    steps = len(x_train) // args.batch_size
    model.fit(x_train[:steps * args.batch_size], y_train[:steps * args.batch_size], batch_size=args.batch_size,
              epochs=args.epochs, callbacks=callbacks, shuffle=False, verbose=2 if hvd.rank() == 0 else 0)

    loss, accuracy = model.evaluate(x_test, y_test, verbose=0)
    checksum = float(sum(np.abs(w).sum() for w in model.get_weights()))
    print(f"rank {hvd.rank()}: weights checksum {checksum:.6f}", flush=True)
    if hvd.rank() == 0:
        print(f"ranks: {hvd.size()}; final test accuracy: {accuracy:.4f}; test loss: {loss:.4f}", flush=True)


if __name__ == "__main__":
    main()
