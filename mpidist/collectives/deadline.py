"""Issuing the MPI calls of one logical collective, blocking or against a deadline.

Without a deadline each data step is the blocking MPI call. With ``timeout_seconds`` each step is
the non-blocking variant (``Iallreduce``, ``Ibcast`` …) polled until the deadline of the whole
logical collective (``timeout_seconds``: see mpidist/validation.py for what None and 0 mean).
MPI never matches a blocking collective with a non-blocking one, so steps
that must meet whatever the ranks' deadlines (the agreement exchange, barrier) always use the
non-blocking variant (:meth:`Caller.nonblocking`); the agreement includes whether a deadline is
set, so ranks that differ there get a mismatch error rather than a hang. When the deadline
passes, the request is abandoned (its buffers are kept alive, since MPI may still write into
them), the owning engine marks itself broken and ``DeadlineExceededError`` is raised.

What happens at exit. A rank whose abandoned request never completes (the rank it waited for
never issued that step) still exits normally, with its program's status: MPI_Finalize does not
wait for incomplete collective requests (measured with Open MPI 5: pending ``Iallreduce``,
``Ibcast`` and ``Ibarrier``, small and large, 2 and 4 ranks, hierarchical too), and its fence lets
a late rank that does arrive complete the request meanwhile. What is needed is that the memory MPI
may still write into outlives the interpreter: at exit the requests and buffers of pending
collectives are kept alive for good (one reference each is leaked on purpose), since Python's
teardown would otherwise free them before mpi4py calls MPI_Finalize (which then crashed, measured).
Nothing is aborted: an ``MPI_Abort`` would also kill ranks still working (a straggler finishing its
results). A job whose program did not handle the DeadlineExceededError ends through
``rc.abort_on_error`` (topology/abort.py), right after the deadline.
"""
from __future__ import annotations

import atexit
import ctypes
import logging
import os
import time
from typing import Any, Callable

from mpi4py import MPI

from ..errors import deadline_exceeded

_log = logging.getLogger("mpidist")
_abandoned: list[tuple[MPI.Request, tuple, str]] = []
# Waiting under a deadline (``_wait``). MPI progresses a non-blocking collective only inside MPI
# calls, and Open MPI's libnbc moves a schedule on by one round per MPI_Test: an Ireduce of 4 MB is
# ~1000 rounds of 4 KB segments, so napping between Tests made it ~1000 naps long (0.9 s at -n 2,
# measured). So Test back to back first (yielding the processor between Tests), for as long as a
# step of this size may legitimately take; only past that is a late rank the likely reason, and the
# wait naps (up to _MAX_NAP), with a burst of back-to-back Tests at each wake-up so that a large
# collective still running keeps moving.
_SPIN = 0.05          # seconds of back-to-back Tests for any step ...
_SPIN_RATE = 1e8      # ... plus the step's bytes at this rate (4 MB: 40 ms more)
_BURST = 1e-4         # seconds of back-to-back Tests at each wake-up after that
_MAX_NAP = 1e-3
_yield: Callable[[], Any] = getattr(os, "sched_yield", lambda: time.sleep(0))  # lets other threads, ranks run


class Caller:
    """Runs ``comm.<Name>(*args)`` for the steps of one collective; see the module docstring."""

    __slots__ = ("what", "timeout", "deadline", "on_expire", "steps", "issued")

    def __init__(self, what: str, timeout: float | None, on_expire: Callable[[str], None]) -> None:
        self.what = what
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.on_expire = on_expire
        self.steps: Any = None  # a timeline.Steps while the timeline records this collective's data steps
        self.issued: list[tuple] | None = None  # when a list: (comm, MPI name, args, non-blocking) of each step

    def __call__(self, comm: MPI.Comm, name: str, *args: Any) -> None:
        """One data step: the blocking call, or its non-blocking variant under a deadline."""
        if self.steps is not None:
            self.steps.timed(name, comm, lambda: self._issue(comm, name, args, False), args)
        else:
            self._issue(comm, name, args, False)

    def posted(self, comm: MPI.Comm, name: str, *args: Any) -> None:
        """One data step as the non-blocking variant always (``Iallreduce`` + wait: faster than the
        blocking call for large buffers on some MPI libraries; see ``rc.iallreduce_threshold``)."""
        if self.steps is not None:  # on the timeline by the MPI call made: Iallreduce
            self.steps.timed("I" + name.lower(), comm, lambda: self._issue(comm, name, args, True), args)
        else:
            self._issue(comm, name, args, True)

    def _issue(self, comm: MPI.Comm, name: str, args: tuple, posted: bool) -> None:
        if self.issued is not None:
            self.issued.append((comm, name, args, posted or self.deadline is not None))
        if self.deadline is None and not posted:
            getattr(comm, name)(*args)
        else:
            self.nonblocking(comm, name, *args)

    def nonblocking(self, comm: MPI.Comm, name: str, *args: Any) -> None:
        """Run the non-blocking variant of ``comm.<name>`` and wait for it (up to the deadline)."""
        self.wait(getattr(comm, "I" + name.lower())(*args), comm, name, args)

    def wait(self, request: MPI.Request, comm: MPI.Comm, name: str, buffers: tuple) -> None:
        """Wait for ``request`` (MPI step ``name`` on ``comm``, posted already) up to the deadline;
        past it the request is abandoned with ``buffers`` kept alive (see the module docstring)."""
        if self.deadline is None:
            request.Wait()
            return
        if not _wait(request, self.deadline, _size(buffers)):
            abandon(request, buffers, self.what)
            message = (f"{self.what}: not finished within timeout_seconds={self.timeout:g}: at least one of "
                       f"the {comm.Get_size()} ranks taking part has not reached this collective "
                       f"(MPI step {name}). This communicator now refuses further collectives.")
            self.on_expire(f"{self.what} did not finish within timeout_seconds={self.timeout:g}")
            raise deadline_exceeded(message)


def _size(buffers: tuple) -> int:
    """Bytes of the arrays among an MPI call's arguments (a buffer may be ``[array, datatype]``)."""
    total = 0
    for b in buffers:
        b = b[0] if isinstance(b, (list, tuple)) and b else b
        total += int(getattr(b, "nbytes", 0) or 0)
    return total


def _wait(request: MPI.Request, deadline: float, nbytes: int = 0) -> bool:
    """Whether ``request`` completed before ``deadline`` (see _SPIN above for how it waits)."""
    now = time.monotonic()
    spin_until = min(deadline, now + _SPIN + nbytes / _SPIN_RATE)
    while now < spin_until:
        if request.Test():
            return True
        _yield()
        now = time.monotonic()
    nap = 1e-5
    while True:
        burst_until = now + _BURST
        while True:
            if request.Test():
                return True
            now = time.monotonic()
            if now >= deadline:
                return False
            if now >= burst_until:
                break
            _yield()
        time.sleep(min(nap, deadline - now))
        nap = min(nap * 2, _MAX_NAP)
        now = time.monotonic()


def abandon(request: MPI.Request, buffers: tuple, what: str) -> None:
    """Give up waiting for ``request`` (its ``buffers`` stay alive: MPI may still use them); if it is
    still incomplete at interpreter exit, it and its buffers are kept alive through MPI_Finalize."""
    try:
        if request.Test():
            return
    except MPI.Exception:  # finished in error (a revoked communicator): nothing stays posted
        return
    if not _abandoned:
        atexit.register(_keep_pending)
    _abandoned.append((request, buffers, what))


def pending() -> list[str]:
    """Descriptions of abandoned collectives that have still not completed."""
    return [what for request, _, what in _abandoned if not MPI.Is_finalized() and not request.Test()]


def _keep_pending() -> None:
    """At exit: keep what MPI may still write into alive until the process ends (see the module docstring)."""
    if MPI.Is_finalized():
        return
    stuck = [(request, buffers, what) for request, buffers, what in _abandoned if not request.Test()]
    if not stuck:
        return
    _log.info("mpidist: exiting with %d collective(s) that timed out still pending (%s); MPI_Finalize "
              "does not wait for them", len(stuck), "; ".join(what for _, _, what in stuck))
    for request, buffers, _ in stuck:
        for obj in (request, *buffers):
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))  # never freed: MPI may still write here
