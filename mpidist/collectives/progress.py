"""The progress engine: collectives that start now and finish later, on a background thread.

``Engine.allreduce_async`` (and ``mpidist.overlap.GradientBuckets``) hand a collective to the
engine's pipeline's :class:`Worker` and return a :class:`Pending` at once; the caller keeps
computing (the rest of the backward pass) while the worker runs the collective. The worker is one
thread per pipeline, started by the first asynchronous call. It runs what it is given strictly in
submission order, each item by calling the engine's ordinary blocking path: agreement (and its
speculation), deadlines, stall reports, the timeline, ULFM's RanksLostError and the GPU path all
work unchanged, and since every rank submits in program order, every rank's MPI collectives come
in the same order.

Program order is kept with blocking collectives too: while anything is queued or running
(``Pipeline.pending`` is this worker), a blocking collective on the same engine (and reading
``Engine.topology``, which hands out the communicator) first waits until the queue is empty
(:func:`wait_idle`; one attribute test on the hot path when nothing is queued). ``Pipeline.close``
(``Engine.close``, ``Engine.replace_comm``, elastic shrink, ``strategy.close()``) first runs what is
queued, then stops and joins the thread; so does the interpreter's exit. Nothing queued is dropped:
every rank queued the same collectives, and a rank that dropped some would leave the others
waiting in them.

Overlap comes from the GIL being released where the time goes: mpi4py releases it inside MPI
calls, NumPy inside most array math (BLAS, ufunc loops on large arrays).

Threads: the worker calls MPI while the caller's thread may call MPI too (other engines, the user's
own calls), so it needs ``MPI_THREAD_MULTIPLE`` (what mpi4py asks for by default; Open MPI and MPICH
provide it). Where the library provides less, :meth:`Worker.submit` runs the collective at once on
the caller's thread (no overlap, same results) and says so once in the log.

CuPy arrays: the worker runs a collective of device arrays with the submitting thread's current
device and stream made current (CuPy's are per thread), so the GPU path waits for the work that
produced the arrays, as a blocking call on the submitting thread would.
"""
from __future__ import annotations

import atexit
import collections
import contextvars
import logging
import sys
import threading
import weakref
from typing import Any, Callable

from mpi4py import MPI

from . import gpu, nest

_log = logging.getLogger("mpidist")
_told_serial = False
_workers: weakref.WeakSet[Worker] = weakref.WeakSet()


def threads_supported() -> bool:
    """Whether MPI lets the worker thread call MPI beside the caller's (``MPI_THREAD_MULTIPLE``)."""
    return MPI.Query_thread() >= MPI.THREAD_MULTIPLE


class Pending:
    """A collective that has been started: :meth:`wait` for its result, :meth:`done` to ask.

    Until it is done, the arrays given to the collective must not be changed (as for MPI's
    non-blocking calls): the worker reads them when the collective runs.
    """

    __slots__ = ("what", "_event", "_result", "_error")

    def __init__(self, what: str) -> None:
        self.what = what
        self._event = threading.Event()
        self._result: Any = None
        self._error: BaseException | None = None

    def done(self) -> bool:
        """Whether the collective has finished (successfully or not); never blocks."""
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> Any:
        """The collective's result, once it has finished; its exception, raised here, if it failed.

        ``timeout``: seconds to wait at most (None: until done); if the collective is still running
        then, TimeoutError (it keeps running; wait again). A collective's own deadline is its
        ``timeout_seconds`` (DeadlineExceededError, raised here)."""
        if timeout is not None and (not isinstance(timeout, (int, float)) or isinstance(timeout, bool)
                                    or timeout < 0):
            raise ValueError(f"Pending.wait: `timeout` must be None or a number >= 0, got {timeout!r}")
        if not self._event.wait(timeout):
            raise TimeoutError(f"Pending.wait: {self.what} has not finished after {timeout:g} s; it is still "
                               f"running (wait again; the collective's own deadline is `timeout_seconds`)")
        if self._error is not None:
            raise self._error
        return self._result

    def settle(self, context: contextvars.Context, run: Callable[[], Any]) -> None:
        """The worker's side: ``run()`` in ``context``, keep its result or exception, mark done."""
        try:
            self._result = context.run(run)
        except BaseException as error:  # handed to the waiting thread, raised there
            self._error = error
        self._event.set()

    def __repr__(self) -> str:
        state = ("failed" if self._error is not None else "done") if self.done() else "running"
        return f"Pending({self.what}, {state})"


class Worker:
    """The background thread of one pipeline and its first-in-first-out queue; see the module docstring."""

    def __init__(self, pipeline: Any) -> None:
        self._pipeline = pipeline
        self._cond = threading.Condition()
        self._queue: collections.deque[tuple[Pending, contextvars.Context, Callable[[], Any]]] = collections.deque()
        self._thread: threading.Thread | None = None
        self._ident: int | None = None
        self._closed = False
        _workers.add(self)

    @property
    def busy(self) -> bool:
        """Whether a collective is queued or running."""
        return bool(self._queue)

    @property
    def alive(self) -> bool:
        """Whether the thread runs (started by the first submission, ended by :meth:`close`)."""
        return self._thread is not None and self._thread.is_alive()

    def submit(self, fn: Callable[[], Any], what: str, value: Any = None) -> Pending:
        """Run ``fn()`` (blocking collectives on this pipeline's engine) after everything queued before,
        on the worker thread, in the caller's context variables; ``value``: what the collective reads
        (device arrays in it make the caller's CuPy device and stream current there)."""
        pending = Pending(what)
        run = _on_caller_stream(fn, value)
        if not threads_supported():
            _tell_serial(self._pipeline.rank)
            pending.settle(contextvars.copy_context(), run)
            return pending
        with self._cond:
            if self._closed:
                raise RuntimeError(f"{what}: the engine's progress thread was stopped (the engine was closed "
                                   f"or its communicator replaced)")
            self._queue.append((pending, contextvars.copy_context(), run))
            self._pipeline.pending = self
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="mpidist-progress", daemon=True)
                self._thread.start()
            self._cond.notify_all()
        return pending

    def wait_idle(self) -> None:
        """Return when nothing is queued or running (at once on the worker thread itself)."""
        if threading.get_ident() == self._ident:
            return
        with self._cond:
            while self._queue:
                self._cond.wait()

    def close(self) -> None:
        """Run what is queued, then stop the thread and join it; later submissions raise."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread.ident != threading.get_ident():
            thread.join()
        _workers.discard(self)

    def _loop(self) -> None:
        self._ident = threading.get_ident()
        while True:
            with self._cond:
                while not self._queue:
                    if self._closed:
                        return
                    self._cond.wait()
                pending, context, run = self._queue[0]  # stays queued while it runs: wait_idle waits for it
            pending.settle(context, run)
            with self._cond:
                self._queue.popleft()
                if not self._queue:
                    if self._pipeline.pending is self:
                        self._pipeline.pending = None
                    self._cond.notify_all()


def _on_caller_stream(fn: Callable[[], Any], value: Any) -> Callable[[], Any]:
    """``fn`` run with the calling thread's CuPy device and stream current, when ``value`` holds
    device arrays; else ``fn``."""
    cp = sys.modules.get("cupy")
    if cp is None or value is None or not gpu.any_device(nest.flatten(value)[0]):
        return fn
    device, stream = cp.cuda.Device(), cp.cuda.get_current_stream()

    def on_stream() -> Any:
        with device, stream:
            return fn()
    return on_stream


def worker(pipeline: Any) -> Worker:
    """The pipeline's worker, made on first use (its thread starts with the first submission)."""
    found = pipeline.progress
    if found is None:
        found = pipeline.progress = Worker(pipeline)
    return found


def wait_idle(pipeline: Any) -> None:
    """Wait until nothing is queued on ``pipeline`` (program order for a blocking collective)."""
    pending = pipeline.pending
    if pending is not None:
        pending.wait_idle()


def _tell_serial(rank: int) -> None:
    global _told_serial
    if not _told_serial:
        _told_serial = True
        if rank == 0:
            _log.warning("mpidist: the MPI library gives thread level %s, not MPI_THREAD_MULTIPLE: asynchronous "
                         "collectives run when started (same results, no overlap with computation)",
                         MPI.Query_thread())


@atexit.register
def _close_all() -> None:
    """At the interpreter's exit (before MPI is finalized): run what is queued, stop every worker."""
    for w in list(_workers):
        w.close()
