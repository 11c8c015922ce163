"""A notice that any rank may raise, learned by every rank at the same step, without a blocking
round trip per step.

``LockstepMax(comm)`` keeps a private clone of ``comm``. Each rank calls ``collect()`` then, unless
it acts on the answer, ``post(values)`` once per step of its loop (a training step): ``post`` starts
a non-blocking allreduce (MAX) of a few integers, ``collect`` completes the one posted at the
previous step and returns its result. Every rank posts the k-th exchange at its k-th step and
collects it at its (k+1)-th, and the k-th exchange has one result everywhere: so all ranks learn a
value any of them posted at the same step, whatever step the notice (a signal, a watcher) reached
each of them at. In synchronous training the ranks are within a step of each other, the exchange
has completed by the time it is collected (it progresses inside the step's own MPI calls) and
``collect`` returns at once.

The exchange is one persistent request (``MPI_Allreduce_init``, MPI 4: Open MPI 5, MPICH 4)
started at every post where the library has them, else an ``MPI_Iallreduce`` per post. Measured
here (docs/elastic.md, tools/lockstep_bench.py): the persistent exchange cost less than an
``Iallreduce`` per step and, beside a bare NumPy step, about what a blocking ``Allreduce`` of the same
integers costs; around a TensorFlow step, where the blocking round trip makes each rank wait for
the others (+17-23 %), it cost nothing measurable.

What a rank posts is ``width`` integers of its own choosing (0 = nothing to tell), reduced
element by element; callers post ``rank + 1`` for "I have something", so that the result also names
a rank that had it. Whatever sets them (a signal handler, a watcher thread) only sets attributes
the caller reads when it next posts.

A rank that stops posting leaves the others waiting in their next ``collect``, exactly as it would
leave them in the step's own collectives: the loop must make the same number of steps on every
rank. ``finish`` completes a pending exchange at the end (every rank posted it), waiting at most
``timeout`` seconds; the interpreter's exit calls it for every LockstepMax not closed, so no
exchange is pending at ``MPI_Finalize``; ``close`` also frees the communicator.

Nothing here imports TensorFlow: the TensorFlow handler (mpidist/tensorflow/preemption.py) sits on
top.
"""
from __future__ import annotations

import atexit
import logging
import time

import numpy as np
from mpi4py import MPI

_log = logging.getLogger("mpidist")
FINISH_TIMEOUT = 10.0  # seconds finish() waits for a pending exchange at exit
_live: set[LockstepMax] = set()  # every one not closed (MPI may still write its buffers): finished at exit


class LockstepMax:
    """See the module docstring. ``comm``: an intracommunicator (cloned here: collective over it);
    ``width``: how many integers each post sends; ``persistent=False``: an Iallreduce per post even
    where the library has persistent collectives."""

    def __init__(self, comm: MPI.Intracomm, width: int = 1, where: str = "LockstepMax",
                 persistent: bool = True) -> None:
        if not isinstance(comm, MPI.Intracomm) or comm == MPI.COMM_NULL:
            raise TypeError(f"{where}: `comm` must be an mpi4py intracommunicator, got {type(comm).__name__}")
        if not isinstance(width, int) or width < 1:
            raise ValueError(f"{where}: `width` must be an int >= 1, got {width!r}")
        self.where, self.width = where, width
        self.comm = comm.Clone()
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        self.posted = 0  # exchanges posted so far (the step count, as every rank sees it)
        self._send = np.zeros(width, np.int64)
        self._recv = np.zeros(width, np.int64)
        self._pending = False
        self._persistent: MPI.Prequest | None = None
        self._request: MPI.Request | None = None
        try:  # MPI 4 (Open MPI 5, MPICH 4); older libraries raise
            if persistent:
                self._persistent = self.comm.Allreduce_init(self._send, self._recv, op=MPI.MAX)
        except (AttributeError, NotImplementedError, MPI.Exception):
            self._persistent = None
        _live.add(self)

    @property
    def pending(self) -> bool:
        """Whether an exchange is posted and not yet collected."""
        return self._pending

    @property
    def persistent(self) -> bool:
        """Whether the exchange is a persistent collective (MPI 4) rather than an Iallreduce per post."""
        return self._persistent is not None

    def post(self, *values: int) -> None:
        """Start this step's exchange of ``values`` (``width`` integers)."""
        if self._pending:
            raise RuntimeError(f"{self.where}: post() called twice without collect() between (exchange "
                               f"{self.posted} is still pending)")
        if len(values) != self.width:
            raise ValueError(f"{self.where}: post() takes {self.width} value(s), got {len(values)}: {values!r}")
        self._send[:] = values
        if self._persistent is not None:
            self._persistent.Start()
            self._request = self._persistent
        else:
            self._request = self.comm.Iallreduce(self._send, self._recv, op=MPI.MAX)
        self._pending = True
        self.posted += 1

    def collect(self) -> tuple[int, ...]:
        """The MAX over ranks, element by element, of what they posted at their previous ``post``
        (zeros when none is pending). Waits only for ranks that have not posted it yet."""
        if not self._pending:
            return (0,) * self.width
        self._request.Wait()  # type: ignore[union-attr]  # set whenever _pending is
        self._pending = False
        return tuple(self._recv.tolist())

    def finish(self, timeout: float = FINISH_TIMEOUT) -> bool:
        """Complete a pending exchange, waiting at most ``timeout`` seconds; False (and a warning) when
        some rank never posted it within that time (it is then left to MPI_Finalize)."""
        if not self._pending or self._request is None:
            return True
        deadline = time.monotonic() + timeout
        while not self._request.Test():
            if time.monotonic() > deadline:
                _log.warning("%s: rank %d: exchange %d (posted at its last step) did not complete within %.0f s: "
                             "some rank made fewer steps", self.where, self.rank, self.posted, timeout)
                return False
            time.sleep(0.001)
        self._pending = False
        return True

    def close(self) -> None:
        """``finish``, then free the persistent request and the private communicator (collective)."""
        if self.comm == MPI.COMM_NULL:
            return
        if self.finish():
            if self._persistent is not None:
                self._persistent.Free()
            self.comm.Free()
        _live.discard(self)


@atexit.register
def _finish_all() -> None:
    if MPI.Is_initialized() and not MPI.Is_finalized():
        for each in list(_live):
            each.finish()
