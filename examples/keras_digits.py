"""The main job: Keras ``model.fit``, data-parallel over MPI ranks, on scikit-learn's digits.

    mpirun -n 2 python examples/keras_digits.py [--epochs 30] [--plot digits_training.png]

Unchanged Keras code apart from ``tf.distribute`` -> ``mpidist``: the model is built and compiled
inside ``strategy.scope()``, ``fit`` gets NumPy arrays and the global batch size, Keras's own
optimizer aggregates gradients across ranks, and ``shuffle=True`` gives the ranks disjoint parts
of one permutation per epoch (the ranks agree on its seed). Only the chief shows the progress bar, prints the
final accuracy and writes a PNG of the training curves. The data set ships with scikit-learn:
nothing is downloaded.
"""
from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

import mpidist  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--global-batch", type=int, default=128)
    parser.add_argument("--plot", default="digits_training.png", help="PNG written by the chief ('' to skip)")
    args = parser.parse_args()

    strategy = mpidist.MultiWorkerMirroredStrategy()
    chief = strategy.extended.should_checkpoint
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(x, digits.target, test_size=0.25, random_state=0)

    tf.keras.utils.set_random_seed(0)  # rank 0's initial weights are broadcast anyway
    with strategy.scope():
        model = tf.keras.Sequential([
            tf.keras.Input(shape=(64,)),
            tf.keras.layers.Dense(128, activation="relu"),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(10),
        ])
        model.compile(optimizer=tf.keras.optimizers.Adam(1e-3),
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
    history = model.fit(x_train, y_train, batch_size=args.global_batch, epochs=args.epochs,
                        shuffle=True, verbose=2 if chief else 0)
    loss, accuracy = model.evaluate(x_test, y_test, batch_size=args.global_batch, verbose=0)
    if chief:
        print(f"ranks: {strategy.num_replicas_in_sync}; final test accuracy: {accuracy:.4f}; "
              f"test loss: {loss:.4f}", flush=True)
        if args.plot:
            plot(history.history, args.plot)
            print(f"training curve written to {args.plot}", flush=True)


def plot(history: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
    left.plot(history["loss"], label="training loss")
    left.set_xlabel("epoch")
    left.set_ylabel("loss")
    right.plot(history["accuracy"], label="training accuracy", color="tab:green")
    right.set_xlabel("epoch")
    right.set_ylabel("accuracy")
    fig.suptitle("Keras model.fit on scikit-learn digits, data-parallel with mpidist")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
