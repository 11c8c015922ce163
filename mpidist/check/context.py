"""What every check gets: the communicator, an engine on it, the settings, a timer and the host
reference data (integer-valued, so every sum, product and order of reduction is exact)."""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from ..collectives import Engine
from .results import Outcome, broken, ok, skipped

DTYPES = (np.int32, np.int64, np.float32, np.float64)
_REDUCE: dict[str, Callable[..., Any]] = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}


@dataclass
class Context:
    comm: MPI.Intracomm       # the job's communicator (the checks' own exchanges; a duplicate)
    engine: Engine            # mpidist's engine on it
    nbytes: int = 4 << 20     # size of the timed call
    repeat: int = 10          # timed calls (median)
    timeout: float = 60.0     # deadline of every host collective of mpidist: a hang becomes an error

    @property
    def rank(self) -> int:
        return self.comm.Get_rank()

    @property
    def size(self) -> int:
        return self.comm.Get_size()


def median_seconds(call: Callable[[], Any], repeat: int) -> float:
    """Median wall time of ``call()`` over ``repeat`` calls after one warm-up (every rank makes the
    same calls: the collectives inside keep the ranks in step)."""
    call()
    times = []
    for _ in range(max(repeat, 1)):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def fmt_size(nbytes: int) -> str:
    for unit, factor in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if nbytes >= factor and nbytes % factor == 0:
            return f"{nbytes // factor} {unit}"
    return f"{nbytes} B"


def fmt_time(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms" if seconds < 1 else f"{seconds:.2f} s"


def timing_line(what: str, nbytes: int, seconds: float, bus_factor: float = 0.0) -> str:
    """"4 MB float32 allreduce: 1.234 ms (8.1 GB/s bus)": bus bandwidth as NCCL's tests count it
    (``bus_factor`` * bytes / time; 2(n-1)/n for an allreduce), left out where the factor is 0."""
    line = f"{what}, {fmt_size(nbytes)}: {fmt_time(seconds)} median"
    if bus_factor > 0 and seconds > 0:
        line += f" ({bus_factor * nbytes / seconds / 1e9:.2f} GB/s bus bandwidth)"
    return line


def allreduce_bus_factor(size: int) -> float:
    return 2 * (size - 1) / size if size > 1 else 0.0


def make(rank: int, dtype: Any, shape: tuple[int, ...], op: str = "sum") -> np.ndarray:
    """Rank ``rank``'s input: small integers (±1 for products), exact in every dtype and order."""
    count = int(np.prod(shape))
    if op == "prod":
        values = np.where((np.arange(count) + rank) % 3 == 0, -1, 1)
    else:
        values = (np.arange(count) * (rank + 3) + 5 * rank) % 17 - 8
    return values.astype(dtype).reshape(shape)


def reference(size: int, dtype: Any, shape: tuple[int, ...], op: str) -> np.ndarray:
    """The reduction of every rank's :func:`make` over ``size`` ranks, in NumPy on this host."""
    every = np.stack([make(r, dtype, shape, op) for r in range(size)])
    if op == "mean":
        return (every.sum(axis=0) / size).astype(dtype)
    return _REDUCE[op](every, axis=0).astype(dtype)


def mismatch(what: str, got: Any, expected: np.ndarray) -> str | None:
    """None when ``got`` equals ``expected`` (same shape and values), else a sentence saying how not."""
    got = np.asarray(got)
    if got.shape != expected.shape:
        return f"{what}: expected shape {expected.shape}, got {got.shape}"
    if got.dtype != expected.dtype:
        return f"{what}: expected dtype {expected.dtype}, got {got.dtype}"
    bad = np.flatnonzero(got.reshape(-1) != expected.reshape(-1))
    if bad.size:
        i = int(bad[0])
        return (f"{what}: {bad.size} of {expected.size} elements differ from the host reference, "
                f"first at flat index {i}: expected {expected.reshape(-1)[i]!r}, got {got.reshape(-1)[i]!r}")
    return None


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def gate(ctx: Context, absent: Outcome | None) -> Outcome | None:
    """Whether every rank can run a check, decided together: None when all can (``absent`` None
    everywhere); else this rank's reason (``absent``), or, on a rank that could, a skipped outcome
    naming the ranks that cannot. Checks decide this way, never alone, so that no rank enters a
    collective that another rank skips."""
    every = ctx.comm.allgather(absent)
    if all(a is None for a in every):
        return None
    if absent is not None:
        return absent
    return skipped(f"not checked: {_ranks([r for r, a in enumerate(every) if a is not None])} cannot run it")


def settle(ctx: Context, wrong: str | None, fix: str | None = None) -> Outcome | None:
    """After a check's calls (made on every rank, whatever each found): None when no rank found a
    difference from the reference (the check goes on to its timing, on every rank); else this
    rank's outcome: broken with what it found, or ok on a rank that found nothing wrong."""
    if not ctx.comm.allreduce(wrong is not None, op=MPI.LOR):
        return None
    return broken(wrong, fix) if wrong else ok("equal to the host reference on this rank")
