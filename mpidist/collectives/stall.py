"""Stall reports: when a collective has waited ``rc.stall_seconds``, log which ranks have not
arrived, where each of them is, and optionally abort the job after ``rc.stall_abort_seconds``.

Each engine has a Monitor that records which collective this rank is in (a sequence number and a
name: two attribute writes per collective). One daemon thread per process wakes every quarter
second to (a) answer peers' questions ("where are you?") on a private clone of the communicator,
with the collective this rank is in or last finished and the line of user code its main thread is
running, and (b) watch this rank's own collectives: past the threshold it asks every peer and logs
one report. Needs MPI_THREAD_MULTIPLE (what mpi4py asks for by default); without it, reports are off.

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
_QUERY, _REPLY, _ANSWER = 1, 2, 3  # _ANSWER: replies to ask() (a tag of their own: never a report's)
_TICK = 0.25
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
        self.reported = 0
        self.activity = ""  # what this rank does outside collectives that others may wait for (a save)
        self._recv = self.comm.irecv(source=MPI.ANY_SOURCE, tag=_QUERY)
        self._sends: list[MPI.Request] = []
        self._asked = 0  # the number of this rank's last ask(); answers to older ones are dropped
        self._answers: dict[int, dict[str, Any]] = {}
        self._answer: MPI.Request | None = None  # the pending receive of answers (posted by ask)
        self._asks: list[MPI.Request] = []
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
        else:
            (seq, name), inside, thread = self.last, False, threading.main_thread().ident
        return {"seq": seq, "name": name, "inside": inside, "site": call_site(thread),
                "user": user_site(thread), "activity": self.activity}

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

    def serve(self) -> None:
        """Answer other ranks' queries about where this rank is (the monitor thread calls this)."""
        self._sends = [req for req in self._sends if not req.Test()]
        while True:
            done, msg = self._recv.test()
            if not done:
                return
            assert msg is not None, "a query carries the asking rank"
            if isinstance(msg, tuple):  # ask(): (rank, tag, number)
                asking, tag, token = msg
                self._sends.append(self.comm.isend((self.rank, token, self._state()), dest=asking, tag=tag))
            else:  # a report's question
                self._sends.append(self.comm.isend(self._state(), dest=msg, tag=_REPLY))
            self._recv = self.comm.irecv(source=MPI.ANY_SOURCE, tag=_QUERY)

    def watch(self) -> None:
        """Report, or abort, when this rank has waited too long in one collective (monitor thread)."""
        current = self.current
        if current is None or rc.stall_seconds is None:
            return
        seq, name, start, thread = current
        waited = time.monotonic() - start
        if waited >= rc.stall_seconds and self.reported != seq:
            self.reported = seq
            _log.warning(self._report(seq, name, waited, thread))
        if rc.stall_abort_seconds is not None and waited >= rc.stall_abort_seconds:
            _log.error("mpidist: %s #%d on rank %d has waited %.0f s (rc.stall_abort_seconds): aborting the job",
                       name, seq, self.rank, waited)
            MPI.COMM_WORLD.Abort(1)

    def _report(self, seq: int, name: str, waited: float, thread: int) -> str:
        peers = [r for r in range(self.size) if r != self.rank]
        for r in peers:
            self._sends.append(self.comm.isend(self.rank, dest=r, tag=_QUERY))
        replies: dict[int, dict[str, Any]] = {}
        pending = {r: self.comm.irecv(source=r, tag=_REPLY) for r in peers}
        deadline = time.monotonic() + 5.0
        while pending and time.monotonic() < deadline:
            self.serve()
            for r, req in list(pending.items()):
                done, state = req.test()
                if done:
                    assert state is not None, "a reply carries the replying rank's state"
                    replies[r] = state
                    del pending[r]
            time.sleep(0.01)
        for req in pending.values():
            req.Cancel()
            req.Wait()
        late = [r for r, s in sorted(replies.items()) if not (s["inside"] and s["seq"] == seq and s["name"] == name)]
        missing = late + sorted(pending)
        lines = [f"mpidist: stall: {name} #{seq} on rank {self.rank} has waited {waited:.0f} s "
                 f"(called at {call_site(thread)}); "
                 f"{'ranks not in it: ' + ', '.join(map(str, missing)) if missing else 'every rank is in it'}"]
        for r in late:
            s = replies[r]
            where = "waiting in" if s["inside"] else "last finished"
            lines.append(f"  rank {r}: {where} {s['name']} #{s['seq']}, at {s['site']}")
        for r in sorted(pending):
            lines.append(f"  rank {r}: did not answer within 5 s")
        return "\n".join(lines)

    def cancel(self) -> None:
        """Cancel the pending receives of queries and answers (before MPI_Finalize)."""
        self._recv.Cancel()
        if self._answer is not None:
            self._answer.Cancel()

    def close(self, free: bool = True) -> None:
        """Stop monitoring; ``free``: free the monitor's communicator too (else it is left alone,
        for a communicator that a failure made unusable)."""
        _unregister(self)
        if not MPI.Is_finalized():
            self.cancel()
            if free:
                self.comm.Free()


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
