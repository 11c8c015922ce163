"""``python -m mpidist soak``: many collectives of random sizes and structures, checked and measured.

    mpirun -n 4 python -m mpidist soak [--collectives 10000] [--max-bytes 1MB] [--seed 0]

Every rank draws the same sequence of collectives (kind, op, structure, dtypes, shapes) from the
seed; each rank's data depends on (step, rank), so every rank computes every rank's input and
checks each result exactly against NumPy. Memory: resident set size after a warm-up and at the end,
both after ``malloc_trim`` (glibc keeps freed heap memory from thousands of random-size arrays
mapped; trimming shows what is really held); the untrimmed growth is reported too.
Rank 0 prints one summary (and ``--json`` for tooling). Targets: every result exact, < 50 MB growth.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import time
from typing import Any

import numpy as np
from mpi4py import MPI

from .bench.timing import parse_size
from .collectives import Engine, buffers

_DTYPES = [np.float32, np.float64, np.int32, np.int64, np.float16, np.uint8, np.bool_]


def _malloc_trim() -> None:
    """Ask glibc to return free heap memory to the system (so RSS shows what is in use)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def _data(step: int, rank: int, dtype: Any, shape: tuple) -> np.ndarray:
    rng = np.random.default_rng([step, rank])
    if np.dtype(dtype).kind == "b":
        return rng.random(shape) < 0.5
    return rng.integers(0, 4, size=shape).astype(dtype)


def _expected(kind: str, op: str, parts: list[np.ndarray], rank: int) -> np.ndarray:
    if kind == "allgather":
        return np.concatenate(parts)
    if kind == "broadcast":
        return parts[0]
    stack = np.stack(parts)
    if stack.dtype.kind == "b":
        return np.logical_or.reduce(stack) if op in ("sum", "max") else np.logical_and.reduce(stack)
    if op == "sum":
        return np.add.reduce(stack.astype(np.float64) if stack.dtype.kind == "f" else stack, axis=0).astype(stack.dtype)
    return stack.max(axis=0)


def run(collectives: int, max_bytes: int, seed: int, comm: MPI.Intracomm | None = None) -> dict[str, Any]:
    engine = Engine(comm)
    rank, size = engine.rank, engine.size
    plan = np.random.default_rng(seed)
    wrong, warm_rss, start = 0, None, time.perf_counter()
    for step in range(collectives):
        if step == min(200, collectives // 10):
            _malloc_trim()
            warm_rss = _rss_mb()
        kind = plan.choice(["allreduce", "allreduce", "broadcast", "allgather"])
        op = str(plan.choice(["sum", "max"]))
        leaves = int(plan.integers(1, 12))
        dtypes = [_DTYPES[i] for i in plan.integers(0, len(_DTYPES), size=leaves)]
        budget = int(plan.integers(1, max_bytes // 8 + 1)) // leaves + 1
        tails = [tuple(int(x) for x in plan.integers(1, 4, size=int(plan.integers(0, 2)))) for _ in range(leaves)]
        rows = [max(0, budget // max(1, int(np.prod(t)))) for t in tails]
        mine = {f"k{i}": _data(step * 100 + i, rank, d, ((rows[i] + rank * (kind == "allgather")) % (rows[i] + 2),)
                               + tails[i]) for i, d in enumerate(dtypes)}
        if kind == "allreduce":
            got = engine.allreduce(mine, op)
        elif kind == "broadcast":
            got = engine.broadcast(mine, root=step % size)
        else:
            got = engine.allgather(mine)
        for i, d in enumerate(dtypes):
            gathered = kind == "allgather"
            who = [step % size] if kind == "broadcast" else range(size)
            parts = [_data(step * 100 + i, r, d, ((rows[i] + r * gathered) % (rows[i] + 2),) + tails[i]) for r in who]
            if not np.array_equal(got[f"k{i}"], _expected(kind, op, parts, rank)):
                wrong += 1
    seconds = time.perf_counter() - start
    raw_rss = _rss_mb()
    _malloc_trim()
    end_rss = _rss_mb()
    wrong_all = engine.allreduce(np.array([wrong]))[0]
    growth, untrimmed, pool = engine.allreduce(np.array([end_rss - (warm_rss or end_rss),
                                                         raw_rss - (warm_rss or raw_rss),
                                                         buffers.held_bytes() / 2**20]), "max")
    engine.close()
    return {"ranks": size, "collectives": collectives, "wrong_results": int(wrong_all),
            "max_rss_growth_mb": float(growth), "max_rss_growth_before_trim_mb": float(untrimmed),
            "buffer_pool_mb": float(pool),
            "seconds": seconds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mpidist soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--collectives", type=int, default=10_000)
    parser.add_argument("--max-bytes", default="1MB", help="largest nest per collective (default 1MB)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = run(args.collectives, parse_size(args.max_bytes), args.seed)
    if MPI.COMM_WORLD.Get_rank() == 0:
        print(json.dumps(result) if args.json else
              f"mpidist soak: {result['collectives']} collectives on {result['ranks']} ranks in "
              f"{result['seconds']:.1f} s; wrong results: {result['wrong_results']}; "
              f"max RSS growth after warm-up: {result['max_rss_growth_mb']:.1f} MB "
              f"({result['max_rss_growth_before_trim_mb']:.1f} MB before malloc_trim; recycled-buffer pool "
              f"{result['buffer_pool_mb']:.1f} MB)", flush=True)
    return 0 if result["wrong_results"] == 0 else 1
