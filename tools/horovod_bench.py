"""``python -m tools.horovod_bench``: Horovod's API on mpidist against mpidist's own path and raw MPI.

Run under mpirun, e.g. ``mpirun -n 2 python -m tools.horovod_bench``. Rank 0 prints.

(a) allreduce of one 4 KB float32 tensor inside a ``tf.function``: ``hvd.allreduce``; mpidist's
    strategy (``strategy.run`` + ``ReplicaContext.all_reduce``); raw mpi4py ``Allreduce`` of the
    same bytes (join support costs nothing here: a joined rank would stand by in the agreement
    exchange the allreduce makes anyway, see mpidist/horovod/tensorflow/joins.py). Horovod
    0.28.1 (C++, on TensorFlow it still builds against) took 1.08 ms for this on the project's
    reference machines; that figure is printed beside, not measured.
(b) one Keras ``train_on_batch`` step of an MLP 784-512-512-10 (per-rank batch 64, SGD): with
    ``hvd.DistributedOptimizer``; with mpidist's MultiWorkerMirroredStrategy (global batch
    64 x ranks); and the same model without distribution (no communication).

Blocks of all cases interleaved, medians over blocks (see mpidist/bench/timing.py).
"""
from __future__ import annotations

import argparse
import json
import os
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from mpidist.bench.timing import compare
from tools import tables

HOROVOD_0_28_1_ALLREDUCE_4KB_MS = 1.08


def _allreduce_cases(tf: Any, hvd: Any, strategy: Any, comm: MPI.Intracomm) -> dict[str, Callable[[], Any]]:
    a = np.ones(1024, dtype=np.float32)
    out = np.empty_like(a)
    x = tf.constant(a)

    @tf.function
    def horovod() -> Any:
        return hvd.allreduce(x, op=hvd.Sum)

    @tf.function
    def mpidist_strategy() -> Any:
        return strategy.run(lambda: tf.distribute.get_replica_context().all_reduce("sum", x))

    return {"hvd.allreduce in tf.function (mpidist.horovod)": lambda: horovod().numpy(),
            "mpidist strategy all_reduce in tf.function": lambda: strategy.experimental_local_results(
                mpidist_strategy())[0].numpy(),
            "raw mpi4py Allreduce (NumPy)": lambda: comm.Allreduce(a, out)}


def _mlp(keras: Any) -> Any:
    return keras.Sequential([keras.Input((784,)), keras.layers.Dense(512, activation="relu"),
                             keras.layers.Dense(512, activation="relu"), keras.layers.Dense(10)])


def _step_cases(tf: Any, keras: Any, hvd: Any, strategy: Any, size: int, batch: int) -> dict[str, Callable[[], Any]]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 784)).astype(np.float32)
    y = rng.integers(0, 10, batch)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    horovod = _mlp(keras)
    horovod.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.SGD(0.01)), loss=loss)
    local = _mlp(keras)
    local.compile(optimizer=keras.optimizers.SGD(0.01), loss=loss)
    with strategy.scope():
        mirrored = _mlp(keras)
        mirrored.compile(optimizer=keras.optimizers.SGD(0.01), loss=loss)
    xs, ys = np.concatenate([x] * size), np.concatenate([y] * size)
    return {"Keras step, hvd.DistributedOptimizer": lambda: horovod.train_on_batch(x, y),
            "Keras step, mpidist MultiWorkerMirroredStrategy": lambda: mirrored.train_on_batch(xs, ys),
            "Keras step, one process, no communication": lambda: local.train_on_batch(x, y)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.horovod_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="time per comparison (default 3)")
    parser.add_argument("--batch", type=int, default=64, help="per-rank batch of the Keras step (default 64)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    import mpidist
    import mpidist.horovod.tensorflow.keras as hvd

    comm = MPI.COMM_WORLD
    hvd.init()
    strategy = mpidist.MultiWorkerMirroredStrategy()
    results: dict[str, Any] = {"ranks": comm.Get_size()}
    results["allreduce 4 KB (ms)"] = {name: s * 1e3 for name, s in
                                      compare(comm, _allreduce_cases(tf, hvd, strategy, comm), args.seconds).items()}
    results["allreduce 4 KB (ms)"]["Horovod 0.28.1 (reference figure, not measured here)"] = \
        HOROVOD_0_28_1_ALLREDUCE_4KB_MS
    results[f"Keras step, batch {args.batch} per rank (ms)"] = {
        name: s * 1e3 for name, s in
        compare(comm, _step_cases(tf, keras, hvd, strategy, comm.Get_size(), args.batch), args.seconds).items()}
    if comm.Get_rank() == 0:
        print(json.dumps(results, indent=1) if args.json else _table(results), flush=True)
    return 0


def _table(results: dict) -> str:
    return tables.table(f"mpidist.horovod bench, {results['ranks']} ranks; medians of interleaved blocks", results, 62)


if __name__ == "__main__":
    raise SystemExit(main())
