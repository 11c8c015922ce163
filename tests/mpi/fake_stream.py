"""The pretend GPU of fake_cupy.py and fake_nccl.py: streams whose work stays pending until the
host waits for it.

Every kernel (array arithmetic, fills, copies, casts) and every NCCL call is enqueued on a
first-in-first-out queue that a thread of its own (the "device") runs in order. The device runs
queued work only when

- the host synchronises: ``Stream.synchronize``, ``Device.synchronize``,
  ``runtime.deviceSynchronize``, ``Event.synchronize``, a blocking ``get``/``asnumpy``, ``set`` on
  the null stream (a synchronous ``cudaMemcpy``), or polls ``Stream.done``/``Event.done`` (the host
  is waiting for it);
- another rank's device starts an NCCL call that needs this one's: it says so by a message (a
  real GPU would simply be running), so that a rank waiting for its peers never deadlocks;
- as a safety net, work pending for FALLBACK seconds runs anyway (counted in ``late_runs``).

So a host read of device memory without a wait (MPI on device pointers, the raw pointer of
``__cuda_array_interface__``) sees memory the pending work has not written yet, and the test that
does it fails. Fresh allocations (``empty``) are filled with 0xA5 bytes, as uninitialised memory.

Simplifications: one queue for all streams (synchronising any stream waits for all of them, so
missing waits between two streams are not caught); errors of queued work are raised by the next
synchronisation, as CUDA's sticky errors are.
"""
from __future__ import annotations

import collections
import threading
import time
import weakref
from typing import Any, Callable

from mpi4py import MPI

FALLBACK = 30.0      # seconds; see the module docstring (a safety net: the suite never needs it)
_POLL = 0.002        # how often the idle device looks for other devices' messages
_NUDGE = 31          # tag of "my device runs NCCL call (communicator id, index): run yours"
_nudges: list[MPI.Intracomm] = []


class Device:
    """The queue and the thread that runs it (one per process, between install and uninstall)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.queue: collections.deque = collections.deque()
        self.enqueued = self.completed = self.flush_to = 0
        self.error: tuple[str, BaseException] | None = None
        self.wanted: dict[Any, int] = {}        # communicator id -> highest call index a peer runs
        self.pending_ops: dict[tuple, int] = {}  # (communicator id, call index) -> queue position
        self.late_runs = 0
        self.stopping = False
        self.sent: list[MPI.Request] = []
        self.thread = threading.Thread(target=self._loop, name="fake-gpu", daemon=True)
        self.thread.start()

    # -- the host's side ---------------------------------------------------------------------------
    def enqueue(self, fn: Callable[[], None], what: str, op: tuple | None = None) -> int:
        """Queue ``fn``; ``op`` = (communicator id, call index) for an NCCL call peers may ask for."""
        with self.cond:
            self.enqueued += 1
            seq = self.enqueued
            self.queue.append((seq, fn, what, time.monotonic(), op))
            if op is not None:
                self.pending_ops[op] = seq
                if self.wanted.get(op[0], 0) >= op[1]:
                    self.flush_to = max(self.flush_to, seq)
            self.cond.notify_all()
            return seq

    def synchronize(self, upto: int | None = None) -> None:
        """Wait until the work queued so far (or up to position ``upto``) has run."""
        with self.cond:
            target = self.enqueued if upto is None else upto
            self.flush_to = max(self.flush_to, target)
            self.cond.notify_all()
            while self.completed < target:
                self.cond.wait()
            self._raise_error()

    def query(self, upto: int | None = None) -> bool:
        """Whether that work has run (asking lets it run: the host is waiting for it)."""
        with self.cond:
            target = self.enqueued if upto is None else upto
            self.flush_to = max(self.flush_to, target)
            self.cond.notify_all()
            return self.completed >= target

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
                due = [seq for (c, i), seq in self.pending_ops.items() if c == comm_id and i <= index]
                if due:
                    self.flush_to = max(self.flush_to, max(due))

    def _loop(self) -> None:
        while True:
            self._receive_nudges()
            with self.cond:
                if not self.queue:
                    if self.stopping:
                        return
                    self.cond.wait(_POLL)
                    continue
                seq, fn, what, since, op = self.queue[0]
                if seq > self.flush_to:
                    if time.monotonic() - since < FALLBACK:
                        self.cond.wait(_POLL)
                        continue
                    self.late_runs += 1
                self.queue.popleft()
            try:
                fn()
            except BaseException as err:  # noqa: BLE001 - reported at the next synchronisation
                with self.cond:
                    self.error = self.error or (what, err)
            fn = None  # what it referenced may be freed once the host has seen it done
            with self.cond:
                self.completed = seq
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


class Stream:
    """A CUDA stream: ``ptr`` 0 is the null stream. All streams share the device's one queue."""

    _count = 0
    _known: "weakref.WeakSet[Stream]" = weakref.WeakSet()

    def __init__(self, null: bool = False, non_blocking: bool = False, ptr: int | None = None) -> None:
        if null:
            self.ptr = 0
        else:
            Stream._count += 1
            self.ptr = 0x5000 + Stream._count
        Stream._known.add(self)
        self._previous: list[Stream] = []

    def synchronize(self) -> None:
        device().synchronize()

    @property
    def done(self) -> bool:
        return device().query()

    def record(self, event: "Event | None" = None) -> "Event":
        event = event or Event()
        event.record(self)
        return event

    def wait_event(self, event: "Event") -> None:
        pass  # one queue: later work already runs after the event

    def use(self) -> "Stream":
        _current[0] = self
        return self

    def __enter__(self) -> "Stream":
        self._previous.append(_current[0])
        _current[0] = self
        return self

    def __exit__(self, *exc: Any) -> None:
        _current[0] = self._previous.pop()


class Event:
    """A CUDA event: marks a position in the queue."""

    def __init__(self, block: bool = False, disable_timing: bool = False, interprocess: bool = False) -> None:
        self._at = 0

    def record(self, stream: Stream | None = None) -> None:
        self._at = device().enqueued

    def synchronize(self) -> None:
        device().synchronize(self._at)

    @property
    def done(self) -> bool:
        return device().query(self._at)


NULL = Stream(null=True)
_current: list[Stream] = [NULL]


def current() -> Stream:
    return _current[0]


def stream_pointers() -> set[int]:
    """The ``ptr`` of every stream alive (the null stream's is 0)."""
    return {s.ptr for s in Stream._known}
