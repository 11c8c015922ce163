"""NCCL for device buffers: dtype and op tables, reduction rules, the per-node communicator.

Tables name CuPy's constants (``cupy.cuda.nccl.NCCL_FLOAT32`` ...) as strings, so they are plain
data that tests check without CuPy; they are looked up on the module only when a call is made.

Rules (:class:`Rule`) say how a reduction of a caller's dtype runs on the wire:

- NCCL types: int8, uint8, int32, uint32, int64, uint64, float16, float32, float64 and, from
  NCCL 2.10, bfloat16 (a CuPy array of ``ml_dtypes.bfloat16``; before 2.10 it reduces in float32);
- bool travels as uint8 with SUM/MAX = logical or, PROD/MIN = logical and (as on the host path);
  int16/uint16 (no NCCL type) are widened to int32/uint32 and narrowed back (the same wrap-around);
- complex numbers travel as pairs of reals for SUM and MEAN; NCCL cannot multiply them, so PROD
  of complex has no NCCL rule and takes the MPI path for that pack;
- MEAN of floating types is ``ncclAvg`` from NCCL 2.10, else SUM then a division by the number
  of ranks; MEAN of integers is SUM then division truncating toward zero (as on the host path).

With ``hierarchical=True`` the same buffer is also reduced by MPI across nodes, so the wire types
are those MPI has (float16 and bfloat16 in float32) and MEAN is always SUM then divide.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from ..ops import Op, wire_dtype

AVG_AND_BFLOAT16_SINCE = 21000   # NCCL 2.10.0: ncclAvg and ncclBfloat16
MULTI_RANK_GPU_SINCE = 23000     # NCCL 2.30.0: several ranks on one GPU (NCCL_MULTI_RANK_GPU_ENABLE=1)
UNIQUE_ID_BYTES = 128

DTYPES = {"int8": "NCCL_INT8", "uint8": "NCCL_UINT8", "int32": "NCCL_INT32", "uint32": "NCCL_UINT32",
          "int64": "NCCL_INT64", "uint64": "NCCL_UINT64", "float16": "NCCL_FLOAT16",
          "float32": "NCCL_FLOAT32", "float64": "NCCL_FLOAT64", "bfloat16": "NCCL_BFLOAT16"}
COMPLEX = {"complex64": "NCCL_FLOAT32", "complex128": "NCCL_FLOAT64"}   # as (real, imag) pairs
OPS = {"sum": "NCCL_SUM", "prod": "NCCL_PROD", "max": "NCCL_MAX", "min": "NCCL_MIN", "avg": "NCCL_AVG"}
_WIDEN = {"int16": np.dtype(np.int32), "uint16": np.dtype(np.uint32)}
_UINT8 = np.dtype(np.uint8)
_FLOAT32 = np.dtype(np.float32)
_REDUCE = {Op.SUM: "sum", Op.MEAN: "sum", Op.PROD: "prod", Op.MIN: "min", Op.MAX: "max"}
_BOOL = {Op.SUM: "max", Op.MAX: "max", Op.PROD: "min", Op.MIN: "min"}


@dataclass(frozen=True)
class Rule:
    """How one dtype is reduced: wire dtype, reduction, whether MEAN is finished by a division,
    and for NCCL the datatype constant's name and NCCL elements per wire element."""
    wire: np.dtype
    red: str                      # "sum", "prod", "min", "max" or "avg"
    finish_mean: bool
    nccl_dtype: str | None = None
    factor: int = 1


BYTES = Rule(_UINT8, "sum", False, "NCCL_UINT8")   # data movement as bytes (and byte-sum tricks)


def is_bfloat16(dtype: np.dtype) -> bool:
    return dtype.name == "bfloat16"


def version_text(code: int) -> str:
    """NCCL's version code as text: 22105 -> "2.21.5" (codes before 2.9 were X*1000+Y*100+Z)."""
    if code <= 0:
        return "none"
    if code >= 10000:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


def check(dtype: np.dtype, op: Op, where: str, what: str) -> None:
    """The host path's dtype errors (bool MEAN, complex MIN/MAX, non-numeric), bfloat16 allowed."""
    if not is_bfloat16(dtype):
        wire_dtype(dtype, op, where, what)


def _reduction(dtype: np.dtype, op: Op) -> str:
    return _BOOL[op] if dtype.kind == "b" else _REDUCE[op]


def mpi_rule(dtype: np.dtype, op: Op, where: str, what: str) -> Rule:
    """The rule of MPI on device or staged buffers: the host path's wire types (bfloat16 as float32)."""
    check(dtype, op, where, what)
    wire = _FLOAT32 if is_bfloat16(dtype) else wire_dtype(dtype, op, where, what)
    return Rule(wire, _reduction(dtype, op), op is Op.MEAN)


def nccl_rule(dtype: np.dtype, op: Op, version: int, where: str, what: str, *,
              hierarchical: bool = False) -> Rule | None:
    """The NCCL rule for reducing ``dtype`` with ``op``, or None where NCCL cannot (complex PROD)."""
    check(dtype, op, where, what)
    new = version >= AVG_AND_BFLOAT16_SINCE
    if hierarchical:
        wire = mpi_rule(dtype, op, where, what).wire
    elif is_bfloat16(dtype):
        wire = dtype if new else _FLOAT32
    elif dtype.kind == "b":
        wire = _UINT8
    else:
        wire = dtype
    wire = _WIDEN.get(wire.name, wire)
    red, finish = _reduction(dtype, op), op is Op.MEAN
    if finish and new and not hierarchical and (wire.kind in "fc" or is_bfloat16(wire)):
        red, finish = "avg", False
    if wire.kind == "c":
        return Rule(wire, red, finish, COMPLEX[wire.name], 2) if red in ("sum", "avg") else None
    name = DTYPES.get(wire.name)
    if name is None:
        return None
    return Rule(wire, red, finish, name)


class NodeComm:
    """An NCCL communicator over the ranks of one node (``Topology.local``), on one device.

    Buffers are CuPy arrays; every call is enqueued on ``stream`` (the caller's current stream).
    ``steps`` is the current collective's ``timeline.Steps`` while the timeline records, else None;
    ``issued``, while a list, collects ``(name, nbytes, args)`` of every call (recipes.py).
    """

    def __init__(self, module: Any, comm: Any, device: int, size: int, rank: int, version: int) -> None:
        self.module, self.comm, self.device = module, comm, device
        self.size, self.rank, self.version = size, rank, version
        self.steps: Any = None
        self.issued: list[tuple] | None = None

    def _issue(self, name: str, nbytes: int, *args: Any) -> None:
        if self.issued is not None:
            self.issued.append((name, nbytes, args))
        call = getattr(self.comm, name)
        if self.steps is None:
            call(*args)
        else:
            self.steps.enqueued(name, self.size, nbytes, lambda: call(*args))

    def _dtype(self, rule: Rule) -> int:
        assert rule.nccl_dtype is not None, "NCCL calls take NCCL rules (nccl_rule, BYTES)"
        return getattr(self.module, rule.nccl_dtype)

    def _op(self, rule: Rule) -> int:
        return getattr(self.module, OPS[rule.red])

    def allreduce(self, send: Any, recv: Any, rule: Rule, stream: Any) -> None:
        self._issue("allReduce", send.nbytes, send.data.ptr, recv.data.ptr, send.size * rule.factor,
                    self._dtype(rule), self._op(rule), stream.ptr)

    def reduce(self, send: Any, recv: Any | None, rule: Rule, root: int, stream: Any) -> None:
        """``recv`` is only written at ``root``; elsewhere the send buffer stands in for it."""
        target = send if recv is None else recv
        self._issue("reduce", send.nbytes, send.data.ptr, target.data.ptr, send.size * rule.factor,
                    self._dtype(rule), self._op(rule), root, stream.ptr)

    def reduce_scatter(self, send: Any, recv: Any, rule: Rule, stream: Any) -> None:
        """Equal blocks: rank r gets block r (``recv.size`` elements) of the reduced ``send``."""
        self._issue("reduceScatter", send.nbytes, send.data.ptr, recv.data.ptr, recv.size * rule.factor,
                    self._dtype(rule), self._op(rule), stream.ptr)

    def broadcast(self, buf: Any, root: int, stream: Any) -> None:
        """In place: the root's bytes of ``buf`` on every rank."""
        self._issue("broadcast", buf.nbytes, buf.data.ptr, buf.data.ptr, buf.nbytes, self.module.NCCL_UINT8,
                    root, stream.ptr)

    def broadcast_bytes(self, send_ptr: int, recv_ptr: int, nbytes: int, root: int, stream: Any) -> None:
        self._issue("broadcast", nbytes, send_ptr, recv_ptr, nbytes, self.module.NCCL_UINT8, root, stream.ptr)

    def allgather(self, send: Any, recv: Any, stream: Any) -> None:
        """Equal blocks of bytes: ``recv`` holds every rank's ``send`` in rank order."""
        self._issue("allGather", send.nbytes, send.data.ptr, recv.data.ptr, send.nbytes, self.module.NCCL_UINT8,
                    stream.ptr)

    @contextlib.contextmanager
    def group(self) -> Iterator[None]:
        """NCCL calls made inside are launched together at the end (``ncclGroupStart/End``).

        Work that reads their results must be enqueued after the block."""
        self.module.groupStart()
        try:
            yield
        finally:
            self.module.groupEnd()

    def check(self) -> None:
        """Raise NCCL's asynchronous error, if any (after the stream has been waited for)."""
        self.comm.check_async_error()

    def abort(self) -> None:
        try:
            self.comm.abort()
        except Exception:  # already aborted or destroyed: nothing left to stop
            pass


def unique_id_bytes(raw: Any) -> np.ndarray:
    """``get_unique_id()``'s value as 128 bytes: CuPy >= 14 gives ``bytes``, CuPy <= 13 a tuple of
    C ``char`` values (signed on x86-64, unsigned on aarch64 and ppc64le)."""
    if isinstance(raw, (bytes, bytearray)):
        return np.frombuffer(bytes(raw), dtype=np.uint8).copy()
    return (np.asarray(raw, dtype=np.int64) & 0xFF).astype(np.uint8)


def communicator(module: Any, size: int, uid: np.ndarray, rank: int) -> Any:
    """``NcclCommunicator(size, id, rank)`` with the id as this CuPy takes it: ``bytes`` (CuPy >= 14),
    else a tuple of signed chars, else of unsigned chars. A wrong type is refused while CuPy checks
    the arguments, before NCCL is called, so trying the next form is safe."""
    errors = []
    for form in (uid.tobytes(), tuple(int(x) for x in uid.view(np.int8)), tuple(int(x) for x in uid)):
        try:
            return module.NcclCommunicator(size, form, rank)
        except (TypeError, OverflowError) as err:
            errors.append(f"{type(form).__name__}{' of signed chars' if form and min(form) < 0 else ''}: {err}")
    raise TypeError("communicator: this CuPy's NcclCommunicator takes `commId` in none of the forms tried "
                    "(bytes, tuple of signed chars, tuple of unsigned chars): " + "; ".join(errors))


def create(module: Any, cp: Any, local_comm: Any, local_rank: int, local_size: int, device: int,
           bcast: Callable[[Any, str, np.ndarray, int], None]) -> NodeComm:
    """Build the node's communicator (collective over ``local_comm``): local rank 0 makes the
    unique id, ``bcast(comm, "Bcast", buffer, root)`` (the engine's deadline-aware caller) sends it."""
    uid = np.zeros(UNIQUE_ID_BYTES, dtype=np.uint8)
    if local_rank == 0:
        uid[:] = unique_id_bytes(module.get_unique_id())
    bcast(local_comm, "Bcast", uid, 0)
    with cp.cuda.Device(device):
        comm = communicator(module, local_size, uid, local_rank)
    return NodeComm(module, comm, device, local_size, local_rank, int(module.get_version()))
