"""Timeline: ``MPIDIST_TIMELINE=path`` writes a Chrome/Perfetto trace of every collective, per rank.

Each rank writes its own file: ``path`` with ``{rank}`` replaced by the COMM_WORLD rank, or, when
``path`` has no ``{rank}``, ``.rank<N>`` inserted before the suffix (``trace.json`` →
``trace.rank0.json``). The files use the Trace Event "JSON array" format, which chrome://tracing,
https://ui.perfetto.dev and ``json.load`` read; ``python -m mpidist timeline merge`` joins the
ranks' files into one trace (one process per rank, one thread per engine and communicator).

Every collective is one span named after it (``allreduce``, ``broadcast`` …, with bytes, leaves,
op, algorithm) holding its phases, in order:

- ``prepare``: flatten the nest, turn leaves into host arrays, validate, build the signature;
- ``agreement``: the 24-byte signature exchange (``rc.check_agreement``). It completes only when
  every rank has arrived, so on a rank that came early this span is mostly **waiting** for the
  slowest rank. When the collective speculates (agreement.py; ``args.agreement`` says so), the
  span is only its posting and the check falls into ``unpack``;
- ``transfer``: each MPI call moving data (``args.mpi`` names it: Allreduce, Bcast, the steps of
  the hierarchical algorithm on the node or leaders communicator …). Without agreement, the wait
  for late ranks falls into the first transfer;
- ``pack`` (before a transfer) and ``unpack`` (after the last one): copies into and out of packs,
  dtype conversions, MEAN division, rebuilding the nest.

Collectives on GPU buffers (collectives/gpu) are recorded the same way, with ``args.path`` (nccl,
nccl+mpi, mpi-staged …). Their NCCL calls are ``transfer`` spans with ``args.nccl`` (allReduce,
reduceScatter …): NCCL only **enqueues** work on the CUDA stream, so such a span is the time to
launch it, not the GPU's time (inside an NCCL group, the launch itself happens at the group's end,
which falls into the next phase); the GPU work shows up in whatever waits for it next (an MPI step,
or nothing when the results stay on the device). On device buffers the pack and unpack phases
also only launch kernels.

Recording costs a few microseconds per collective; when the setting is empty nothing is recorded
and the engine's cached fast path stays on. Events are buffered and written at least every
second and at exit (a job killed by MPI_Abort may lose its last second; the array format needs no
closing bracket, so the file stays loadable).
"""
from __future__ import annotations

import atexit
import json
import os
import socket
import time
from typing import Any

from .._config import rc

_FLUSH_EVENTS = 2000
_FLUSH_SECONDS = 1.0


def rank_path(path: str, rank: int) -> str:
    """The file ``rank`` writes for ``MPIDIST_TIMELINE=path``."""
    if "{rank}" in path:
        return path.replace("{rank}", str(rank))
    root, ext = os.path.splitext(path)
    return f"{root}.rank{rank}{ext or '.json'}"


class Recorder:
    """Buffers trace events of one process and appends them to its file."""

    def __init__(self, path: str, rank: int) -> None:
        self.path = rank_path(path, rank)
        self.rank = rank
        directory = os.path.dirname(self.path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        self._file = open(self.path, "w", encoding="utf-8")
        self._file.write("[\n")
        self._first = True
        self._events: list[dict] = []
        self._engines = 0
        self._last_flush = time.monotonic()
        # microseconds on the wall clock (comparable across ranks of a node), from a monotonic clock
        self._offset = time.time() * 1e6 - time.perf_counter() * 1e6
        self._meta("process_name", 0, {"name": f"rank {rank} ({socket.gethostname()}, pid {os.getpid()})"})
        self._meta("process_sort_index", 0, {"sort_index": rank})

    def now(self) -> float:
        return time.perf_counter() * 1e6 + self._offset

    def engine(self, description: str) -> int:
        """A thread id for one engine's track, named ``description``."""
        self._engines += 1
        self._meta("thread_name", self._engines, {"name": description})
        return self._engines

    def span(self, name: str, tid: int, start: float, end: float, args: dict | None = None,
             cat: str = "phase") -> None:
        event = {"name": name, "cat": cat, "ph": "X", "pid": self.rank, "tid": tid,
                 "ts": round(start, 3), "dur": round(max(end - start, 0.0), 3)}
        if args:
            event["args"] = args
        self._events.append(event)
        if len(self._events) >= _FLUSH_EVENTS or time.monotonic() - self._last_flush > _FLUSH_SECONDS:
            self.flush()

    def _meta(self, name: str, tid: int, args: dict) -> None:
        self._events.append({"name": name, "ph": "M", "pid": self.rank, "tid": tid, "args": args})

    def flush(self) -> None:
        if self._file.closed:
            return
        if self._events:
            text = ",\n".join(json.dumps(e, separators=(",", ":")) for e in self._events)
            self._file.write(text if self._first else ",\n" + text)
            self._first = False
            self._events.clear()
        self._file.flush()
        self._last_flush = time.monotonic()

    def close(self) -> None:
        if not self._file.closed:
            self.flush()
            self._file.write("\n]\n")
            self._file.close()


_current: list[Any] = [None, None, None]  # rc.generation seen, path, Recorder


def recorder() -> Recorder | None:
    """The active recorder (None when ``rc.timeline`` is empty); follows changes of the setting."""
    if _current[0] == rc.generation:
        return _current[2]
    path = rc.timeline
    if path != _current[1]:
        close()
        if path:
            from mpi4py import MPI
            _current[2] = Recorder(path, MPI.COMM_WORLD.Get_rank())
        _current[1] = path
    _current[0] = rc.generation
    return _current[2]


def close() -> None:
    """Finish the current file (also run at exit)."""
    if _current[2] is not None:
        _current[2].close()
        _current[2] = None
    _current[1] = None
    _current[0] = None


atexit.register(close)


class Steps:
    """The MPI steps of one collective, timed by the engine's Caller: ``(mpi name, ranks, start, end, bytes)``."""

    __slots__ = ("rec", "items")

    def __init__(self, rec: Recorder) -> None:
        self.rec = rec
        self.items: list[tuple[str, int, float, float, int]] = []

    def timed(self, name: str, comm: Any, run: Any, args: tuple) -> None:
        start = self.rec.now()
        run()
        self.items.append((name, comm.Get_size(), start, self.rec.now(), _payload(args)))

    def enqueued(self, name: str, ranks: int, nbytes: int, run: Any) -> None:
        """An NCCL call (``name`` as in CuPy: allReduce …): timed while it is launched."""
        start = self.rec.now()
        run()
        self.items.append((NCCL + name, ranks, start, self.rec.now(), nbytes))


NCCL = "nccl:"   # prefix of the NCCL steps' names in Steps.items


def _payload(args: tuple) -> int:
    """Bytes of the first buffer argument of an MPI call (what this rank sends or receives)."""
    for a in args:
        nbytes = getattr(a, "nbytes", None)
        if nbytes is not None:
            return int(nbytes)
        if isinstance(a, list) and a and hasattr(a[0], "nbytes"):
            return int(a[0].nbytes)
    return 0


def agreed(rec: Recorder, prepared: float | None, call: Any) -> tuple[float, float | None]:
    """Marks once a collective's agreement is done (``prepared``: the mark taken before it, or None
    when there was none): (end of prepare, end of agreement or None). From here ``call`` times the
    data steps."""
    call.steps = Steps(rec)
    now = rec.now()
    return (now, None) if prepared is None else (prepared, now)


def write_collective(rec: Recorder, tid: int, where: str, start: float, prepared: float,
                     agreed: float | None, steps: Steps, end: float, args: dict) -> None:
    """One collective's span and its phases (see the module docstring)."""
    rec.span(where, tid, start, end, args, cat="collective")
    rec.span("prepare", tid, start, prepared)
    at = prepared
    if agreed is not None:
        rec.span("agreement", tid, prepared, agreed, {"note": "includes waiting for the slowest rank"})
        at = agreed
    for i, (name, ranks, t0, t1, nbytes) in enumerate(steps.items):
        if t0 > at:
            rec.span("unpack + pack" if i else "pack", tid, at, t0)
        what = {"nccl": name[len(NCCL):]} if name.startswith(NCCL) else {"mpi": name}
        rec.span("transfer", tid, t0, t1, {**what, "ranks": ranks, "bytes": nbytes})
        at = t1
    if end > at:
        rec.span("unpack", tid, at, end)
