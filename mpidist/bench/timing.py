"""Timing rules shared by the benchmarks: raw and mpidist blocks interleaved, medians.

For every case, short blocks (about 10 ms) of each variant alternate, so machine noise hits both
alike; each block starts after a barrier and is divided by its call count; results are medians over
blocks. Each round runs one block of every case in a shuffled order (the same on every rank), so
no case always runs first or always after the same other case (a non-blocking collective, say,
can leave the next block slower). Rank 0 decides when to stop, so all ranks run the same number of
blocks. :func:`paired_ratios` gives ratios between cases per round, less sensitive to a load that
changes between rounds than the ratio of medians.

A case with ``settings`` (``fn.settings = {...}``) runs its block under ``rc.override``; any settings
change drops the engines' cached calls (``rc.generation``), so after such a block every other case
is called once, untimed, to build them again. Cases without settings run with ``rc`` untouched (an
override even of nothing counted as a change, and so every block's first call used to take the
engine's general path: up to a millisecond more per 10 ms block at -n 2 on the loaded test VM).
"""
from __future__ import annotations

import random
import statistics
import time
from typing import Callable

from mpi4py import MPI

from .._config import rc

_UNITS = {"KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}


def parse_size(text: str) -> int:
    text = text.strip().upper().removesuffix("B") + "B" if text[-1:].isalpha() else text
    for unit, factor in _UNITS.items():
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * factor)
    return int(text)


def _block_time(comm: MPI.Intracomm, fn: Callable[[], object], calls: int) -> float:
    settings = getattr(fn, "settings", None)  # e.g. check_agreement=False for the whole block
    if not settings:  # (an override, even of nothing, counts as a settings change: it would drop the
        return _timed(comm, fn, calls)  # engine's cached calls, so each block's first call went the long way)
    with rc.override(**settings):
        return _timed(comm, fn, calls)


def _timed(comm: MPI.Intracomm, fn: Callable[[], object], calls: int) -> float:
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def compare(comm: MPI.Intracomm, cases: dict[str, Callable[[], object]], seconds: float) -> dict[str, float]:
    """Median seconds per call of each case; short blocks (~10 ms) of each case interleaved."""
    return {name: statistics.median(s) for name, s in samples(comm, cases, seconds).items()}


def paired_ratios(samples_: dict[str, list[float]], base: str) -> dict[str, float]:
    """Median over rounds of each case's block time / ``base``'s block time in the same round: the
    blocks of one round run back to back, so a load change between rounds cancels out."""
    return {name: statistics.median([a / b for a, b in zip(s, samples_[base])]) for name, s in samples_.items()}


def samples(comm: MPI.Intracomm, cases: dict[str, Callable[[], object]], seconds: float) -> dict[str, list[float]]:
    """Seconds per call of each case in each round (one block of every case per round)."""
    for fn in cases.values():  # warm up: first-call costs, tf.function tracing
        _block_time(comm, fn, 3)
    # each case's own block length (~10 ms): one count for all, sized for the slowest, left a fast
    # case's block so short that switching cases (another engine's buffers and caches) weighed on
    # each of its calls (a 10 µs GPU call read 28 µs beside a 170 µs one)
    probes = {name: _block_time(comm, fn, 3) for name, fn in cases.items()}
    calls = comm.bcast({name: max(1, min(2000, int(0.01 / max(p, 1e-7)))) for name, p in probes.items()}, root=0)
    times: dict[str, list[float]] = {name: [] for name in cases}
    names = list(cases)
    deadline = time.perf_counter() + seconds
    rounds = 0
    while True:
        for name in random.Random(rounds).sample(names, len(names)):  # the same order on every rank
            times[name].append(_block_time(comm, cases[name], calls[name]))
            if getattr(cases[name], "settings", None):  # leaving its settings dropped the engine's cached
                for fn in cases.values():  # calls: one untimed call of each other case builds them again
                    if not getattr(fn, "settings", None):
                        fn()
        rounds += 1
        # all ranks stop together: rank 0 decides
        if comm.bcast(rounds >= 5 and time.perf_counter() > deadline, root=0):
            break
    return times


def fmt_size(nbytes: int) -> str:
    for unit in ("GB", "MB", "KB"):
        if nbytes >= _UNITS[unit] and nbytes % _UNITS[unit] == 0:
            return f"{nbytes // _UNITS[unit]} {unit}"
    return f"{nbytes} B"
