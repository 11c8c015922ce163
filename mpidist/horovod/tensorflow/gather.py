"""allgather, grouped_allgather, broadcast and alltoall, with Horovod's gradients.

- allgather: rank order along the first dimension, which may differ per rank. Gradient: the
  Sum-allreduce of the incoming gradient, of which this rank keeps its own rows.
- broadcast: the root's tensor. Gradient: the Sum-allreduce of the incoming gradient at the root,
  zeros elsewhere.
- alltoall(tensor, splits): rank r receives rows ``splits[r]`` of every rank's tensor; returns
  ``(tensor, received_splits)``. Gradient: the alltoall of the incoming gradient with the received
  splits. The splits and row layout go through one engine allgather (agreement check, stall
  report), the rows through one MPI Alltoallv on the engine's communicator.
"""
from __future__ import annotations

import zlib
from typing import Any, Sequence

import numpy as np
import tensorflow as tf
from mpi4py import MPI

from ...errors import CollectiveMismatchError

from . import joins, runner
from .raw import raw_allreduce, wire
from .process_sets import ProcessSet, global_process_set
from .reduce_ops import Sum


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
            summed = raw_allreduce(list(dys), Sum, process_set, name + "_grad")
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
    return raw_allgather([tensor], process_set, runner.scope_name(name, "HorovodAllgather"))[0]


def grouped_allgather(tensors: Sequence[Any], name: str | None = None, ignore_name_scope: bool = False,
                      process_set: ProcessSet = global_process_set) -> list[tf.Tensor]:
    """allgather of every tensor in one engine call."""
    tensors = list(tensors)
    if not tensors:
        return []
    return raw_allgather(tensors, process_set, runner.scope_name(name, "HorovodGroupedAllgather"))


def broadcast(tensor: Any, root_rank: int, name: str | None = None, ignore_name_scope: bool = False,
              process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """``root_rank``'s tensor on every rank of the process set."""
    where = "broadcast"
    engine = process_set.require_engine(where)
    name = runner.scope_name(name, "HorovodBroadcast")
    wired, dtype = wire(tensor)

    def run(arrays: list[np.ndarray]) -> list[np.ndarray]:
        out = joins.collective(engine, where, lambda: engine.broadcast(arrays[0], root=root_rank))
        return [np.asarray(out).reshape(arrays[0].shape)]

    @tf.custom_gradient
    def bcast(x: tf.Tensor) -> Any:
        out = runner.execute(name, run, [x], [x.dtype], [x.shape], where, engine)[0]

        def grad(dy: tf.Tensor) -> tf.Tensor:
            summed = raw_allreduce([dy], Sum, process_set, name + "_grad")[0]
            if engine.rank == root_rank:
                return summed
            with tf.control_dependencies([summed]):  # a v1 graph must still run the allreduce here
                return tf.zeros_like(summed)
        return out, grad

    out = bcast(wired)
    return tf.cast(out, dtype) if out.dtype != dtype else out


def _exchange_rows(engine: Any, data: np.ndarray, mine: np.ndarray) -> list[np.ndarray]:
    """One MPI Alltoallv of ``data``'s rows, after an engine allgather of every rank's splits and row
    layout (agreement-checked and stall-watched): bad splits or a layout that differs from rank 0's
    are an error on every rank."""
    size, me = engine.size, engine.rank
    ok = mine.size == size and not (mine < 0).any() and mine.sum() == data.shape[0]
    layout = zlib.crc32(f"{data.dtype.str}{data.shape[1:]}".encode()) if ok else -1
    row_of = np.concatenate([mine if ok else np.zeros(size, np.int64), [layout]]).reshape(1, size + 1)
    table = np.asarray(engine.allgather(row_of.astype(np.int64)))
    if (table[:, size] == -1).any():
        raise ValueError(f"alltoall: `splits` must be {size} non-negative integers summing to the first "
                         f"dimension of `tensor` on every rank; ranks {np.flatnonzero(table[:, size] == -1).tolist()} "
                         f"gave others (this rank: {mine.tolist()} for {data.shape[0]} rows)")
    if (table[:, size] != table[0, size]).any():
        raise CollectiveMismatchError(
            f"alltoall: every rank must send the same dtype and trailing shape; ranks "
            f"{np.flatnonzero(table[:, size] != table[0, size]).tolist()} differ from rank 0 "
            f"(this rank: {data.dtype.name} rows of shape {list(data.shape[1:])})")
    received = table[:size, me]  # rows rank r sends to this rank
    row = data.dtype.itemsize * int(np.prod(data.shape[1:], dtype=np.int64))
    out = np.empty((int(received.sum()),) + data.shape[1:], data.dtype)
    send = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    recv = out.reshape(-1).view(np.uint8)
    counts = [(mine * row).tolist(), (received * row).tolist()]
    displs = [np.concatenate([[0], np.cumsum(c)[:-1]]).astype(np.int64).tolist() for c in counts]
    engine.topology.comm.Alltoallv([send, (counts[0], displs[0]), MPI.BYTE],
                                   [recv, (counts[1], displs[1]), MPI.BYTE])
    return [out, received.astype(np.int32)]


def _raw_alltoall(x: tf.Tensor, splits: tf.Tensor, process_set: ProcessSet, name: str) -> tuple:
    where = "alltoall"
    engine = process_set.require_engine(where)
    size = engine.size

    def run(arrays: list[np.ndarray]) -> list[np.ndarray]:
        data, mine = arrays
        mine = np.asarray(mine, dtype=np.int64).reshape(-1)
        return joins.collective(engine, where, lambda: _exchange_rows(engine, data, mine))

    @tf.custom_gradient
    def a2a(t: tf.Tensor, s: tf.Tensor) -> Any:
        out, received = runner.execute(name, run, [t, s], [t.dtype, tf.int32], [_ragged(t.shape), [size]], where,
                                       engine)

        def grad(dy: tf.Tensor, dsplits: Any = None) -> list[Any]:
            back, _ = _raw_alltoall(dy, received, process_set, name + "_grad")
            return [back, None]
        return (out, received), grad

    return a2a(x, splits)


def alltoall(tensor: Any, splits: Any = None, name: str | None = None, ignore_name_scope: bool = False,
             process_set: ProcessSet = global_process_set) -> tuple[tf.Tensor, tf.Tensor]:
    """Send ``splits[j]`` consecutive rows of ``tensor`` to rank j; returns ``(received, received_splits)``.

    Without ``splits`` the first dimension is cut into equal parts (it must divide by the set's size).
    """
    engine = process_set.require_engine("alltoall")
    name = runner.scope_name(name, "HorovodAlltoall")
    wired, dtype = wire(tensor)
    if wired.shape.rank == 0:
        raise ValueError("alltoall: expected a tensor of at least one dimension, got a scalar")
    if splits is None:
        rows = wired.shape[0]
        if rows is not None and rows % engine.size:
            raise ValueError(f"alltoall: the first dimension of `tensor` ({rows}) must be divisible by "
                             f"the number of ranks ({engine.size}) when `splits` is not given")
        splits = tf.fill([engine.size], tf.shape(wired, out_type=tf.int32)[0] // engine.size)
    splits = tf.cast(tf.convert_to_tensor(splits), tf.int32)
    out, received = _raw_alltoall(wired, splits, process_set, name)
    return (tf.cast(out, dtype) if out.dtype != dtype else out), received
