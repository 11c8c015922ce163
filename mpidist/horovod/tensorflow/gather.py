"""allgather, grouped_allgather, broadcast and alltoall, with Horovod's gradients.

- allgather: rank order along the first dimension, which may differ per rank. Gradient: the
  Average-allreduce of the incoming gradient, of which this rank keeps its own rows (Horovod 0.28.1
  averages: with the same upstream gradient on every rank, each rank gets its rows of it).
- broadcast: the root's tensor. Gradient: the Average-allreduce of the incoming gradient at the
  root, zeros elsewhere (Horovod 0.28.1).
- alltoall(tensor, splits): rank j receives the ``splits[j]`` consecutive rows of every rank's
  tensor meant for it (rows past ``sum(splits)`` are not sent); returns ``(tensor,
  received_splits)``, or only the tensor when ``splits`` is None (the first dimension then cut in
  equal parts). Bad splits (not one non-negative entry per rank, or summing to more rows than the
  tensor has) and a first dimension that does not divide by the set's size are InvalidArgumentError,
  as in Horovod, on every rank. Gradient: the alltoall of the incoming gradient with the received
  splits. The splits and row layout go through one engine allgather (agreement check, stall
  report; different dtypes or trailing shapes are FailedPreconditionError on every rank), the rows
  through one MPI Alltoallv on the engine's communicator.

Every function runs under the process set's engine guard (runner.guard): an error on one rank
before its engine call is an error on every rank, and the next collective matches.
"""
from __future__ import annotations

import zlib
from typing import Any, Sequence

import numpy as np
import tensorflow as tf
from mpi4py import MPI

from ...errors import CollectiveMismatchError
from . import joins, runner
from .process_sets import ProcessSet, global_process_set
from .raw import raw_allreduce, wire
from .reduce_ops import Average


def _ragged(shape: tf.TensorShape) -> tf.TensorShape | None:
    if shape.rank is None or shape.rank == 0:
        return None
    return tf.TensorShape([None] + shape.as_list()[1:])


def raw_allgather(tensors: Sequence[Any], process_set: ProcessSet, name: str) -> list[tf.Tensor]:
    where = "allgather"
    engine = process_set.require_engine(where)
    wired = [wire(t) for t in tensors]

    def run(arrays: list[np.ndarray]) -> list[np.ndarray]:
        out = joins.collective(engine, where, lambda: engine.allgather(arrays[0] if len(arrays) == 1 else arrays))
        return [out] if len(arrays) == 1 else list(out)

    @tf.custom_gradient
    def gather(*xs: tf.Tensor) -> Any:
        for x in xs:
            if x.shape.rank == 0:
                raise ValueError(f"allgather: expected a tensor of at least one dimension, got a scalar "
                                 f"({x.dtype.name}); reshape it to [1]")
        outs = runner.execute(name, run, xs, [x.dtype for x in xs], [_ragged(x.shape) for x in xs], where, engine)

        def grad(*dys: tf.Tensor) -> list[tf.Tensor]:
            summed = raw_allreduce(list(dys), Average, process_set, name + "_grad")
            rows = tf.stack([tf.shape(x, out_type=tf.int64)[0] for x in xs])
            everyone = tf.reshape(raw_allgather([rows], process_set, name + "_grad_rows")[0],
                                  [process_set.size(), len(xs)])
            me = process_set.rank()
            start = tf.reduce_sum(everyone[:me], axis=0)
            return [s[start[i]:start[i] + everyone[me, i]] for i, s in enumerate(summed)]
        return outs, grad

    outs = gather(*[w for w, _ in wired])
    outs = [outs] if isinstance(outs, tf.Tensor) else list(outs)
    return [tf.cast(o, d) if o.dtype != d else o for o, (_, d) in zip(outs, wired)]


def allgather(tensor: Any, name: str | None = None, ignore_name_scope: bool = False,
              process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """Concatenate every rank's ``tensor`` along the first dimension, in rank order."""
    with runner.guard(process_set, "allgather"):
        return raw_allgather([tensor], process_set, runner.scope_name(name, "HorovodAllgather"))[0]


def grouped_allgather(tensors: Sequence[Any], name: str | None = None, ignore_name_scope: bool = False,
                      process_set: ProcessSet = global_process_set) -> list[tf.Tensor]:
    """allgather of every tensor in one engine call."""
    with runner.guard(process_set, "allgather"):
        tensors = list(tensors)
        if not tensors:
            return []
        return raw_allgather(tensors, process_set, runner.scope_name(name, "HorovodGroupedAllgather"))


def broadcast(tensor: Any, root_rank: int, name: str | None = None, ignore_name_scope: bool = False,
              process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """``root_rank``'s tensor on every rank of the process set."""
    where = "broadcast"
    with runner.guard(process_set, where):
        return _broadcast(tensor, root_rank, process_set, runner.scope_name(name, "HorovodBroadcast"))


def _broadcast(tensor: Any, root_rank: int, process_set: ProcessSet, name: str) -> tf.Tensor:
    where = "broadcast"
    engine = process_set.require_engine(where)
    wired, dtype = wire(tensor)

    def run(arrays: list[np.ndarray]) -> list[np.ndarray]:
        out = joins.collective(engine, where, lambda: engine.broadcast(arrays[0], root=root_rank))
        return [np.asarray(out).reshape(arrays[0].shape)]

    @tf.custom_gradient
    def bcast(x: tf.Tensor) -> Any:
        out = runner.execute(name, run, [x], [x.dtype], [x.shape], where, engine)[0]

        def grad(dy: tf.Tensor) -> tf.Tensor:
            summed = raw_allreduce([dy], Average, process_set, name + "_grad")[0]
            if engine.rank == root_rank:
                return summed
            with tf.control_dependencies([summed]):  # a v1 graph must still run the allreduce here
                return tf.zeros_like(summed)
        return out, grad

    out = bcast(wired)
    return tf.cast(out, dtype) if out.dtype != dtype else out


def _invalid(message: str) -> tf.errors.InvalidArgumentError:
    return tf.errors.InvalidArgumentError(None, None, message)


def _check_splits(splits: np.ndarray, rows: int, size: int) -> None:
    """Horovod's rules for ``splits`` (InvalidArgumentError, raised on this rank before the engine
    call: the guard makes it an error on every rank)."""
    if splits.size != size:
        raise _invalid(f"alltoall: `splits` must have one entry per rank of the process set ({size}), "
                       f"got {splits.size}: {splits.tolist()}")
    if (splits < 0).any():
        raise _invalid(f"alltoall: `splits` entries must be >= 0, got {splits.tolist()}")
    if int(splits.sum()) > rows:
        raise _invalid(f"alltoall: the sum of `splits` ({int(splits.sum())}) is greater than the first "
                       f"dimension of `tensor` ({rows})")


def _exchange_rows(engine: Any, data: np.ndarray, mine: np.ndarray) -> list[np.ndarray]:
    """One MPI Alltoallv of ``data``'s rows, after an engine allgather of every rank's splits and row
    layout (agreement-checked and stall-watched): a layout that differs from rank 0's is an error on
    every rank."""
    size, me = engine.size, engine.rank
    layout = zlib.crc32(f"{data.dtype.str}{data.shape[1:]}".encode())
    row_of = np.concatenate([mine, [layout]]).reshape(1, size + 1)
    table = np.asarray(engine.allgather(row_of.astype(np.int64)))
    if (table[:, size] != table[0, size]).any():
        raise CollectiveMismatchError(
            f"alltoall: every rank must send the same dtype and trailing shape; ranks "
            f"{np.flatnonzero(table[:, size] != table[0, size]).tolist()} differ from rank 0 "
            f"(this rank: {data.dtype.name} rows of shape {list(data.shape[1:])})")
    received = table[:size, me]  # rows rank r sends to this rank
    row = data.dtype.itemsize * int(np.prod(data.shape[1:], dtype=np.int64))
    out = np.empty((int(received.sum()),) + data.shape[1:], data.dtype)
    send = np.ascontiguousarray(data[:int(mine.sum())]).reshape(-1).view(np.uint8)
    recv = out.reshape(-1).view(np.uint8)
    counts = [(mine * row).tolist(), (received * row).tolist()]
    displs = [np.concatenate([[0], np.cumsum(c)[:-1]]).astype(np.int64).tolist() for c in counts]
    engine.topology.comm.Alltoallv([send, (counts[0], displs[0]), MPI.BYTE],
                                   [recv, (counts[1], displs[1]), MPI.BYTE])
    return [out, received.astype(np.int32)]


def _raw_alltoall(x: tf.Tensor, splits: tf.Tensor | None, process_set: ProcessSet, name: str) -> tuple:
    """(received rows, received splits); ``splits`` None: equal parts of the first dimension."""
    where = "alltoall"
    engine = process_set.require_engine(where)
    size = engine.size
    inputs = [x] if splits is None else [x, splits]

    def run(arrays: list[np.ndarray]) -> list[np.ndarray]:
        data = arrays[0]
        if data.ndim == 0:
            raise _invalid("alltoall: expected a tensor of at least one dimension, got a scalar")
        if len(arrays) == 1:
            if data.shape[0] % size:
                raise _invalid(f"alltoall: the first dimension of `tensor` ({data.shape[0]}) must be divisible by "
                               f"the number of ranks ({size}) when `splits` is not given")
            mine = np.full(size, data.shape[0] // size, np.int64)
        else:
            mine = np.asarray(arrays[1], dtype=np.int64).reshape(-1)
            _check_splits(mine, data.shape[0], size)
        return joins.collective(engine, where, lambda: _exchange_rows(engine, data, mine))

    @tf.custom_gradient
    def a2a(t: tf.Tensor, *s: tf.Tensor) -> Any:
        out, received = runner.execute(name, run, [t, *s], [t.dtype, tf.int32], [_ragged(t.shape), [size]], where,
                                       engine)

        def grad(dy: tf.Tensor, dsplits: Any = None) -> list[Any]:
            back, _ = _raw_alltoall(dy, received, process_set, name + "_grad")
            return [back] + [None] * len(s)
        return (out, received), grad

    return a2a(*inputs)


def alltoall(tensor: Any, splits: Any = None, name: str | None = None, ignore_name_scope: bool = False,
             process_set: ProcessSet = global_process_set) -> Any:
    """Send ``splits[j]`` consecutive rows of ``tensor`` to rank j; returns ``(received,
    received_splits)``, or only ``received`` when ``splits`` is None (then the first dimension is
    cut into equal parts, and must divide by the set's size)."""
    where = "alltoall"
    with runner.guard(process_set, where):
        engine = process_set.require_engine(where)
        name = runner.scope_name(name, "HorovodAlltoall")
        wired, dtype = wire(tensor)
        if wired.shape.rank == 0:
            raise _invalid("alltoall: expected a tensor of at least one dimension, got a scalar")
        if splits is None:
            rows = wired.shape[0]
            if rows is not None and rows % engine.size:
                raise _invalid(f"alltoall: the first dimension of `tensor` ({rows}) must be divisible by "
                               f"the number of ranks ({engine.size}) when `splits` is not given")
            given = None
        else:
            given = tf.cast(tf.reshape(tf.convert_to_tensor(splits), [-1]), tf.int32)
        out, received = _raw_alltoall(wired, given, process_set, name)
        out = tf.cast(out, dtype) if out.dtype != dtype else out
        return out if splits is None else (out, received)
