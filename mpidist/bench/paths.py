"""``python -m mpidist bench paths``: one allreduce through every layer, against raw MPI, in one run.

For each size (default 1, 4, 16 and 64 MB of float32), short blocks of these cases alternate
(bench/timing.py: barrier-started blocks, medians), all on communicators of the same kind:

- ``raw Allreduce``: ``comm.Allreduce(x, out)`` into a preallocated ``out = numpy.empty_like(x)``
  (mpidist's results come from its pool, whose blocks from 1 MiB are in huge pages: buffers.py);
- ``raw Iallreduce``: ``comm.Iallreduce(x, out).Wait()``;
- ``engine``: ``Engine.allreduce(x)``;
- ``reduce``: ``strategy.reduce("sum", x, axis=None)`` on a NumPy-mode MultiWorkerMirroredStrategy;
- ``replica``: ``strategy.run(lambda: get_replica_context().all_reduce("sum", x))``.

``--nest N`` adds a row for a list of N float32 arrays of 4 KB (the per-tensor cost): there the
raw cases are hand-packed (``numpy.concatenate``, one ``Allreduce`` or ``Iallreduce`` + wait into a
new array, ``numpy.split``: pack + call + unpack, as ``bench summary``'s nest row) and the mpidist
cases take the list as it is.

All with ``rc``'s settings as they are (agreement on by default). ``--before PATH`` also times the
last three on the mpidist found at ``PATH/mpidist`` (another checkout, e.g. the main branch),
loaded in the same processes as ``mpidist_before`` and interleaved with the rest, so a before/after
comparison shares the machine's noise. Ratios are to raw Allreduce: in each round (one block of
every case, back to back) time / raw Allreduce's time, then the median over rounds (1.00 = as
fast, below 1 = faster); with the machine loaded by other jobs this is steadier than the ratio of
the medians.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
from types import ModuleType
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from .timing import fmt_size, paired_ratios, parse_size, samples

PATHS = ("engine", "reduce", "replica")


def load_before(path: str, name: str = "mpidist_before") -> ModuleType:
    """The package at ``path``/mpidist, imported as ``name`` (its own rc, engines and caches)."""
    init = os.path.join(path, "mpidist", "__init__.py")
    if not os.path.isfile(init):
        raise FileNotFoundError(f"python -m mpidist bench paths: `--before` must name a checkout holding "
                                f"mpidist/__init__.py, got {path!r}")
    spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[os.path.dirname(init)])
    assert spec is not None and spec.loader is not None, "a .py file's spec has a loader"
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _paths(package: Any, x: Any) -> tuple[dict[str, Callable[[], Any]], Any]:
    """The three mpidist cases of one package (this one or ``--before``'s), each returning the
    reduced value (``x``: an array or a list of them), and its strategy."""
    with package.rc.override(framework="numpy"):  # an older package (--before) has mpidist.numpy instead
        strategy = getattr(package, "numpy", package).MultiWorkerMirroredStrategy()
    engine = strategy.extended.engine
    replica_context = package.get_replica_context

    def replica() -> object:
        return strategy.run(lambda: replica_context().all_reduce("sum", x))

    return {"engine": lambda: engine.allreduce(x), "reduce": lambda: strategy.reduce("sum", x, axis=None),
            "replica": replica}, strategy


def _raw_cases(raw: MPI.Intracomm, x: Any) -> dict[str, Callable[[], object]]:
    """raw Allreduce and Iallreduce of ``x``: one array into a preallocated result, or a list of
    arrays hand-packed (concatenate, the call into a new array, split)."""
    if isinstance(x, np.ndarray):
        out, out_i = np.empty_like(x), np.empty_like(x)  # a result buffer per raw case (mpidist: its pool)

        def raw_allreduce() -> object:
            raw.Allreduce(x, out)
            return out

        def raw_iallreduce() -> object:
            raw.Iallreduce(x, out_i).Wait()
            return out_i
    else:
        count = len(x)

        def raw_allreduce() -> object:
            send = np.concatenate(x)
            recv = np.empty_like(send)
            raw.Allreduce(send, recv)
            return np.split(recv, count)

        def raw_iallreduce() -> object:
            send = np.concatenate(x)
            recv = np.empty_like(send)
            raw.Iallreduce(send, recv).Wait()
            return np.split(recv, count)
    return {"raw Allreduce": raw_allreduce, "raw Iallreduce": raw_iallreduce}


def run(sizes: list[int], seconds: float, before: ModuleType | None = None, nest: int = 0) -> list[dict]:
    import mpidist
    comm = MPI.COMM_WORLD
    rows = []
    values: list[tuple[str, int, Any]] = [(fmt_size(n), n, np.ones(n // 4, dtype=np.float32)) for n in sizes]
    if nest:
        values.append((f"{nest}x4KB", nest * 4096, [np.ones(1024, dtype=np.float32) for _ in range(nest)]))
    for label, nbytes, x in values:
        cases, strategy = _paths(mpidist, x)
        raw = strategy.extended.engine.topology.comm  # a clone, as the engine's own communicator
        strategies = [strategy]
        timed: dict[str, Callable[[], object]] = _raw_cases(raw, x)
        timed.update(cases)
        if before is not None:
            old, old_strategy = _paths(before, x)
            timed.update({f"{name} before": fn for name, fn in old.items()})
            strategies.append(old_strategy)
        want = np.full(nbytes // 4, comm.Get_size(), dtype=np.float32)
        for name, fn in timed.items():  # results equal to the reference, on every path, before timing
            got: Any = fn()
            if not np.array_equal(np.concatenate([got] if isinstance(got, np.ndarray) else got, axis=None), want):
                raise RuntimeError(f"python -m mpidist bench paths: {name} gave a wrong result at {label}")
        times = samples(comm, timed, seconds)
        rows.append({"size": label, "bytes": nbytes, "rounds": len(times["raw Allreduce"]),
                     "median": {name: statistics.median(t) for name, t in times.items()},
                     "ratio": paired_ratios(times, "raw Allreduce")})
        for s in strategies:
            s.close()
    return rows


def table(rows: list[dict], size: int, before: bool) -> str:
    names = ["raw Allreduce", "raw Iallreduce"] + [p + s for p in PATHS for s in ((" before", "") if before else ("",))]
    lines = [f"mpidist bench paths: allreduce of float32, {size} ranks: median ms per call (median over rounds "
             f"of time / raw Allreduce's time in the same round)",
             f"{'size':<9}{'rounds':>7}" + "".join(f"{n:>22}" for n in names)]
    for row in rows:
        cells = [f"{row['median'][n] * 1e3:9.3f} ({row['ratio'][n]:5.2f}x)" for n in names]
        lines.append(f"{row['size']:<9}{row['rounds']:>7}" + "".join(f"{c:>22}" for c in cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mpidist bench paths", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1MB,4MB,16MB,64MB",
                        help="comma-separated sizes (default 1MB,4MB,16MB,64MB)")
    parser.add_argument("--seconds", type=float, default=3.0, help="time spent per size (default 3)")
    parser.add_argument("--before", default=None, metavar="PATH",
                        help="also time the mpidist of another checkout (PATH/mpidist), interleaved")
    parser.add_argument("--nest", type=int, default=0, metavar="N",
                        help="also a list of N arrays of 4 KB, against hand-packed raw calls (default 0: none)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    before = load_before(args.before) if args.before else None
    rows = run([parse_size(s) for s in args.sizes.split(",") if s.strip()], args.seconds, before, args.nest)
    if MPI.COMM_WORLD.Get_rank() == 0:
        print(json.dumps(rows, indent=1) if args.json else table(rows, MPI.COMM_WORLD.Get_size(), before is not None),
              flush=True)
    return 0
