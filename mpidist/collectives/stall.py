"""Stall reports: when a collective has waited ``rc.stall_seconds`` while some ranks have not
entered it, the chief logs one report naming those ranks and where each of them is; optionally a
rank aborts the job after ``rc.stall_abort_seconds``.

Each engine has a Monitor that records which collective this rank is in (a sequence number and a
name: two attribute writes per collective). One daemon thread per process wakes every quarter
second and, on a private clone of the communicator:

- **notices**: a rank whose collective has waited ``rc.stall_seconds`` tells the chief (rank 0 of
  the communicator) once: the collective, how long it has waited, where it was called;
- **one gather per stall**: the chief's thread, at the first notice of a collective, asks every
  other rank for its state (the collective it is in or last finished, the line of user code its
  main thread runs) and collects the answers within 5 s; later notices of that collective join it;
- **one report**: if some rank is not inside that collective, the chief logs one report (ranks
  with the same answer on one line); if every rank is inside it (a long collective, not a stall),
  nothing but a debug line.

So a stall costs at most 3 (N - 1) small messages in all (N - 1 notices, N - 1 questions, N - 1
answers; :attr:`Monitor.messages` counts a rank's share) and one report, where every waiting rank
used to ask every other ((N - 1)^2 messages) and log its own. The chief answers for itself
without messages, and serves notices even while its main thread is the late one (a chief-only
evaluation or save). ``rc.stall_abort_seconds`` is each rank's own: past it, a rank that still
waits logs why and aborts the job, whatever the report. Needs MPI_THREAD_MULTIPLE (what mpi4py
asks for by default); without it, reports are off.

A rank that waits for another outside a collective (a save following the chief's,
collectives/notices.py) asks it the same question itself (:meth:`Monitor.ask`, then
:meth:`Monitor.answer`, never blocking): the answer also says what the peer is doing outside
collectives (``activity``: the save it is in) and its innermost frame in the program's own code.
"""
from __future__ import annotations

import atexit
import logging
import os
import sys
import sysconfig
import threading
import time
import weakref
from typing import Any

from mpi4py import MPI

from .._config import rc

_log = logging.getLogger("mpidist")
_QUERY, _ANSWER = 1, 3  # ask()'s question and answer
_STALLED, _GATHER, _STATE = 4, 5, 6  # a notice to the chief, the chief's question, the answer to it
_CHIEF = 0  # the rank whose monitor gathers and reports
_TICK = 0.25
_ANSWER_WITHIN = 5.0  # seconds the chief waits for the answers of one gather
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_LIBRARIES = tuple(os.path.abspath(p) for p in {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib",
                                                                                   "purelib", "platlib")})


def call_site(thread_id: int | None) -> str:
    """``file:line (function)`` of the innermost frame of a thread outside mpidist."""
    frame = sys._current_frames().get(thread_id) if thread_id is not None else None
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE):
        frame = frame.f_back
    if frame is None:
        return "?"
    return f"{frame.f_code.co_filename}:{frame.f_lineno} ({frame.f_code.co_name})"


def user_site(thread_id: int | None) -> str | None:
    """``file:line (function)`` of the innermost frame of a thread in the program's own code (not in
    mpidist, the standard library or installed packages), or None."""
    frame = sys._current_frames().get(thread_id) if thread_id is not None else None
    while frame is not None:
        name = os.path.abspath(frame.f_code.co_filename)
        if not (name.startswith(_PACKAGE) or name.startswith(_LIBRARIES) or name.startswith("<")
                or "site-packages" in name or "dist-packages" in name):
            return f"{frame.f_code.co_filename}:{frame.f_lineno} ({frame.f_code.co_name})"
        frame = frame.f_back
    return None


def describe(rank: int, state: dict[str, Any]) -> str:
    """Where rank ``rank`` is, from its :meth:`Monitor.ask` answer (or a report's reply)."""
    if state["inside"]:
        text = f"rank {rank} is inside {state['name']} #{state['seq']}, called at {state['site']}"
    else:
        text = f"rank {rank} is at {state['site']} (its last collective: {state['name']} #{state['seq']})"
    user = state.get("user")
    if user and user != state["site"]:
        text += f", in the program's code at {user}"
    if state.get("activity"):
        text += f", during its {state['activity']}"
    return text


class Monitor:
    """Which collective this rank is in; see the module docstring."""

    def __init__(self, comm: MPI.Intracomm) -> None:
        self.comm = comm.Clone()
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.seq = 0
        self.current: tuple[int, str, float, int] | None = None   # seq, name, start, thread id
        self.last = (0, "none")
        self.reported = 0  # the last collective this rank gave notice of
        self.messages = 0  # stall-report messages this rank has sent (notices, questions, answers)
        self.activity = ""  # what this rank does outside collectives that others may wait for (a save)
        self._recv = self.comm.irecv(source=MPI.ANY_SOURCE, tag=_QUERY)
        self._sends: list[MPI.Request] = []
        self._asked = 0  # the number of this rank's last ask(); answers to older ones are dropped
        self._answers: dict[int, dict[str, Any]] = {}
        self._answer: MPI.Request | None = None  # the pending receive of answers (posted by ask)
        self._asks: list[MPI.Request] = []
        # the chief: notices come in, one gather at a time; the others: the chief's questions come in
        chief = self.rank == _CHIEF
        self._incoming = self.comm.irecv(source=MPI.ANY_SOURCE if chief else _CHIEF, tag=_STALLED if chief else _GATHER)
        self._gather: _Gather | None = None
        self._queued: list[tuple] = []  # notices of other collectives that came during a gather
        self._handled: dict[tuple[int, str], None] = {}  # collectives gathered already (the latest 64)
        self._gathers = 0
        _register(self)

    def enter(self, name: str) -> None:
        self.seq += 1
        self.current = (self.seq, name, time.monotonic(), threading.get_ident())

    def leave(self) -> None:
        if self.current is not None:
            self.last = self.current[:2]
        self.current = None

    # -- run by the monitor thread ---------------------------------------------------------------
    def _state(self) -> dict[str, Any]:
        current = self.current
        thread: int | None
        if current is not None:
            seq, name, inside, thread = current[0], current[1], True, current[3]
            waited = time.monotonic() - current[2]
        else:
            (seq, name), inside, thread, waited = self.last, False, threading.main_thread().ident, 0.0
        return {"seq": seq, "name": name, "inside": inside, "site": call_site(thread),
                "user": user_site(thread), "activity": self.activity, "waited": waited}

    # -- run by a thread of this rank that waits for a peer outside collectives ---------------------
    def ask(self, peer: int) -> None:
        """Ask ``peer`` where it is (its monitor thread answers within a tick); never waits."""
        self._asked += 1
        if self._answer is None:
            self._answer = self.comm.irecv(source=MPI.ANY_SOURCE, tag=_ANSWER)
        self._asks = [req for req in self._asks if not req.Test()]  # this thread's sends (not the monitor's)
        self._asks.append(self.comm.isend((self.rank, _ANSWER, self._asked), dest=peer, tag=_QUERY))

    def answer(self, peer: int) -> dict[str, Any] | None:
        """``peer``'s answer to this rank's last :meth:`ask` (a state as in reports), once; or None."""
        while self._answer is not None:
            done, msg = self._answer.test()
            if not done:
                break
            self._answer = self.comm.irecv(source=MPI.ANY_SOURCE, tag=_ANSWER)
            assert msg is not None, "an answer carries the answering rank, the question's number and a state"
            source, token, state = msg
            if token == self._asked:
                self._answers[source] = state
        return self._answers.pop(peer, None)

    def _send(self, msg: Any, dest: int, tag: int) -> None:
        """One stall-report message (counted in :attr:`messages`)."""
        self.messages += 1
        self._sends.append(self.comm.isend(msg, dest=dest, tag=tag))

    def serve(self) -> None:
        """Answer other ranks' questions; on the chief, take notices and progress its gather (the
        monitor thread calls this every tick)."""
        self._sends = [req for req in self._sends if not req.Test()]
        while True:
            done, msg = self._recv.test()
            if not done:
                break
            assert msg is not None, "a question carries the asking rank, the answer's tag and a number"
            asking, tag, token = msg
            self._sends.append(self.comm.isend((self.rank, token, self._state()), dest=asking, tag=tag))
            self._recv = self.comm.irecv(source=MPI.ANY_SOURCE, tag=_QUERY)
        while True:
            done, msg = self._incoming.test()
            if not done:
                break
            assert msg is not None, "a notice or the chief's question carries its content"
            if self.rank == _CHIEF:
                self._incoming = self.comm.irecv(source=MPI.ANY_SOURCE, tag=_STALLED)
                self._noticed(*msg)
            else:
                self._incoming = self.comm.irecv(source=_CHIEF, tag=_GATHER)
                self._send((msg, self._state()), _CHIEF, _STATE)  # msg: the gather's number
        if self._gather is not None:
            self._progress()

    def watch(self) -> None:
        """Give notice, or abort, when this rank has waited too long in one collective (monitor thread)."""
        current = self.current
        if current is None or rc.stall_seconds is None:
            return
        seq, name, start, thread = current
        waited = time.monotonic() - start
        if waited >= rc.stall_seconds and self.reported != seq and self.size > 1:
            self.reported = seq
            notice = (self.rank, seq, name, waited, call_site(thread))
            if self.rank == _CHIEF:
                self._noticed(*notice)
            else:
                self._send(notice, _CHIEF, _STALLED)
        if rc.stall_abort_seconds is not None and waited >= rc.stall_abort_seconds:
            _log.error("mpidist: %s #%d on rank %d has waited %.0f s (rc.stall_abort_seconds): aborting the job",
                       name, seq, self.rank, waited)
            MPI.COMM_WORLD.Abort(1)

    # -- the chief's side --------------------------------------------------------------------------
    def _noticed(self, rank: int, seq: int, name: str, waited: float, site: str) -> None:
        """Rank ``rank`` has waited ``waited`` s in collective ``seq``/``name``, called at ``site``."""
        key = (seq, name)
        if key in self._handled:
            return
        gather = self._gather
        if gather is not None:
            if gather.key == key:
                gather.waiting[rank] = (waited, site)
            else:
                self._queued.append((rank, seq, name, waited, site))
            return
        self._gathers += 1
        gather = self._gather = _Gather(self._gathers, key, time.monotonic() + _ANSWER_WITHIN)
        gather.waiting[rank] = (waited, site)
        gather.states[self.rank] = self._state()  # the chief's own answer, as the question goes out
        for r in range(self.size):
            if r != self.rank:
                self._send(self._gathers, r, _GATHER)
                gather.pending[r] = self.comm.irecv(source=r, tag=_STATE)

    def _progress(self) -> None:
        gather = self._gather
        assert gather is not None, "called while a gather runs"
        for r, req in list(gather.pending.items()):
            while True:
                done, msg = req.test()
                if not done:
                    break
                assert msg is not None, "an answer carries the gather's number and a state"
                number, state = msg
                if number == gather.number:
                    gather.states[r] = state
                    del gather.pending[r]
                    break
                req = gather.pending[r] = self.comm.irecv(source=r, tag=_STATE)  # a late answer to an older one
        if gather.pending and time.monotonic() < gather.deadline:
            return
        for req in gather.pending.values():
            req.Cancel()
            req.Wait()
        self._gather = None
        self._handled[gather.key] = None
        while len(self._handled) > 64:
            del self._handled[next(iter(self._handled))]
        text = gather.report(sorted(gather.pending))
        if text is None:
            _log.debug("mpidist: %s #%d waited %.0f s with every rank inside it (a long collective, not a stall)",
                       gather.key[1], gather.key[0], max(w for w, _ in gather.waiting.values()))
        else:
            _log.warning(text)
        queued, self._queued = self._queued, []
        for notice in queued:
            self._noticed(*notice)

    def cancel(self) -> None:
        """Cancel the pending receives (before MPI_Finalize)."""
        self._recv.Cancel()
        self._incoming.Cancel()
        if self._answer is not None:
            self._answer.Cancel()
        if self._gather is not None:
            for req in self._gather.pending.values():
                req.Cancel()

    def close(self, free: bool = True) -> None:
        """Stop monitoring; ``free``: free the monitor's communicator too (else it is left alone,
        for a communicator that a failure made unusable)."""
        _unregister(self)
        if not MPI.Is_finalized():
            self.cancel()
            if free:
                self.comm.Free()


class _Gather:
    """The chief's gather of every rank's state for one stalled collective."""

    def __init__(self, number: int, key: tuple[int, str], deadline: float) -> None:
        self.number, self.key, self.deadline = number, key, deadline
        self.waiting: dict[int, tuple[float, str]] = {}  # ranks that gave notice: (seconds waited, call site)
        self.pending: dict[int, MPI.Request] = {}  # ranks not answered yet
        self.states: dict[int, dict[str, Any]] = {}

    def report(self, silent: list[int]) -> str | None:
        """The report (``silent``: ranks that did not answer), or None when every rank is inside."""
        seq, name = self.key
        # not in it: inside another collective, or not yet as far (a rank that answered after the
        # collective ended has its number as its last one, or a later one: it was in it)
        late = [r for r, s in sorted(self.states.items())
                if (s["inside"] and (s["seq"], s["name"]) != (seq, name)) or (not s["inside"] and s["seq"] < seq)]
        if not late and not silent:
            return None
        inside = {r: (s["waited"], s["site"]) for r, s in self.states.items()
                  if s["inside"] and (s["seq"], s["name"]) == (seq, name)}
        inside.update(self.waiting)
        first = min(inside)  # the lowest rank seen inside it (the chief's notice, or the first one, is there)
        waited, site = inside[first]
        lines = [f"mpidist: stall: {name} #{seq} on rank {first} has waited {waited:.0f} s (called at {site}); "
                 f"ranks not in it: {_ranks(late + silent)}"]
        alike: dict[tuple, list[int]] = {}
        for r in late:
            s = self.states[r]
            alike.setdefault(("waiting in" if s["inside"] else "last finished", s["name"], s["seq"], s["site"]),
                             []).append(r)
        for (where, other, number, at), ranks in alike.items():
            lines.append(f"  {'rank' if len(ranks) == 1 else 'ranks'} {_ranks(ranks)}: {where} {other} #{number}, "
                         f"at {at}")
        if silent:
            lines.append(f"  {'rank' if len(silent) == 1 else 'ranks'} {_ranks(silent)}: did not answer within "
                         f"{_ANSWER_WITHIN:.0f} s")
        return "\n".join(lines)


def _ranks(ranks: list[int]) -> str:
    """Sorted ranks as text, runs shortened: ``0, 2-5, 9``."""
    runs: list[list[int]] = []
    for r in sorted(ranks):
        if runs and runs[-1][1] == r - 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


# -- the one monitor thread of the process -----------------------------------------------------------
_monitors: weakref.WeakSet[Monitor] = weakref.WeakSet()
_lock = threading.Lock()
_thread: list[threading.Thread] = []
_stop = threading.Event()


def enabled() -> bool:
    return MPI.Query_thread() == MPI.THREAD_MULTIPLE


def _register(monitor: Monitor) -> None:
    with _lock:
        _monitors.add(monitor)
        if not _thread:
            thread = threading.Thread(target=_loop, name="mpidist-monitor", daemon=True)
            _thread.append(thread)
            atexit.register(_shutdown)
            thread.start()


def _unregister(monitor: Monitor) -> None:
    with _lock:
        _monitors.discard(monitor)


def _loop() -> None:
    while not _stop.wait(_TICK):
        with _lock:
            monitors = list(_monitors)
        for monitor in monitors:
            try:
                monitor.serve()
                monitor.watch()
            except Exception as err:  # never let diagnostics kill the program
                _log.debug("mpidist monitor: %s", err)


def _shutdown() -> None:
    """Stop the thread before MPI_Finalize (atexit runs before mpi4py finalizes)."""
    _stop.set()
    for thread in _thread:
        thread.join(timeout=2.0)
    with _lock:
        for monitor in list(_monitors):
            if not MPI.Is_finalized():
                try:
                    monitor.cancel()
                except Exception:
                    pass
