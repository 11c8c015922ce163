"""``python -m tools.tf_sweep``: allreduce time over a size sweep, raw MPI vs mpidist vs TF's MWMS.

Run under mpirun, e.g. ``mpirun -n 2 python -m tools.tf_sweep --plot sweep.png`` (from the repository root). For each
size, one float32 tensor is all-reduced:

- ``raw MPI``: ``comm.Allreduce`` on NumPy arrays (the floor: no framework at all);
- ``mpidist``: ``strategy.run`` + ``ReplicaContext.all_reduce`` inside a ``tf.function`` on the
  mpidist MultiWorkerMirroredStrategy (what a custom training loop does);
- ``TF MWMS``: the same program on TensorFlow's own MultiWorkerMirroredStrategy (RING
  implementation), its cluster built from MPI: one worker per rank, ports agreed over MPI,
  TF_CONFIG set in-process; nobody writes TF_CONFIG by hand.

Timing as every mpidist benchmark (``mpidist/bench/timing.py``): interleaved blocks, medians.
"""
from __future__ import annotations

import argparse
import json
import os
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from mpidist.bench.timing import compare, fmt_size, parse_size

from .tf_bench import tf_config_from_mpi, tf_own_mwms

CASES = ("raw MPI", "mpidist", "TF MWMS")


def _cases(tf: Any, strategies: dict[str, Any], comm: MPI.Intracomm, nbytes: int) -> dict[str, Callable[[], Any]]:
    a = np.ones(nbytes // 4, dtype=np.float32)
    out = np.empty_like(a)
    x = tf.constant(a)

    def replica_fn(t: Any) -> Any:  # an op made in the replica (TF's MWMS needs a placed tensor)
        return tf.distribute.get_replica_context().all_reduce("sum", tf.identity(t))

    def step(s: Any) -> Callable[[], Any]:
        f = tf.function(lambda v: s.run(replica_fn, args=(v,)), autograph=False)
        return lambda: f(x)

    cases: dict[str, Callable[[], Any]] = {"raw MPI": lambda: comm.Allreduce(a, out)}
    for name, s in strategies.items():
        cases[name] = step(s)
    return cases


def run(sizes: list[int], seconds: float, mwms: bool) -> list[dict[str, Any]]:
    comm = MPI.COMM_WORLD
    if mwms and comm.Get_size() > 1:  # before TensorFlow touches its context
        os.environ["TF_CONFIG"] = json.dumps(tf_config_from_mpi(comm))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    import mpidist
    from mpidist.experimental import CommunicationOptions
    strategies: dict[str, Any] = {}
    if mwms and comm.Get_size() > 1:  # first: TF's collectives must be configured at program start
        strategies["TF MWMS"] = tf_own_mwms(tf)
    engine = mpidist.Engine(comm)
    strategies = {"mpidist": mpidist.MultiWorkerMirroredStrategy.on_engine(engine, CommunicationOptions()),
                  **strategies}
    raw = comm.Dup()
    rows = []
    for nbytes in sizes:
        times = compare(comm, _cases(tf, strategies, raw, nbytes), seconds)
        rows.append({"bytes": nbytes, "ranks": comm.Get_size(), **{k: v * 1e3 for k, v in times.items()}})
    raw.Free()
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    names = [c for c in CASES if c in rows[0]]
    lines = [f"allreduce of one float32 tensor, {rows[0]['ranks']} ranks, medians (ms); "
             f"'x' = time / raw MPI time",
             f"{'size':>8}" + "".join(f"{n:>16}{'x':>7}" for n in names)]
    for r in rows:
        lines.append(f"{fmt_size(r['bytes']):>8}" + "".join(f"{r[n]:>16.4f}{r[n] / r['raw MPI']:>7.2f}" for n in names))
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, style in zip(CASES, ("o--", "s-", "^:")):
        if name in rows[0]:
            ax.plot([r["bytes"] for r in rows], [r[name] for r in rows], style, label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("bytes per allreduce")
    ax.set_ylabel("time per allreduce (ms)")
    ax.set_title(f"allreduce, {rows[0]['ranks']} ranks: raw MPI vs mpidist vs TF MWMS")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.tf_sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("--min", default="4KB", help="smallest size (default 4KB)")
    parser.add_argument("--max", default="16MB", help="largest size (default 16MB)")
    parser.add_argument("--factor", type=int, default=4, help="size step (default 4)")
    parser.add_argument("--seconds", type=float, default=1.0, help="time per size (default 1)")
    parser.add_argument("--no-mwms", action="store_true", help="skip TensorFlow's MultiWorkerMirroredStrategy")
    parser.add_argument("--plot", default="", help="write the time curves to this PNG (chief)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.factor < 2:
        parser.error(f"--factor must be >= 2, got {args.factor}")
    sizes, size = [], parse_size(args.min)
    while size <= parse_size(args.max):
        sizes.append(size)
        size *= args.factor
    rows = run(sizes, args.seconds, not args.no_mwms)
    if MPI.COMM_WORLD.Get_rank() == 0:
        print(json.dumps(rows, indent=1) if args.json else table(rows), flush=True)
        if args.plot:
            plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
