"""``python -m mpidist bench v1``: a ``tf.compat.v1`` training step with Horovod's DistributedOptimizer
against the same step in one process, in one run (under mpirun/srun; needs TensorFlow).

The step: an MLP (16 inputs, hidden layers of ``--width``, one output: 8 weight and bias tensors),
MSE on a batch of 64 fed through placeholders, ``tf.compat.v1.train.AdamOptimizer``, one
``Session.run(train_op)`` per step, as a physics-informed network trainer written in v1 graphs runs.
Three cases, in blocks interleaved by bench/timing.py:

- ``one process``: the graph without Horovod (every rank trains alone, at the same time: the
  arithmetic each rank does, with the machine as loaded as in the other case);
- ``DistributedOptimizer``: ``hvd.DistributedOptimizer`` over the same optimizer (weak scaling:
  each rank its own batch of 64, the 8 gradients averaged over the ranks);
- ``raw MPI in the graph``: the same optimizer, its 8 gradients averaged by one stateful
  ``tf.numpy_function`` that packs them by hand into one ``MPI.Allreduce`` (no mpidist): what any
  v1 program that synchronises its ranks once per step pays on this machine, so the two ratios
  tell mpidist's own cost (DistributedOptimizer / raw) from the cost of synchronising at all
  (raw / one process: on an oversubscribed machine every wait for the other rank is a wait for
  the scheduler).

Prints the medians and the ratios (median over rounds of the paired ratio; docs/horovod.md).
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


def _raw_average(comm: MPI.Intracomm) -> Callable[..., list[np.ndarray]]:
    """The body of the raw case's op: the gradients packed into one buffer, one Allreduce, divided."""
    size = comm.Get_size()

    def average(*grads: np.ndarray) -> list[np.ndarray]:
        send = np.concatenate([g.reshape(-1) for g in grads])
        recv = np.empty_like(send)
        comm.Allreduce(send, recv, MPI.SUM)
        recv /= size
        out, at = [], 0
        for g in grads:
            out.append(recv[at:at + g.size].reshape(g.shape))
            at += g.size
        return out
    return average


def step(mode: str, width: int, seed: int, comm: MPI.Intracomm | None = None) -> Callable[[], Any]:
    """A Session.run of one training step of a fresh graph (see the module docstring); ``mode``:
    "one process", "DistributedOptimizer" or "raw" (which averages over ``comm``)."""
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
        if mode == "DistributedOptimizer":
            from ..horovod import tensorflow as hvd
            hvd.init()
            optimizer = hvd.DistributedOptimizer(optimizer)
        if mode == "raw":
            assert comm is not None, "step: the raw case averages over `comm`"
            grads, variables = zip(*optimizer.compute_gradients(loss))
            averaged = tf.numpy_function(_raw_average(comm), list(grads), [g.dtype for g in grads], stateful=True)
            for a, g in zip(averaged, grads):
                a.set_shape(g.shape)
            train = optimizer.apply_gradients(zip(averaged, variables))
        else:
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
    raw_comm = comm.Dup()
    cases = {"one process": step("one process", args.width, rank),
             "raw MPI in the graph": step("raw", args.width, rank, raw_comm),
             "DistributedOptimizer": step("DistributedOptimizer", args.width, rank)}
    found = samples(comm, cases, args.seconds)
    medians = {name: statistics.median(s) for name, s in found.items()}
    ratios = paired_ratios(found, "one process")
    ratio, raw = ratios["DistributedOptimizer"], ratios["raw MPI in the graph"]
    over_raw = paired_ratios(found, "raw MPI in the graph")["DistributedOptimizer"]
    if rank == 0:
        figures = {"ranks": comm.Get_size(), "width": args.width,
                   "median_ms": {k: round(v * 1e3, 4) for k, v in medians.items()}, "ratio": round(ratio, 3),
                   "raw_ratio": round(raw, 3), "ratio_to_raw": round(over_raw, 3)}
        if args.json:
            print(json.dumps(figures), flush=True)
        else:
            print(f"v1 Session.run training step, Adam, 8 gradients (width {args.width}), {comm.Get_size()} rank(s):",
                  flush=True)
            for name, seconds in medians.items():
                print(f"  {name:22s} {seconds * 1e3:8.3f} ms", flush=True)
            print(f"  ratio (paired, median over rounds): {ratio:.2f}x one process; raw MPI in the graph "
                  f"{raw:.2f}x one process; DistributedOptimizer {over_raw:.2f}x raw", flush=True)
    raw_comm.Free()
    comm.Free()
    return 0
