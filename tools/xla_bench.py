"""``python -m tools.xla_bench``: Keras training-step time with and without XLA (``jit_compile``),
under an mpidist strategy and, at one rank, in plain Keras without a strategy.

Run under mpirun from the repository root, e.g.
``mpirun -n 2 --oversubscribe --bind-to none --mca mpi_yield_when_idle 1 python -m tools.xla_bench``;
rank 0 prints a markdown table. Models (float32, the same global batch at every rank count):

- ``mlp``: 784-512-512-10 (0.67 M parameters), SGD, global batch 256;
- ``cnn``: 28x28x1 -> conv 3x3 x16, max-pool, conv 3x3 x32, max-pool, dense 64, dense 10 (~60 k
  parameters), SGD, global batch 64.

Cases: the mpidist MultiWorkerMirroredStrategy with ``jit_compile=False`` and ``True`` (the step
compiled in two parts around the gradients' all-reduce, mpidist/tensorflow/xla.py); at one rank
also plain Keras (no strategy) with ``jit_compile=False`` and ``True``. A step's time is the
wall time from ``on_train_batch_begin`` to ``on_train_batch_end`` inside ``model.fit`` (rank 0's;
the ranks meet in the all-reduce every step). Each round fits one epoch of ``--steps`` steps with
every case in turn (the order shuffled per round, the same on every rank), so machine noise hits
all cases alike; the first step of each epoch is dropped. Figures are medians over all steps
kept, with the ratio to the first case of the model's section.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
from mpi4py import MPI

MODELS = {"mlp": 256, "cnn": 64}  # model -> global batch


def build(keras: Any, kind: str) -> Any:
    if kind == "mlp":
        return keras.Sequential([keras.Input((784,)), keras.layers.Dense(512, activation="relu"),
                                 keras.layers.Dense(512, activation="relu"), keras.layers.Dense(10)])
    return keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Conv2D(16, 3, activation="relu"),
                             keras.layers.MaxPooling2D(), keras.layers.Conv2D(32, 3, activation="relu"),
                             keras.layers.MaxPooling2D(), keras.layers.Flatten(),
                             keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)])


def data(kind: str, rows: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    shape = (rows, 784) if kind == "mlp" else (rows, 28, 28, 1)
    return rng.normal(size=shape).astype(np.float32), rng.integers(0, 10, size=rows)


def step_times(keras: Any, model: Any, x: np.ndarray, y: np.ndarray, batch: int) -> list[float]:
    """Seconds of each step of one epoch of ``model.fit`` (the first step dropped)."""
    times: list[float] = []

    class Timer(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            self.start = time.perf_counter()

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            times.append(time.perf_counter() - self.start)

    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0, callbacks=[Timer()])
    return times[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="mlp,cnn")
    parser.add_argument("--steps", type=int, default=20, help="steps per epoch (one epoch per case per round)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="also write the medians (ms) to this file (rank 0)")
    args = parser.parse_args()

    import keras
    import tensorflow as tf

    import mpidist
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    strategy = mpidist.MultiWorkerMirroredStrategy()
    cases = [("mpidist", False), ("mpidist", True)] + ([("plain Keras", False), ("plain Keras", True)]
                                                         if size == 1 else [])
    results: dict[str, dict[str, float]] = {}
    for kind in args.models.split(","):
        batch = MODELS[kind]
        x, y = data(kind, batch * args.steps)
        keras.utils.set_random_seed(0)
        weights = build(keras, kind).get_weights()
        models = {}
        for where, jit in cases:
            scope = strategy.scope() if where == "mpidist" else tf.distribute.get_strategy().scope()
            with scope:
                model = build(keras, kind)
                model.compile(optimizer=keras.optimizers.SGD(0.01), jit_compile=jit,
                              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            model.set_weights(weights)
            model.fit(x[:3 * batch], y[:3 * batch], batch_size=batch, epochs=1, verbose=0)  # trace, compile
            models[f"{where}, jit_compile={jit}"] = model
        times: dict[str, list[float]] = {name: [] for name in models}
        for r in range(args.rounds):
            for name in random.Random(r).sample(list(models), len(models)):  # the same order on every rank
                times[name] += step_times(keras, models[name], x, y, batch)
        results[kind] = {name: 1e3 * statistics.median(t) for name, t in times.items()}
    if rank == 0:
        print("| model (global batch) | case | ranks | ms/step (median) | x first case |")
        print("|---|---|---|---|---|")
        for kind, rows in results.items():
            first = next(iter(rows.values()))
            for name, ms in rows.items():
                print(f"| {kind} ({MODELS[kind]}) | {name} | {size} | {ms:.2f} | {ms / first:.2f} |")
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump({"ranks": size, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
