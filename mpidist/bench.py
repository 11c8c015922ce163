"""``python -m mpidist bench``: the engine against raw mpi4py, measured in the same run.

Run under mpirun, e.g. ``mpirun -n 2 python -m mpidist bench``. For every case, blocks of raw
and engine calls alternate (so machine noise hits both alike); each block is timed after a
barrier and divided by its call count; the table gives medians over blocks. Rank 0 prints.

Cases: one float32 array of each ``--sizes`` (raw: ``comm.Allreduce``), and a nest of
``--nest`` arrays of 4 KB (raw: one ``Allreduce`` per array, and the hand-fused best case:
concatenate, one ``Allreduce``, split). "agreement off" shows the cost of the agreement check.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Callable

import numpy as np
from mpi4py import MPI

from ._config import rc
from .collectives import Engine

_UNITS = {"KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}


def parse_size(text: str) -> int:
    text = text.strip().upper().removesuffix("B") + "B" if text[-1:].isalpha() else text
    for unit, factor in _UNITS.items():
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * factor)
    return int(text)


def _block_time(comm: MPI.Intracomm, fn: Callable[[], object], calls: int) -> float:
    settings = getattr(fn, "settings", {})  # e.g. check_agreement=False for the whole block
    with rc.override(**settings):
        comm.Barrier()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - start) / calls


def compare(comm: MPI.Intracomm, cases: dict[str, Callable[[], object]], seconds: float) -> dict[str, float]:
    """Median seconds per call of each case; short blocks (~10 ms) of each case interleaved."""
    probe = max(_block_time(comm, fn, 1) for fn in cases.values())  # also warms up
    probe = max(probe, _block_time(comm, next(iter(cases.values())), 3))
    calls = int(comm.bcast(max(1, min(2000, int(0.01 / max(probe, 1e-7)))), root=0))
    samples: dict[str, list[float]] = {name: [] for name in cases}
    deadline = time.perf_counter() + seconds
    rounds = 0
    while True:
        for name, fn in cases.items():
            samples[name].append(_block_time(comm, fn, calls))
        rounds += 1
        # all ranks stop together: rank 0 decides
        if comm.bcast(rounds >= 5 and time.perf_counter() > deadline, root=0):
            break
    return {name: statistics.median(s) for name, s in samples.items()}


def run(sizes: list[int], nest_count: int, seconds: float, comm: MPI.Intracomm | None = None) -> list[dict]:
    comm = MPI.COMM_WORLD if comm is None else comm
    engine = Engine(comm)
    raw = engine.topology.comm  # same clone type of communicator for both: fair
    rows = []
    for nbytes in sizes:
        x = np.ones(nbytes // 4, dtype=np.float32)
        out = np.empty_like(x)

        def engine_off(x=x):
            return engine.allreduce(x)
        engine_off.settings = {"check_agreement": False}  # type: ignore[attr-defined]
        times = compare(comm, {"raw": lambda: raw.Allreduce(x, out), "mpidist": lambda: engine.allreduce(x),
                               "mpidist, agreement off": engine_off}, seconds)
        rows.append({"case": f"allreduce {_fmt(nbytes)}", "bytes": nbytes, **times})
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
        times = compare(comm, {"raw": raw_fused, "raw, separate calls": raw_separate,
                               "mpidist": lambda: engine.allreduce(leaves)}, seconds)
        rows.append({"case": f"{nest_count} x 4 KB nest", "bytes": nest_count * 4096, **times})
    engine.close()
    return rows


def _fmt(nbytes: int) -> str:
    for unit in ("GB", "MB", "KB"):
        if nbytes >= _UNITS[unit] and nbytes % _UNITS[unit] == 0:
            return f"{nbytes // _UNITS[unit]} {unit}"
    return f"{nbytes} B"


def table(rows: list[dict], size: int) -> str:
    lines = [f"mpidist bench: allreduce, float32, {size} ranks, medians (ms); ratio = raw / mpidist time",
             f"{'case':<22}{'raw':>11}{'mpidist':>11}{'added':>11}{'ratio':>8}   other"]
    for row in rows:
        raw, ours = row["raw"], row["mpidist"]
        extra = "; ".join(f"{k} {v * 1e3:.4f}" for k, v in row.items() if k not in ("case", "bytes", "raw", "mpidist"))
        lines.append(f"{row['case']:<22}{raw * 1e3:>11.4f}{ours * 1e3:>11.4f}{(ours - raw) * 1e6:>9.1f}us"
                     f"{raw / ours:>8.2f}   {extra}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mpidist bench", description=__doc__.split("\n\n")[0])
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
