"""``python -m tools.overlap_numpy``: a NumPy training step with gradient buckets, before and after.

Run under mpirun from the repository root, e.g. ``mpirun -n 2 python -m tools.overlap_numpy``
(rank 0 prints). The NumPy counterpart of ``tools.overlap_bench`` (TensorFlow).

One SGD step of an MLP in NumPy (``--inputs`` features, ``--depth`` ReLU layers of ``--width``, a
linear layer of 10 and softmax cross-entropy; float32; per-replica batch ``--batch``), whose
hand-written backward pass makes the gradients last layer first. Cases, interleaved in ~10 ms
blocks (medians over blocks, ``mpidist.bench.timing``):

- compute only: forward, backward and the update, no communication;
- communication only, bucketed: ``mpidist.overlap.GradientBuckets`` over ready gradients (what
  the step after sends); and in one all-reduce (what the step before sends);
- step before: the backward pass, then one ``strategy.reduce(MEAN, grads)``, then the update;
- step after: each gradient goes to ``GradientBuckets.add`` as the backward pass makes it, so a
  bucket's all-reduce runs on the progress thread while the backward pass goes on; then
  ``result()`` and the update. Buckets of ``--bucket-bytes`` (default 4 MiB; 0: automatic,
  the engine's pack size, 64 MiB).

The figure of merit is step / max(compute only, communication only): 1.0 is perfect overlap,
(compute + comm) / max(compute, comm) is none. The step after must train the same weights as the
step before: after timing, ``SAME_STEPS`` of each from the same fresh weights are compared bit for
bit ("weights after == before"; not the timed models, whose step counts differ). BLAS runs on
``--blas-threads`` threads per rank (default 1: the ranks share the cores; set before NumPy is
imported, so run this as a program).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Callable

if __name__ == "__main__":  # BLAS threads must be set before NumPy loads
    _n = next((sys.argv[i + 1] for i, a in enumerate(sys.argv[:-1]) if a == "--blas-threads"), "1")
    for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, _n)

import numpy as np
from mpi4py import MPI

from mpidist.bench.timing import compare
from tools.overlap_bench import overlap_ratios, table

SAME_STEPS = 5  # steps of each, before and after, whose weights must agree bit for bit


class MLP:
    """Weights and biases as one flat list [W1, b1, W2, b2, ...] (the variables' order)."""

    def __init__(self, args: argparse.Namespace, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        dims = [args.inputs] + [args.width] * args.depth + [10]
        self.params: list[np.ndarray] = []
        for fan_in, fan_out in zip(dims[:-1], dims[1:]):
            self.params.append((rng.normal(size=(fan_in, fan_out)) / np.sqrt(fan_in)).astype(np.float32))
            self.params.append(np.zeros(fan_out, np.float32))

    def step(self, x: np.ndarray, y: np.ndarray, global_batch: int, emit: Callable[[int, np.ndarray], None]) -> None:
        """Forward and backward; ``emit(i, grad)`` for each parameter, last layer first."""
        acts = [x]
        layers = len(self.params) // 2
        for k in range(layers):
            z = acts[-1] @ self.params[2 * k] + self.params[2 * k + 1]
            acts.append(np.maximum(z, 0, out=z) if k < layers - 1 else z)
        logits = acts[-1]
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        p[np.arange(len(y)), y] -= 1
        delta = p / np.float32(global_batch)  # d(mean loss over the global batch)/d logits
        for k in reversed(range(layers)):
            emit(2 * k + 1, delta.sum(axis=0))
            emit(2 * k, acts[k].T @ delta)
            if k:
                delta = delta @ self.params[2 * k].T
                delta *= acts[k] > 0

    def update(self, grads: list[np.ndarray], lr: float = 1e-3) -> None:
        for w, g in zip(self.params, grads):
            w -= np.float32(lr) * g


def cases(args: argparse.Namespace) -> tuple[dict[str, Callable[[], Any]], dict[str, Any]]:
    import mpidist
    from mpidist.experimental import CommunicationOptions
    from mpidist.overlap import GradientBuckets

    with mpidist.rc.override(framework="numpy"):
        strategy = mpidist.MultiWorkerMirroredStrategy(
            communication_options=CommunicationOptions(bytes_per_pack=args.bucket_bytes))
    rank, size = strategy.extended.rank, strategy.num_replicas_in_sync
    rng = np.random.default_rng(rank)
    x = rng.normal(size=(args.batch, args.inputs)).astype(np.float32)
    y = rng.integers(0, 10, size=args.batch)
    global_batch = args.batch * size
    models = {name: MLP(args) for name in ("compute", "before", "after")}
    buckets = GradientBuckets(models["after"].params, "mean", strategy=strategy, options=CommunicationOptions(
        timeout_seconds=args.bucket_timeout))
    n = len(models["compute"].params)

    def compute_only() -> None:
        grads: list[Any] = [None] * n
        models["compute"].step(x, y, global_batch, grads.__setitem__)
        models["compute"].update(grads)

    def step_before() -> None:
        grads: list[Any] = [None] * n
        models["before"].step(x, y, global_batch, grads.__setitem__)
        models["before"].update(strategy.reduce("mean", grads, axis=None))

    def step_after() -> None:
        models["after"].step(x, y, global_batch, buckets.add)
        models["after"].update(buckets.result())

    ready = [np.full(p.shape, 1.0, np.float32) for p in models["compute"].params]
    order = list(reversed(range(n)))  # backprop order: b_last, W_last, ...

    def comm_bucketed() -> None:
        for i in order:
            buckets.add(i, ready[i])
        buckets.result()

    timed = {
        "compute only (no communication)": compute_only,
        "communication only, bucketed (after)": comm_bucketed,
        "communication only, one all-reduce (before)": lambda: strategy.reduce("mean", ready, axis=None),
        "step before (one all-reduce after backprop)": step_before,
        "step after (buckets, progress thread)": step_after,
    }
    sizes = [p.nbytes for p in models["compute"].params]
    facts = {"parameters": sum(sizes) // 4, "gradient MB": round(sum(sizes) / 2 ** 20, 2),
             "bucket bytes": buckets.bucket_bytes,
             "buckets (MB, backprop order)": [round(sum(sizes[i] for i in b) / 2 ** 20, 2) for b in buckets.plan],
             "MPI thread level is MULTIPLE": MPI.Query_thread() == MPI.THREAD_MULTIPLE,
             "BLAS threads (OPENBLAS_NUM_THREADS)": os.environ.get("OPENBLAS_NUM_THREADS", "default"),
             "GIL switch interval (s)": sys.getswitchinterval()}
    facts["weights after == before, bit for bit (same steps)"] = lambda: same_weights(models, args, step_before,
                                                                                      step_after)
    return timed, facts


def same_weights(models: dict[str, MLP], args: argparse.Namespace, step_before: Callable[[], None],
                 step_after: Callable[[], None]) -> bool:
    """Whether ``SAME_STEPS`` steps before and as many after, from the same fresh weights, give the
    same weights bit for bit. Its own steps, not the timed models': mpidist.bench.timing sizes each
    case's blocks to that case's own ~10 ms, so the timed steps before and after run different
    numbers of times. Collective: every rank calls it."""
    models["before"], models["after"] = MLP(args), MLP(args)  # the steps read their model by name
    for _ in range(SAME_STEPS):
        step_before()
        step_after()
    return all(a.tobytes() == b.tobytes() for a, b in zip(models["before"].params, models["after"].params))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.overlap_numpy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=6.0, help="time per comparison (default 6)")
    parser.add_argument("--inputs", type=int, default=256, help="input features (default 256)")
    parser.add_argument("--width", type=int, default=1024, help="hidden width (default 1024)")
    parser.add_argument("--depth", type=int, default=4, help="hidden ReLU layers (default 4)")
    parser.add_argument("--batch", type=int, default=64, help="per-replica batch (default 64)")
    parser.add_argument("--bucket-bytes", type=int, default=4 << 20,
                        help="bytes_per_pack of the strategy (default 4 MiB; 0: automatic, 64 MiB buckets)")
    parser.add_argument("--bucket-timeout", type=float, default=None,
                        help="timeout_seconds of each bucket (a deadline polls MPI with naps instead of spinning)")
    parser.add_argument("--blas-threads", type=int, default=1, help="BLAS threads per rank (default 1)")
    parser.add_argument("--switch-interval", type=float, default=None,
                        help="sys.setswitchinterval in seconds (default: Python's, 0.005)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    comm = MPI.COMM_WORLD
    timed, facts = cases(args)
    times = {name: s * 1e3 for name, s in compare(comm, timed, args.seconds).items()}
    facts = {k: v() if callable(v) else v for k, v in facts.items()}
    result = {"ranks": comm.Get_size(), **facts, "ms": times, **overlap_ratios(times),
              "comm / compute": round(times["communication only, bucketed (after)"]
                                      / times["compute only (no communication)"], 3)}
    if comm.Get_rank() == 0:
        print(json.dumps(result, indent=1) if args.json else table("tools.overlap_numpy", result, 50), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
