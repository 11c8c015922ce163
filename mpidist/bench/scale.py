"""``python -m mpidist bench scale``: at any job size, every collective checked, start-up and per-call time.

Every rank computes every rank's inputs from (seed, rank), so each result is checked against NumPy
over all of them, on every rank, with no communication in the reference: allreduce (sum, mean,
max, min) of float32 and integer arrays and of a nest, the flat and hierarchical algorithms and
``auto`` on a 1 MiB buffer (whichever the cost model picks for the layout: flat with the default
links, collectives/algorithms/choice.py), broadcast, allgather of rows that differ per rank, reduce_scatter, reduce
to a root, and a NumPy-mode MultiWorkerMirroredStrategy's ``reduce`` and a replica context's
``all_reduce``. The chief lists each check and the ranks where it failed; the exit status is 1 if
any failed.

Start-up (the maximum over ranks): the process's age when the command starts (interpreter, ``import
mpidist``, MPI_Init; read from /proc, so Linux only), then building the Engine and the strategy.
Per call: a 4 KB float32 allreduce through raw ``Allreduce``, the engine and ``strategy.reduce``
(bench/timing.py: ~10 ms blocks interleaved, median seconds per call over blocks). ``--against
FILE`` (the ``--json`` output of an earlier run, e.g. at -n 2) adds the ratios of this run to it.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from .._config import rc
from ..collectives import Engine
from ..frameworks import MultiWorkerMirroredStrategy
from ..strategies import get_replica_context
from .timing import compare

Check = Callable[[Engine, Any, int, int], tuple[Any, Any, float]]  # -> (result, reference, rtol)


def process_age() -> float | None:
    """Seconds since this process started (Linux /proc), or None where that cannot be read."""
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
        return uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: start time in clock ticks
    except (OSError, ValueError, IndexError):
        return None


def _data(rank: int, key: int, shape: tuple[int, ...], dtype: Any, seed: int) -> np.ndarray:
    """Rank ``rank``'s input ``key``: small integers, so any summation order gives the same sum."""
    return np.random.default_rng([seed, rank, key]).integers(-8, 9, size=shape).astype(dtype)


def _nest(rank: int, seed: int) -> dict[str, Any]:
    return {"weights": _data(rank, 10, (3, 5), np.float32, seed),
            "more": [_data(rank, 11, (7,), np.int32, seed), _data(rank, 12, (), np.float64, seed)]}


def _over(fn: Callable[..., Any], *nests: Any) -> Any:
    """``fn`` applied leaf by leaf over nests of one structure (dicts, lists, arrays)."""
    first = nests[0]
    if isinstance(first, dict):
        return {k: _over(fn, *(n[k] for n in nests)) for k in first}
    if isinstance(first, (list, tuple)):
        return [_over(fn, *parts) for parts in zip(*nests)]
    return fn(*nests)


def _reduce(inputs: list[Any], op: str) -> Any:
    def leaf(*xs: np.ndarray) -> np.ndarray:
        stack, dtype = np.stack(xs), np.asarray(xs[0]).dtype
        if op == "mean":
            return (stack.astype(np.float64).sum(axis=0) / len(xs)).astype(dtype)
        return getattr(np, op)(stack.astype(np.float64 if dtype.kind == "f" else dtype), axis=0).astype(dtype)
    return _over(leaf, *inputs)


def _allreduce(op: str, dtype: Any, key: int, shape: tuple[int, ...] = (37,), **kw: Any) -> Check:
    def check(engine: Engine, strategy: Any, size: int, seed: int) -> tuple[Any, Any, float]:
        mine = _data(engine.rank, key, shape, dtype, seed)
        want = _reduce([_data(r, key, shape, dtype, seed) for r in range(size)], op)
        return engine.allreduce(mine, op, **kw), want, 1e-6 if op == "mean" else 0.0
    return check


def _nest_sum(engine: Engine, strategy: Any, size: int, seed: int) -> tuple[Any, Any, float]:
    return engine.allreduce(_nest(engine.rank, seed)), _reduce([_nest(r, seed) for r in range(size)], "sum"), 0.0


def _broadcast(engine: Engine, strategy: Any, size: int, seed: int) -> tuple[Any, Any, float]:
    root = size - 1
    return engine.broadcast(_nest(engine.rank, seed), root=root), _nest(root, seed), 0.0


def _allgather(engine: Engine, strategy: Any, size: int, seed: int) -> tuple[Any, Any, float]:
    rows = [_data(r, 20, (r % 3 + 1, 4), np.float32, seed) for r in range(size)]  # rows differ per rank
    return engine.allgather(rows[engine.rank]), np.concatenate(rows), 0.0


def _reduce_scatter(engine: Engine, strategy: Any, size: int, seed: int) -> tuple[Any, Any, float]:
    inputs = [_data(r, 21, (2 * size + 1, 3), np.float32, seed) for r in range(size)]
    want = np.array_split(_reduce(inputs, "sum"), size)[engine.rank]
    return engine.reduce_scatter(inputs[engine.rank]), want, 0.0


def _reduce_to_root(engine: Engine, strategy: Any, size: int, seed: int) -> tuple[Any, Any, float]:
    root = size // 2
    want = _reduce([_data(r, 22, (9,), np.int64, seed) for r in range(size)], "max") if engine.rank == root else None
    return engine.reduce(_data(engine.rank, 22, (9,), np.int64, seed), "max", root=root), want, 0.0


def _strategy_reduce(op: str) -> Check:
    def check(engine: Engine, strategy: Any, size: int, seed: int) -> tuple[Any, Any, float]:
        want = _reduce([_data(r, 30, (6,), np.float32, seed) for r in range(size)], op)
        got = strategy.reduce(op, _data(engine.rank, 30, (6,), np.float32, seed), axis=None)
        return got, want, 1e-6 if op == "mean" else 0.0
    return check


def _replica_all_reduce(engine: Engine, strategy: Any, size: int, seed: int) -> tuple[Any, Any, float]:
    def step() -> Any:
        context = get_replica_context()
        assert context is not None, "strategy.run calls this in a replica context"
        return context.all_reduce("sum", _nest(engine.rank, seed))
    return strategy.run(step), _reduce([_nest(r, seed) for r in range(size)], "sum"), 0.0


CHECKS: dict[str, Check] = {
    "allreduce sum float32": _allreduce("sum", np.float32, 1),
    "allreduce mean float32": _allreduce("mean", np.float32, 2),
    "allreduce max float32": _allreduce("max", np.float32, 3),
    "allreduce sum int32": _allreduce("sum", np.int32, 4),
    "allreduce min int64": _allreduce("min", np.int64, 5),
    "allreduce sum nest": _nest_sum,
    "allreduce sum float32, flat": _allreduce("sum", np.float32, 6, algorithm="flat"),
    "allreduce sum float32, hierarchical": _allreduce("sum", np.float32, 7, algorithm="hierarchical"),
    "allreduce sum 1 MiB, auto": _allreduce("sum", np.float32, 8, shape=(1 << 18,)),
    "broadcast nest": _broadcast,
    "allgather rows per rank": _allgather,
    "reduce_scatter sum": _reduce_scatter,
    "reduce max to a root": _reduce_to_root,
    "strategy.reduce sum": _strategy_reduce("sum"),
    "strategy.reduce mean": _strategy_reduce("mean"),
    "replica all_reduce nest": _replica_all_reduce,
}


def _matches(got: Any, want: Any, rtol: float) -> bool:
    if want is None or got is None:
        return got is None and want is None
    if isinstance(want, dict):
        return (isinstance(got, dict) and got.keys() == want.keys()
                and all(_matches(got[k], want[k], rtol) for k in want))
    if isinstance(want, (list, tuple)):
        return (isinstance(got, (list, tuple)) and len(got) == len(want)
                and all(_matches(g, w, rtol) for g, w in zip(got, want)))
    got, want = np.asarray(got), np.asarray(want)
    return got.shape == want.shape and got.dtype == want.dtype and bool(np.allclose(got, want, rtol=rtol, atol=0))


def run(seconds: float, seed: int = 0, comm: MPI.Intracomm | None = None) -> dict[str, Any]:
    """Every rank: the checks, start-up and per-call times; the same dict on every rank."""
    comm = MPI.COMM_WORLD if comm is None else comm
    age = process_age()
    start = time.perf_counter()
    engine = Engine(comm)
    built = time.perf_counter()
    with rc.override(framework="numpy"):
        strategy = MultiWorkerMirroredStrategy(comm=comm)
    ready = time.perf_counter()
    topology = engine.topology
    size = topology.size
    failed: dict[str, str] = {}
    for name, check in CHECKS.items():
        try:
            got, want, rtol = check(engine, strategy, size, seed)
            if not _matches(got, want, rtol):
                failed[name] = "wrong result"
        except Exception as exc:  # an engine error is raised on every rank: the checks go on in step
            failed[name] = f"{type(exc).__name__}: {exc}"
    mine = {"process": age, "engine": built - start, "strategy": ready - built, "failed": failed}
    every = comm.allgather(mine)
    x = np.ones(1024, dtype=np.float32)
    out = np.empty_like(x)
    raw = topology.comm
    per_call = compare(comm, {"raw Allreduce 4 KB": lambda: raw.Allreduce(x, out),
                              "engine.allreduce 4 KB": lambda: engine.allreduce(x),
                              "strategy.reduce 4 KB": lambda: strategy.reduce("sum", x, axis=None)}, seconds)
    strategy.close()
    engine.close()
    ages = [e["process"] for e in every]
    startup = {"process start to main": None if None in ages else max(ages),
               "Engine": max(e["engine"] for e in every), "strategy": max(e["strategy"] for e in every)}
    return {"size": size, "nodes": topology.num_nodes, "node_sizes": list(topology.node_sizes),
            "faked_nodes": topology.faked_nodes,
            "checks": {name: [r for r, e in enumerate(every) if name in e["failed"]] for name in CHECKS},
            "errors": {name: text for e in every for name, text in e["failed"].items()},
            "startup_seconds": startup, "per_call_seconds": per_call}


def table(result: dict[str, Any], against: dict[str, Any] | None = None) -> str:
    checks = result["checks"]
    bad = [name for name, ranks in checks.items() if ranks]
    sizes = sorted(set(result["node_sizes"]))
    lines = [f"mpidist bench scale: {result['size']} ranks on {result['nodes']} node(s) of "
             f"{'/'.join(map(str, sizes))}{' (fake nodes: MPIDIST_LOCAL_SIZE)' if result['faked_nodes'] else ''}",
             f"collectives: {len(checks) - len(bad)} of {len(checks)} correct on every rank "
             f"(checked against NumPy over every rank's inputs)"]
    for name, ranks in checks.items():
        note = f"WRONG on ranks {ranks}: {result['errors'].get(name, '')}" if ranks else "correct"
        lines.append(f"  {name:<38}{note}")

    def ratio(section: str, key: str) -> str:
        if against is None or against[section].get(key) in (None, 0) or result[section].get(key) is None:
            return ""
        return f" ({result[section][key] / against[section][key]:.2f}x -n {against['size']})"
    lines.append("start-up, seconds, maximum over ranks:")
    for key, value in result["startup_seconds"].items():
        shown = "unknown (no /proc)" if value is None else f"{value:.3f}"
        lines.append(f"  {key:<38}{shown}{ratio('startup_seconds', key)}")
    lines.append("per call, ms (median over ~10 ms blocks):")
    for key, value in result["per_call_seconds"].items():
        lines.append(f"  {key:<38}{value * 1e3:.4f}{ratio('per_call_seconds', key)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mpidist bench scale", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="time spent per timed case (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="seed of every rank's inputs (default 0)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--against", metavar="FILE", help="the --json output of an earlier run (e.g. at -n 2): "
                                                          "ratios to its figures")
    args = parser.parse_args(argv)
    result = run(args.seconds, args.seed)
    if MPI.COMM_WORLD.Get_rank() == 0:
        if args.json:
            print(json.dumps(result, indent=1), flush=True)
        else:
            against = None
            if args.against:
                with open(args.against, encoding="utf-8") as f:
                    against = json.load(f)
            print(table(result, against), flush=True)
    return 1 if any(result["checks"].values()) else 0
