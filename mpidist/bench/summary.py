"""``python -m mpidist bench [summary]``: the engine against raw mpi4py on the headline cases.

Cases: one float32 array of each ``--sizes`` (raw: ``comm.Allreduce``), and a nest of
``--nest`` arrays of 4 KB (raw: one ``Allreduce`` per array, and the hand-fused best case:
concatenate, one ``Allreduce``, split), taken by the engine, ``strategy.reduce`` and a replica
context's ``all_reduce`` (a NumPy-mode MultiWorkerMirroredStrategy), each also as a ratio to the
hand-fused raw call (median over rounds of the two times in the same round). "agreement off" shows
the cost of the agreement check.
"""
from __future__ import annotations

import argparse
import json
import statistics

import numpy as np
from mpi4py import MPI

from .._config import rc
from ..collectives import Engine
from ..frameworks import MultiWorkerMirroredStrategy
from ..strategies import get_replica_context
from .timing import compare, fmt_size, paired_ratios, parse_size, samples


def run(sizes: list[int], nest_count: int, seconds: float, comm: MPI.Intracomm | None = None) -> list[dict]:
    comm = MPI.COMM_WORLD if comm is None else comm
    engine = Engine(comm)
    raw = engine.topology.comm  # same clone type of communicator for both: fair
    rows = []
    for nbytes in sizes:
        x = np.ones(nbytes // 4, dtype=np.float32)
        out = np.empty_like(x)

        def raw_call(x=x, out=out):
            return raw.Allreduce(x, out)

        def engine_on(x=x):
            return engine.allreduce(x)

        def engine_off(x=x):
            return engine.allreduce(x)
        engine_off.settings = {"check_agreement": False}  # type: ignore[attr-defined]  # timing.py reads it
        times = compare(comm, {"raw": raw_call, "mpidist": engine_on, "mpidist, agreement off": engine_off}, seconds)
        rows.append({"case": f"allreduce {fmt_size(nbytes)}", "bytes": nbytes, **times})
    if nest_count:
        leaves = [np.full(1024, i, dtype=np.float32) for i in range(nest_count)]
        outs = [np.empty_like(a) for a in leaves]

        def raw_separate():
            for a, o in zip(leaves, outs):
                raw.Allreduce(a, o)

        def raw_fused():
            buf = np.concatenate(leaves)
            res = np.empty_like(buf)
            raw.Allreduce(buf, res)
            return np.split(res, nest_count)
        with rc.override(framework="numpy"):
            strategy = MultiWorkerMirroredStrategy(comm=comm)

        def in_replica() -> object:
            context = get_replica_context()
            assert context is not None, "strategy.run calls this in a replica context"
            return context.all_reduce("sum", leaves)

        def replica() -> object:
            return strategy.run(in_replica)
        cases = {"raw": raw_fused, "raw, separate calls": raw_separate, "mpidist": lambda: engine.allreduce(leaves),
                 "strategy.reduce": lambda: strategy.reduce("sum", leaves, axis=None), "replica all_reduce": replica}
        timed = samples(comm, cases, seconds)
        ratios = paired_ratios(timed, "raw")
        rows.append({"case": f"{nest_count} x 4 KB nest", "bytes": nest_count * 4096,
                     **{name: statistics.median(t) for name, t in timed.items()},
                     "per raw": {name: ratios[name] for name in ("mpidist", "strategy.reduce", "replica all_reduce")}})
        strategy.close()
    engine.close()
    return rows


def table(rows: list[dict], size: int) -> str:
    lines = [f"mpidist bench: allreduce, float32, {size} ranks, medians (ms); ratio = raw / mpidist time",
             f"{'case':<22}{'raw':>11}{'mpidist':>11}{'added':>11}{'ratio':>8}   other"]
    for row in rows:
        raw, ours = row["raw"], row["mpidist"]
        per_raw = row.get("per raw", {})
        extra = "; ".join(f"{k} {v * 1e3:.4f}" + (f" ({per_raw[k]:.2f}x raw)" if k in per_raw else "")
                          for k, v in row.items() if k not in ("case", "bytes", "raw", "mpidist", "per raw"))
        lines.append(f"{row['case']:<22}{raw * 1e3:>11.4f}{ours * 1e3:>11.4f}{(ours - raw) * 1e6:>9.1f}us"
                     f"{raw / ours:>8.2f}   {extra}")
        if per_raw:
            lines.append(f"{'':<22}time / hand-fused raw, median over rounds: "
                         + ", ".join(f"{k} {v:.2f}x" for k, v in per_raw.items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mpidist bench summary", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="4KB,4MB,64MB", help="comma-separated sizes (default 4KB,4MB,64MB)")
    parser.add_argument("--nest", type=int, default=100, help="arrays of 4 KB in the nest case (0: skip)")
    parser.add_argument("--seconds", type=float, default=2.0, help="time spent per case (default 2)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    rows = run(sizes, args.nest, args.seconds)
    if MPI.COMM_WORLD.Get_rank() == 0:
        print(json.dumps(rows, indent=1) if args.json else table(rows, MPI.COMM_WORLD.Get_size()), flush=True)
    return 0
