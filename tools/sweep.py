"""``python -m tools.sweep``: an nccl-tests-style table, mpidist and raw mpi4py in one run.

For allreduce, allgather, broadcast and reduce_scatter over a size sweep: size, count, dtype, time,
algbw and busbw of each, and the ratio raw time / mpidist time. As in nccl-tests, algbw = bytes /
time (bytes: the buffer for allreduce and broadcast, the gathered output for allgather, the input
for reduce_scatter) and busbw = algbw · factor, with factor 2(p-1)/p for allreduce, (p-1)/p for
allgather and reduce_scatter, 1 for broadcast: the bandwidth each link sees, comparable across p.
``--plot FILE.png`` draws busbw against size for both.
"""
from __future__ import annotations

import argparse
import json
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from mpidist import Engine
from mpidist.bench.timing import compare, fmt_size, parse_size

COLLECTIVES = ("allreduce", "allgather", "broadcast", "reduce_scatter")


def _factor(name: str, p: int) -> float:
    return {"allreduce": 2 * (p - 1) / p, "allgather": (p - 1) / p, "reduce_scatter": (p - 1) / p,
            "broadcast": 1.0}[name] if p > 1 else 1.0


def _cases(name: str, engine: Engine, nbytes: int, dtype: np.dtype) -> tuple[dict[str, Callable[[], Any]], int, int]:
    """(raw and mpidist callables, element count, bytes that algbw counts)."""
    comm, p = engine.topology.comm, engine.size
    count = max(p, nbytes // dtype.itemsize // p * p)  # divisible by p for the block collectives
    x = np.ones(count, dtype=dtype)
    if name == "allreduce":
        out = np.empty_like(x)
        return {"raw": lambda: comm.Allreduce(x, out), "mpidist": lambda: engine.allreduce(x)}, count, x.nbytes
    if name == "broadcast":
        return {"raw": lambda: comm.Bcast(x, 0), "mpidist": lambda: engine.broadcast(x, root=0)}, count, x.nbytes
    part = x[: count // p]
    if name == "allgather":
        out = np.empty(count // p * p, dtype=dtype)
        return {"raw": lambda: comm.Allgather(part, out), "mpidist": lambda: engine.allgather(part)}, count, out.nbytes
    out = np.empty(count // p, dtype=dtype)
    return {"raw": lambda: comm.Reduce_scatter_block(x, out),
            "mpidist": lambda: engine.reduce_scatter(x)}, count, x.nbytes


def run(collectives: list[str], sizes: list[int], dtype: np.dtype, seconds: float,
        comm: MPI.Intracomm | None = None) -> list[dict[str, Any]]:
    engine = Engine(comm)
    rows = []
    for name in collectives:
        for nbytes in sizes:
            cases, count, counted = _cases(name, engine, nbytes, dtype)
            times = compare(engine.topology.comm, cases, seconds)
            row = {"collective": name, "bytes": counted, "count": count, "dtype": dtype.name, "ranks": engine.size}
            for who, t in times.items():
                algbw = counted / t / 1e9
                row[who] = {"time_us": t * 1e6, "algbw": algbw, "busbw": algbw * _factor(name, engine.size)}
            row["ratio"] = times["raw"] / times["mpidist"]
            rows.append(row)
    engine.close()
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = [f"tools.sweep: {rows[0]['ranks']} ranks, {rows[0]['dtype']}, medians; GB/s; "
             f"ratio = raw time / mpidist time" if rows else "no rows",
             f"{'collective':<15}{'size':>10}{'count':>12}   {'raw us':>10}{'algbw':>8}{'busbw':>8}"
             f"   {'mpidist us':>10}{'algbw':>8}{'busbw':>8}{'ratio':>8}"]
    for r in rows:
        raw, ours = r["raw"], r["mpidist"]
        lines.append(f"{r['collective']:<15}{fmt_size(r['bytes']):>10}{r['count']:>12}   "
                     f"{raw['time_us']:>10.1f}{raw['algbw']:>8.2f}{raw['busbw']:>8.2f}   "
                     f"{ours['time_us']:>10.1f}{ours['algbw']:>8.2f}{ours['busbw']:>8.2f}{r['ratio']:>8.2f}")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted({r["collective"] for r in rows}, key=COLLECTIVES.index)
    fig, axes = plt.subplots(1, len(names), figsize=(4 * len(names), 3.4), squeeze=False)
    for ax, name in zip(axes[0], names):
        mine = [r for r in rows if r["collective"] == name]
        for who, style in (("raw", "o--"), ("mpidist", "s-")):
            ax.plot([r["bytes"] for r in mine], [r[who]["busbw"] for r in mine], style, label=who)
        ax.set_xscale("log", base=2)
        ax.set_title(name)
        ax.set_xlabel("bytes")
        ax.set_ylabel("busbw (GB/s)")
        ax.legend()
    fig.suptitle(f"mpidist vs raw mpi4py, {rows[0]['ranks']} ranks")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.sweep", description=__doc__.split("\n\n")[0])
    parser.add_argument("--collectives", default=",".join(COLLECTIVES))
    parser.add_argument("--min", default="4KB", help="smallest size (default 4KB)")
    parser.add_argument("--max", default="64MB", help="largest size (default 64MB)")
    parser.add_argument("--factor", type=int, default=4, help="size step (default 4)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--seconds", type=float, default=1.0, help="time per point (default 1)")
    parser.add_argument("--plot", default="", help="write busbw curves to this PNG (chief)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    names = [c.strip() for c in args.collectives.split(",") if c.strip()]
    unknown = [n for n in names if n not in COLLECTIVES]
    if unknown or args.factor < 2:
        parser.error(f"--collectives must be among {', '.join(COLLECTIVES)} (got {unknown}); --factor >= 2")
    sizes, size = [], parse_size(args.min)
    while size <= parse_size(args.max):
        sizes.append(size)
        size *= args.factor
    rows = run(names, sizes, np.dtype(args.dtype), args.seconds)
    if MPI.COMM_WORLD.Get_rank() == 0:
        print(json.dumps(rows, indent=1) if args.json else table(rows), flush=True)
        if args.plot:
            plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
