"""A stand-in for ``cupy.cuda.nccl`` over MPI, for fake_cupy.py's arrays (see that module).

Every NCCL call takes raw pointers, as CuPy's does. When the call is made, each pointer is matched
to the live fake allocation that holds it (an error if none does) and checked for alignment;
inside ``groupStart()``/``groupEnd()`` the call is issued at ``groupEnd()``, and only if those
allocations are still alive then. Issued calls are queued on their stream of the fake device
(fake_stream.py), each after the communicator's previous call (as NCCL orders a communicator's
calls across streams), and run when the host waits for that stream or another rank's device runs
the same call. Reductions gather
every rank's buffer and reduce in NumPy in the buffer's dtype (bfloat16 through ml_dtypes); the
communicator is an MPI communicator of the ranks that built it with the same unique id, found by a
point-to-point rendezvous at the creating rank.
"""
from __future__ import annotations

import ctypes
import itertools
import types
from typing import Any

import numpy as np
from mpi4py import MPI

import fake_cupy
import fake_stream

VERSION = 22105  # NCCL 2.21.5: ncclAvg and bfloat16
DTYPES = ["int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64", "bfloat16"]
OPS = ["sum", "prod", "max", "min", "avg"]
_REDUCE = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}
_ids = itertools.count()
_group: list[list] = []                # the calls of an open group, run at groupEnd
_rendezvous: list[MPI.Intracomm] = []  # a private duplicate of COMM_WORLD


def _numpy_dtype(code: int) -> np.dtype:
    name = DTYPES[code]
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


class _Buffer:
    """``count`` elements of ``dtype`` at ``ptr``, matched to their allocation when the call is made."""

    def __init__(self, ptr: int, count: int, dtype: np.dtype, what: str) -> None:
        self.ptr, self.nbytes, self.dtype, self.what = ptr, count * dtype.itemsize, dtype, what
        if self.nbytes and ptr % dtype.itemsize:
            raise RuntimeError(f"fake NCCL: {what} at {ptr:#x} is not aligned to its {dtype} elements "
                               f"(a GPU faults with 'misaligned address')")
        self.serial = fake_cupy.allocation_of(ptr, self.nbytes, what)
        self.kept: np.ndarray | None = None

    def keep(self) -> None:
        """When the call is issued: raise if the allocation was freed, else keep it until the call ran."""
        self.kept = fake_cupy.keep_alive(self.serial, self.what)

    def array(self) -> np.ndarray:
        """The memory as a NumPy array, when the call runs."""
        if self.nbytes == 0:
            return np.empty(0, self.dtype)
        return np.frombuffer((ctypes.c_char * self.nbytes).from_address(self.ptr), dtype=self.dtype)


class NcclCommunicator:
    """``ndev`` ranks that built their communicator with the same unique id (over MPI underneath)."""

    def __init__(self, ndev: int, comm_id: bytes, rank: int) -> None:
        if not isinstance(comm_id, bytes) or len(comm_id) != 128:  # as CuPy 14's signature
            raise TypeError(f"Argument 'commId' has incorrect type (expected bytes, got {type(comm_id).__name__})")
        root, serial = (int(x) for x in np.frombuffer(comm_id[:16], dtype=np.int64))
        world = _rendezvous[0]
        tag = 4000 + serial % 1000
        if rank == 0:
            members = [world.Get_rank()] + [0] * (ndev - 1)
            for _ in range(ndev - 1):
                local, member = world.recv(source=MPI.ANY_SOURCE, tag=tag)
                members[local] = member
            for member in members[1:]:
                world.send(members, dest=member, tag=tag)
        else:
            world.send((rank, world.Get_rank()), dest=root, tag=tag)
            members = world.recv(source=root, tag=tag)
        self.comm = world.Create_group(world.Get_group().Incl(members), tag)
        self.size, self.rank, self.aborted = ndev, rank, False
        self.id, self.members, self.calls = (root, serial), members, 0
        self.previous: tuple[int, int] | None = None  # (stream, seq) of the last call queued

    def _run(self, fn: Any, stream: int, name: str, *buffers: "_Buffer | None") -> None:
        if self.aborted:
            raise RuntimeError("fake NCCL: communicator was aborted")
        on = fake_stream.stream_of(stream)
        if on is None:
            raise RuntimeError(f"fake NCCL: {name}: stream {stream:#x} is no stream of this CuPy")
        call = (self, fn, name, [b for b in buffers if b is not None], on)
        if _group:
            _group[-1].append(call)
        else:
            _issue([call])

    def _reduced(self, send: np.ndarray, op: int) -> np.ndarray:
        stacked = np.empty((self.size,) + send.shape, send.dtype)
        self.comm.Allgather(send.view(np.uint8), stacked.view(np.uint8))
        name = OPS[op]
        if name == "avg":
            return (stacked.sum(axis=0) / self.size).astype(send.dtype)
        return _REDUCE[name](stacked, axis=0).astype(send.dtype)

    def allReduce(self, sendbuf: int, recvbuf: int, count: int, datatype: int, op: int, stream: int) -> None:
        d = _numpy_dtype(datatype)
        send, recv = _Buffer(sendbuf, count, d, "allReduce sendbuf"), _Buffer(recvbuf, count, d, "allReduce recvbuf")
        self._run(lambda: recv.array().__setitem__(..., self._reduced(send.array().copy(), op)), stream,
                  "allReduce", send, recv)

    def reduce(self, sendbuf: int, recvbuf: int, count: int, datatype: int, op: int, root: int,
               stream: int) -> None:
        d = _numpy_dtype(datatype)
        send, recv = _Buffer(sendbuf, count, d, "reduce sendbuf"), _Buffer(recvbuf, count, d, "reduce recvbuf")

        def run() -> None:
            result = self._reduced(send.array().copy(), op)
            if self.rank == root:
                recv.array()[...] = result
        self._run(run, stream, "reduce", send, recv)

    def reduceScatter(self, sendbuf: int, recvbuf: int, recvcount: int, datatype: int, op: int,
                      stream: int) -> None:
        d, n, r = _numpy_dtype(datatype), recvcount, self.rank
        send = _Buffer(sendbuf, n * self.size, d, "reduceScatter sendbuf")
        recv = _Buffer(recvbuf, n, d, "reduceScatter recvbuf")
        self._run(lambda: recv.array().__setitem__(..., self._reduced(send.array().copy(), op)[r * n:(r + 1) * n]),
                  stream, "reduceScatter", send, recv)

    def broadcast(self, sendbuf: int, recvbuf: int, count: int, datatype: int, root: int, stream: int) -> None:
        d = _numpy_dtype(datatype)
        send = _Buffer(sendbuf, count, d, "broadcast sendbuf") if self.rank == root else None
        recv = _Buffer(recvbuf, count, d, "broadcast recvbuf")

        def run() -> None:
            buf = send.array().copy() if send is not None else np.empty(count, d)
            self.comm.Bcast(buf.view(np.uint8), root=root)
            recv.array()[...] = buf
        self._run(run, stream, "broadcast", send, recv)

    def allGather(self, sendbuf: int, recvbuf: int, count: int, datatype: int, stream: int) -> None:
        d = _numpy_dtype(datatype)
        send = _Buffer(sendbuf, count, d, "allGather sendbuf")
        recv = _Buffer(recvbuf, count * self.size, d, "allGather recvbuf")

        def run() -> None:
            mine, out = send.array().copy(), np.empty(count * self.size, d)
            self.comm.Allgather(mine.view(np.uint8), out.view(np.uint8))
            recv.array()[...] = out
        self._run(run, stream, "allGather", send, recv)

    def check_async_error(self) -> None:
        pass

    def abort(self) -> None:
        self.aborted = True   # the MPI communicator is left as it is: peers may never reach a free


def get_unique_id() -> bytes:
    """128 bytes, as CuPy >= 14 gives them; this one names the creating rank and a serial number."""
    return np.array([_rendezvous[0].Get_rank(), next(_ids)], dtype=np.int64).tobytes() + bytes(112)


def groupStart() -> None:  # noqa: N802 - CuPy's name
    _group.append([])


def groupEnd() -> None:  # noqa: N802 - CuPy's name
    _issue(_group.pop())


def _issue(calls: list) -> None:
    """Queue NCCL calls on the device, in order, once all their buffers are known to be alive."""
    for _, _, _, buffers, _ in calls:
        for b in buffers:
            b.keep()
    device = fake_stream.device()
    for comm, fn, name, buffers, stream in calls:
        comm.calls += 1
        op = (comm.id, comm.calls)

        def run(comm=comm, fn=fn, op=op, buffers=buffers) -> None:
            device.nudge(comm.members, op)  # the peers' devices must run their part of it now
            fn()
            for b in buffers:
                b.kept = None  # the allocations may go now
        # NCCL runs a communicator's calls in the order they were issued, whatever their streams
        comm.previous = device.enqueue(run, f"NCCL {name}", op, stream=stream,
                                       deps=[comm.previous] if comm.previous is not None else None)


def module() -> types.ModuleType:
    """A fresh ``cupy.cuda.nccl`` module (collective over COMM_WORLD: every rank calls it)."""
    nccl = types.ModuleType("cupy.cuda.nccl")
    for i, name in enumerate(DTYPES):
        setattr(nccl, f"NCCL_{name.upper()}", i)
    for i, name in enumerate(OPS):
        setattr(nccl, f"NCCL_{name.upper()}", i)
    nccl.NCCL_FLOAT = nccl.NCCL_FLOAT32
    nccl.available = True
    nccl.get_version = lambda: VERSION
    nccl.get_unique_id, nccl.NcclCommunicator = get_unique_id, NcclCommunicator
    nccl.groupStart, nccl.groupEnd = groupStart, groupEnd
    _rendezvous[:] = [MPI.COMM_WORLD.Dup()]
    return nccl


def close() -> None:
    if _rendezvous:
        _rendezvous.pop().Free()
