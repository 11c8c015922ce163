"""The pretend GPU of fake_cupy.py and fake_nccl.py: streams whose work stays pending until the
host waits for it, each stream a queue of its own.

Every kernel (array arithmetic, fills, copies, casts) and every NCCL call is enqueued on a stream:
the calling thread's current stream (per thread, as CuPy's), or the one named. A thread of its own
(the "device") runs each stream's work in order, and runs it only when

- the host waits for it: ``Stream.synchronize`` (that stream), ``Event.synchronize`` (up to the
  event), ``Device.synchronize`` / ``runtime.deviceSynchronize`` (every stream), a blocking
  ``get``/``asnumpy`` (that stream), or polls ``Stream.done``/``Event.done``;
- another rank's device starts an NCCL call that needs this one's: it says so by a message (a
  real GPU would simply be running), so that a rank waiting for its peers never deadlocks;
- as a safety net, work pending for FALLBACK seconds runs anyway (counted in ``late_runs``).

Between streams, work is ordered only as CUDA orders it: ``stream.wait_event(event)``; and the
legacy null stream (``ptr`` 0, every thread's default) waits for all earlier work of the blocking
streams and they for its earlier work (``Stream(non_blocking=True)`` opts out). So waiting for
one stream leaves another's work pending, and code that reads on one stream what another wrote,
without an event between them, reads stale memory and fails a test.

A host read of device memory without a wait (MPI on device pointers, the raw pointer of
``__cuda_array_interface__``) likewise sees memory the pending work has not written yet. Fresh
allocations (``empty``) are filled with 0xA5 bytes, as uninitialised memory.

``Device.waits`` counts the host's blocking waits (synchronize of a stream, an event or the device,
blocking copies to the host) and ``Device.queries`` its polls, so tests can count how often a
collective makes the host wait. Errors of queued work are raised by the next wait, as CUDA's
sticky errors are.
"""
from __future__ import annotations

import collections
import itertools
import threading
import time
import weakref
from typing import Any, Callable

from mpi4py import MPI

FALLBACK = 30.0      # seconds; see the module docstring (a safety net: the suite never needs it)
_POLL = 0.002        # how often the idle device looks for other devices' messages
_NUDGE = 31          # tag of "my device runs NCCL call (communicator id, index): run yours"
_nudges: list[MPI.Intracomm] = []


class _Queue:
    """One stream's work on the device: items in order, and how far it must run and has run."""

    __slots__ = ("items", "last", "completed", "flush_to", "blocking")

    def __init__(self, blocking: bool) -> None:
        self.items: collections.deque = collections.deque()
        self.last = self.completed = self.flush_to = 0  # sequence numbers (global, increasing)
        self.blocking = blocking


class Device:
    """The streams' queues and the thread that runs them (one per process, between install and uninstall)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.queues: dict[int, _Queue] = {0: _Queue(True)}
        self.seq = 0
        self.error: tuple[str, BaseException] | None = None
        self.wanted: dict[Any, int] = {}        # communicator id -> highest call index a peer runs
        self.pending_ops: dict[tuple, tuple[int, int]] = {}  # (communicator id, index) -> (stream, seq)
        self.late_runs = self.waits = self.queries = 0
        self.stopping = False
        self.sent: list[MPI.Request] = []
        self.thread = threading.Thread(target=self._loop, name="fake-gpu", daemon=True)
        self.thread.start()

    # -- the host's side ---------------------------------------------------------------------------
    def queue_of(self, stream: "Stream") -> _Queue:
        q = self.queues.get(stream.ptr)
        if q is None:
            q = self.queues[stream.ptr] = _Queue(not stream.non_blocking)
        return q

    def enqueue(self, fn: Callable[[], None], what: str, op: tuple | None = None,
                stream: "Stream | None" = None, deps: list[tuple[int, int]] | None = None) -> tuple[int, int]:
        """Queue ``fn`` on ``stream`` (default: the calling thread's current stream); ``op`` =
        (communicator id, call index) for an NCCL call peers may ask for; ``deps``: (stream, seq)
        that must have run first. Returns (stream, seq)."""
        stream = current() if stream is None else stream
        with self.cond:
            q = self.queue_of(stream)
            self.seq += 1
            seq = self.seq
            deps = list(deps or ())
            if q.blocking:  # the legacy null stream and the blocking streams wait for each other
                for sid, other in self.queues.items():
                    pending = other.last > other.completed
                    if other is not q and other.blocking and (sid == 0 or stream.ptr == 0) and pending:
                        deps.append((sid, other.last))
            q.items.append((seq, fn, what, time.monotonic(), op, deps))
            q.last = seq
            if op is not None:
                self.pending_ops[op] = (stream.ptr, seq)
                if self.wanted.get(op[0], 0) >= op[1]:
                    q.flush_to = max(q.flush_to, seq)
            self.cond.notify_all()
            return stream.ptr, seq

    def _targets(self, stream: "Stream | None", upto: int | None) -> dict[int, int]:
        if stream is None:
            return {sid: q.last for sid, q in self.queues.items()}
        q = self.queue_of(stream)
        return {stream.ptr: q.last if upto is None else upto}

    def synchronize(self, stream: "Stream | None" = None, upto: int | None = None) -> None:
        """Wait until the work queued so far on ``stream`` (None: every stream), or up to its
        position ``upto``, has run."""
        with self.cond:
            self.waits += 1
            targets = self._targets(stream, upto)
            for sid, target in targets.items():
                q = self.queues[sid]
                q.flush_to = max(q.flush_to, target)
            self.cond.notify_all()
            while any(self.queues[sid].completed < t for sid, t in targets.items()):
                self.cond.wait()
            self._raise_error()

    def query(self, stream: "Stream | None" = None, upto: int | None = None) -> bool:
        """Whether that work has run (asking lets it run: the host is waiting for it)."""
        with self.cond:
            self.queries += 1
            targets = self._targets(stream, upto)
            for sid, target in targets.items():
                q = self.queues[sid]
                q.flush_to = max(q.flush_to, target)
            self.cond.notify_all()
            return all(self.queues[sid].completed >= t for sid, t in targets.items())

    def _raise_error(self) -> None:
        if self.error is not None:
            (what, err), self.error = self.error, None
            raise RuntimeError(f"fake CUDA: {what} failed on the device: {type(err).__name__}: {err}") from err

    def stop(self) -> None:
        self.synchronize()
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        self.thread.join()
        for request in self.sent:
            request.Wait()

    # -- the device's side -------------------------------------------------------------------------
    def nudge(self, members: list[int], op: tuple) -> None:
        """Tell the devices of ``members`` (COMM_WORLD ranks) that this one runs NCCL call ``op``."""
        me = MPI.COMM_WORLD.Get_rank()
        self.sent = [r for r in self.sent if not r.Test()]
        for member in members:
            if member != me:
                self.sent.append(_nudges[0].isend(op, dest=member, tag=_NUDGE))

    def _receive_nudges(self) -> None:
        comm = _nudges[0]
        while comm.iprobe(source=MPI.ANY_SOURCE, tag=_NUDGE):
            comm_id, index = comm.recv(source=MPI.ANY_SOURCE, tag=_NUDGE)
            with self.cond:
                self.wanted[comm_id] = max(self.wanted.get(comm_id, 0), index)
                for (c, i), (sid, seq) in self.pending_ops.items():
                    if c == comm_id and i <= index:
                        q = self.queues[sid]
                        q.flush_to = max(q.flush_to, seq)

    def _runnable(self) -> tuple[int, tuple] | None:
        """A stream head that may run now (called with the lock held); raises the flush marks of
        the streams it waits for, since waiting for it is waiting for them."""
        now = time.monotonic()
        for sid, q in list(self.queues.items()):
            if not q.items:
                continue
            head = q.items[0]
            seq, since, deps = head[0], head[3], head[5]
            late = now - since >= FALLBACK
            if seq > q.flush_to and not late:
                continue
            ready = True
            for dsid, dseq in deps:
                dq = self.queues[dsid]
                if dq.completed < dseq:
                    dq.flush_to = max(dq.flush_to, dseq)
                    ready = False
            if ready:
                if seq > q.flush_to:
                    self.late_runs += 1
                return sid, q.items.popleft()
        return None

    def _loop(self) -> None:
        while True:
            self._receive_nudges()
            with self.cond:
                found = self._runnable()
                if found is None:
                    if self.stopping and not any(q.items for q in self.queues.values()):
                        return
                    self.cond.wait(_POLL)
                    continue
            sid, (seq, fn, what, _, op, _) = found
            try:
                fn()
            except BaseException as err:  # noqa: BLE001 - reported at the next synchronisation
                with self.cond:
                    self.error = self.error or (what, err)
            fn = found = None  # what it referenced may be freed once the host has seen it done
            with self.cond:
                self.queues[sid].completed = seq
                if op is not None:
                    self.pending_ops.pop(op, None)
                self.cond.notify_all()


_device: list[Device] = []


def start() -> None:
    """Start this process's device (collective over COMM_WORLD the first time: every rank calls it)."""
    if not _nudges:
        _nudges.append(MPI.COMM_WORLD.Dup())
    if not _device:
        _device.append(Device())


def stop() -> None:
    """Run what is queued, then stop the device thread."""
    if _device:
        _device.pop().stop()


def device() -> Device:
    if not _device:
        raise RuntimeError("fake CUDA: the fake device is not started (fake_cupy.install())")
    return _device[0]


_pointers = itertools.count(0x5001)


class Stream:
    """A CUDA stream: ``ptr`` 0 is the legacy null stream. ``with stream`` and ``use()`` make it the
    calling thread's current stream, as in CuPy."""

    _known: "weakref.WeakValueDictionary[int, Stream]" = weakref.WeakValueDictionary()

    def __init__(self, null: bool = False, non_blocking: bool = False, ptr: int | None = None) -> None:
        self.ptr = 0 if null else next(_pointers)
        self.non_blocking = bool(non_blocking) and not null
        self.device_id = -1 if null else 0
        Stream._known[self.ptr] = self

    def synchronize(self) -> None:
        device().synchronize(self)

    @property
    def done(self) -> bool:
        return device().query(self)

    def record(self, event: "Event | None" = None) -> "Event":
        event = event or Event()
        event.record(self)
        return event

    def wait_event(self, event: "Event") -> None:
        """Later work on this stream runs after the work ``event`` marks (a no-op kernel that waits)."""
        if event.at is not None:
            device().enqueue(lambda: None, "wait_event", stream=self, deps=[event.at])

    def use(self) -> "Stream":
        _state().stream = self
        return self

    def __enter__(self) -> "Stream":
        state = _state()
        state.stack.append(state.stream)
        state.stream = self
        return self

    def __exit__(self, *exc: Any) -> None:
        state = _state()
        state.stream = state.stack.pop()

    def __repr__(self) -> str:
        return f"<fake Stream {self.ptr:#x}{' non-blocking' if self.non_blocking else ''}>"


class Event:
    """A CUDA event: marks a position (stream, sequence number) in a stream's queue."""

    def __init__(self, block: bool = False, disable_timing: bool = False, interprocess: bool = False) -> None:
        self.at: tuple[int, int] | None = None
        self.stream: Stream | None = None  # (kept: work recorded on a stream outlives the Stream object)

    def record(self, stream: Stream | None = None) -> None:
        stream = current() if stream is None else stream
        dev = device()
        with dev.cond:
            self.at, self.stream = (stream.ptr, dev.queue_of(stream).last), stream

    def synchronize(self) -> None:
        if self.at is not None:
            device().synchronize(self.stream, self.at[1])

    @property
    def done(self) -> bool:
        return self.at is None or device().query(self.stream, self.at[1])


NULL = Stream(null=True)
Stream.null = NULL  # type: ignore[attr-defined]  (CuPy's name)
_local = threading.local()


def _state() -> threading.local:
    """This thread's current stream and its ``with`` stack (every thread starts on the null stream)."""
    state = _local
    if not hasattr(state, "stream"):
        state.stream, state.stack = NULL, []
    return state


def current() -> Stream:
    return _state().stream


def stream_of(ptr: int) -> Stream | None:
    """The live stream whose ``ptr`` this is, or None."""
    return Stream._known.get(ptr)
