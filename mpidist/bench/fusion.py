"""``python -m mpidist bench fusion``: one step's gradients of a model, fused, against raw MPI.

The gradient set of ``--model`` (bench/shapes.py: ``resnet50``, Keras's 214 tensors, 102 MB;
``bert_base``, 199 tensors, 438 MB, ``--scale K`` divides its widths; ``small``, 1000 × 4 KB) in
float32, through these cases in one run (bench/timing.py: interleaved blocks, medians):

- ``raw fused``: the hand-packed best case: ``numpy.concatenate`` of every tensor into a
  preallocated buffer, one ``Allreduce`` into another, the results cut out as views (pack + call +
  unpack), on a clone of the same communicator; ``raw fused, Iallreduce``: the same with
  ``Iallreduce`` + wait (what the engine posts from ``rc.iallreduce_threshold``, 32 MiB: faster for
  large buffers with Open MPI 5 here);
- ``raw per tensor``: one ``Allreduce`` per tensor into preallocated buffers (no fusion at all);
- ``reduce``: ``strategy.reduce("sum", grads, axis=None)`` on a NumPy-mode MultiWorkerMirroredStrategy
  (automatic packing: ⌈bytes / 64 MiB⌉ packs);
- ``replica``: ``strategy.run`` of a replica context's ``all_reduce("sum", grads)``;
- with ``--before PATH``: ``reduce`` of the mpidist found at ``PATH/mpidist`` (e.g. the main branch
  before fusion: tensors of 64 KiB and more alone, 4 MiB packs), in the same processes.

Every case's result is checked against the sum before timing. Ratios: per round, time / ``raw
fused, Iallreduce``'s time, median over rounds (1.00 = as fast). On a shared machine absolute times move with
the load: read the ratios.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from . import shapes as model_shapes
from .paths import load_before
from .timing import paired_ratios, samples

BASE = "raw fused, Iallreduce"  # the ratios' base: the faster raw call for large buffers here


def _grads(shapes: list[tuple[int, ...]], rank: int) -> list[np.ndarray]:
    return [np.full(s, (rank + 1) % 7, dtype=np.float32) for s in shapes]


def _raw_cases(comm: MPI.Intracomm, grads: list[np.ndarray]) -> dict[str, Callable[[], Any]]:
    total = sum([g.size for g in grads])
    send, recv = np.empty(total, np.float32), np.empty(total, np.float32)
    bounds = np.cumsum([0] + [g.size for g in grads]).tolist()
    cuts = [(slice(a, b), g.shape) for a, b, g in zip(bounds, bounds[1:], grads)]
    outs = [np.empty_like(g) for g in grads]

    def fused() -> list[np.ndarray]:
        np.concatenate(grads, axis=None, out=send)
        comm.Allreduce(send, recv)
        return [recv[s].reshape(shape) for s, shape in cuts]

    def fused_posted() -> list[np.ndarray]:
        np.concatenate(grads, axis=None, out=send)
        comm.Iallreduce(send, recv).Wait()
        return [recv[s].reshape(shape) for s, shape in cuts]

    def per_tensor() -> list[np.ndarray]:
        for g, o in zip(grads, outs):
            comm.Allreduce(g, o)
        return outs

    return {"raw fused": fused, "raw fused, Iallreduce": fused_posted, "raw per tensor": per_tensor}


def _mpidist_cases(package: Any, grads: list[np.ndarray], suffix: str = "") -> tuple[dict[str, Callable[[], Any]], Any]:
    with package.rc.override(framework="numpy"):  # an older package (--before) has mpidist.numpy instead
        strategy = getattr(package, "numpy", package).MultiWorkerMirroredStrategy()
    context = package.get_replica_context
    return {"reduce" + suffix: lambda: strategy.reduce("sum", grads, axis=None),
            "replica" + suffix: lambda: strategy.run(lambda: context().all_reduce("sum", grads))}, strategy


def run(model: str, scale: int, seconds: float, before: Any = None) -> dict:
    import mpidist
    comm = MPI.COMM_WORLD
    size = comm.Get_size()
    shapes = model_shapes.bert_base(scale) if model == "bert_base" else model_shapes.MODELS[model]()
    grads = _grads(shapes, comm.Get_rank())
    cases, strategy = _mpidist_cases(mpidist, grads)
    strategies = [strategy]
    timed = _raw_cases(strategy.extended.engine.topology.comm, grads)
    timed.update(cases)
    if before is not None:
        old, old_strategy = _mpidist_cases(before, grads, " before")
        timed["reduce before"] = old["reduce before"]
        strategies.append(old_strategy)
    want = float(sum((r + 1) % 7 for r in range(size)))
    for name, fn in timed.items():  # every case right before any is timed
        if not all(np.all(np.asarray(out) == want) for out in fn()):
            raise RuntimeError(f"python -m mpidist bench fusion: {name} gave a wrong result")
    times = samples(comm, timed, seconds)
    for s in strategies:
        s.close()
    nbytes = sum(4 * math.prod(s) for s in shapes)
    return {"model": model if model != "bert_base" or scale == 1 else f"bert_base/{scale}", "tensors": len(shapes),
            "bytes": nbytes, "ranks": size, "rounds": len(times["raw fused"]),
            "median": {name: statistics.median(t) for name, t in times.items()},
            "ratio": paired_ratios(times, BASE)}


def table(row: dict) -> str:
    lines = [f"mpidist bench fusion: {row['model']}, {row['tensors']} float32 tensors, {row['bytes'] / 1e6:.1f} MB, "
             f"{row['ranks']} ranks, {row['rounds']} rounds: median ms per step (median over rounds of time / "
             f"{BASE}'s time in the same round)"]
    for name, t in row["median"].items():
        lines.append(f"  {name:<22}{t * 1e3:10.3f} ms  {row['ratio'][name]:6.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mpidist bench fusion", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet50", choices=sorted(model_shapes.MODELS),
                        help="gradient set (default resnet50)")
    parser.add_argument("--scale", type=int, default=1, help="bert_base: divide its widths by this (default 1)")
    parser.add_argument("--seconds", type=float, default=6.0, help="time spent in all (default 6)")
    parser.add_argument("--before", default=None, metavar="PATH",
                        help="also time strategy.reduce on the mpidist of another checkout (PATH/mpidist)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    if args.scale < 1:
        parser.error(f"`--scale` must be >= 1, got {args.scale}")
    row = run(args.model, args.scale, args.seconds, load_before(args.before) if args.before else None)
    if MPI.COMM_WORLD.Get_rank() == 0:
        print(json.dumps(row, indent=1) if args.json else table(row), flush=True)
    return 0
