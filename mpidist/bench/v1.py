"""``python -m mpidist bench v1``: a ``tf.compat.v1`` training step with Horovod's DistributedOptimizer
against the same step in one process, in one run (under mpirun/srun; needs TensorFlow).

The step: an MLP (16 inputs, hidden layers of ``--width``, one output: 8 weight and bias tensors),
MSE on a batch of 64 fed through placeholders, ``tf.compat.v1.train.AdamOptimizer``, one
``Session.run(train_op)`` per step, as a physics-informed network trainer written in v1 graphs runs.
Two cases, in blocks interleaved by bench/timing.py:

- ``one process``: the graph without Horovod (every rank trains alone, at the same time: the
  arithmetic each rank does, with the machine as loaded as in the other case);
- ``DistributedOptimizer``: ``hvd.DistributedOptimizer`` over the same optimizer (weak scaling:
  each rank its own batch of 64, the 8 gradients averaged over the ranks).

Prints the medians and the ratio (median over rounds of the paired ratio; docs/horovod.md).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from .timing import paired_ratios, samples

WIDTHS = (64, 64, 64)


def step(distributed: bool, width: int, seed: int) -> Callable[[], Any]:
    """A Session.run of one training step of a fresh graph (see the module docstring)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 16])
        y = tf.compat.v1.placeholder(tf.float32, [None, 1])
        h = x
        for i, out in enumerate((width, width, width, 1)):
            w = tf.compat.v1.get_variable(f"w{i}", [h.shape[1], out])
            b = tf.compat.v1.get_variable(f"b{i}", [out], initializer=tf.compat.v1.zeros_initializer())
            h = tf.matmul(h, w) + b
            h = tf.tanh(h) if i < 3 else h
        loss = tf.reduce_mean(tf.square(h - y))
        optimizer = tf.compat.v1.train.AdamOptimizer(1e-3)
        if distributed:
            from ..horovod import tensorflow as hvd
            hvd.init()
            optimizer = hvd.DistributedOptimizer(optimizer)
        train = optimizer.minimize(loss)
        init = tf.compat.v1.global_variables_initializer()
    session = tf.compat.v1.Session(graph=graph)
    session.run(init)
    rng = np.random.default_rng(seed)
    feed = {x: rng.random((64, 16), np.float32), y: rng.random((64, 1), np.float32)}
    return lambda: session.run(train, feed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mpidist bench v1", description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=256, help="hidden layer width (default 256)")
    parser.add_argument("--seconds", type=float, default=5.0, help="time per case, roughly (default 5)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    comm = MPI.COMM_WORLD.Dup()
    rank = comm.Get_rank()
    cases = {"one process": step(False, args.width, rank), "DistributedOptimizer": step(True, args.width, rank)}
    found = samples(comm, cases, args.seconds)
    medians = {name: statistics.median(s) for name, s in found.items()}
    ratio = paired_ratios(found, "one process")["DistributedOptimizer"]
    if rank == 0:
        figures = {"ranks": comm.Get_size(), "width": args.width,
                   "median_ms": {k: round(v * 1e3, 4) for k, v in medians.items()}, "ratio": round(ratio, 3)}
        if args.json:
            print(json.dumps(figures), flush=True)
        else:
            print(f"v1 Session.run training step, Adam, 8 gradients (width {args.width}), {comm.Get_size()} rank(s):",
                  flush=True)
            for name, seconds in medians.items():
                print(f"  {name:22s} {seconds * 1e3:8.3f} ms", flush=True)
            print(f"  ratio (paired, median over rounds): {ratio:.2f}x", flush=True)
    comm.Free()
    return 0
