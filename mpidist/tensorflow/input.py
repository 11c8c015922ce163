"""Distributed input: every rank reads the same global batches and keeps its own slice of each.

``experimental_distribute_dataset(dataset)``: ``dataset`` yields global batches (first dimension
of every component = the global batch). Rank r keeps rows ``[start_r, end_r)`` of each, cut as
``numpy.array_split`` cuts (the first ``B % size`` ranks get one row more), so the ranks' data
are disjoint, together they are exactly the global batch, and every rank takes the same number
of steps (a short last batch gives short, possibly empty, slices; nothing is dropped).

``distribute_datasets_from_function(dataset_fn)``: ``dataset_fn`` gets an InputContext
(``input_pipeline_id`` = rank, ``num_input_pipelines`` = ``num_replicas_in_sync`` = size) and
returns this rank's dataset, already batched with the per-replica batch size, as TensorFlow
specifies. Ranks whose datasets have known, different cardinalities are an error (some ranks
would wait forever in the last steps' collectives).

Both return a ``tf.distribute.DistributedDataset`` whose iterators are ``tf.data`` iterators of
the local data, so Keras and ``tf.function`` loops consume them as usual.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import tensorflow as tf


class MPIDistributedDataset(tf.distribute.DistributedDataset):
    """This rank's part of a distributed dataset (a ``tf.data.Dataset`` of local batches)."""

    def __init__(self, local: tf.data.Dataset, strategy: tf.distribute.Strategy) -> None:
        self._local = local
        self._strategy = strategy

    def __iter__(self) -> Any:
        return iter(self._local)

    @property
    def element_spec(self) -> Any:
        return self._local.element_spec

    def reduce(self, initial_state: Any, reduce_func: Callable[[Any, Any], Any]) -> Any:
        return self._local.reduce(initial_state, reduce_func)

    def cardinality(self) -> tf.Tensor:
        return self._local.cardinality()

    @property
    def local_dataset(self) -> tf.data.Dataset:
        """The ``tf.data.Dataset`` of this rank's batches."""
        return self._local

    def __repr__(self) -> str:
        return f"MPIDistributedDataset(element_spec={self.element_spec}, rank's slice of each global batch)"


def _check_options(options: Any, where: str) -> None:
    mode = getattr(options, "experimental_replication_mode", None)
    if mode is not None and getattr(mode, "name", str(mode)).upper().endswith("PER_REPLICA"):
        raise NotImplementedError(f"{where}: `options.experimental_replication_mode` PER_REPLICA is not "
                                  f"supported (one replica per rank: PER_WORKER is the same thing here)")


def _check_batched(dataset: tf.data.Dataset, where: str) -> None:
    for spec in tf.nest.flatten(dataset.element_spec):
        shape = getattr(spec, "shape", None)
        if shape is not None and shape.rank == 0:
            raise ValueError(f"{where}: `dataset` must yield batches (every component with a batch "
                             f"dimension first); got an element with a scalar component ({spec}). "
                             f"Batch it with the global batch size: dataset.batch(global_batch_size)")


def _rows(x: Any) -> tf.Tensor:
    if isinstance(x, tf.RaggedTensor):
        return x.nrows(out_type=tf.int64)
    if isinstance(x, tf.SparseTensor):
        return x.dense_shape[0]
    return tf.shape(x, out_type=tf.int64)[0]


def _take(x: Any, start: tf.Tensor, count: tf.Tensor) -> Any:
    if isinstance(x, tf.SparseTensor):
        begin = tf.concat([[start], tf.zeros_like(x.dense_shape[1:])], 0)
        return tf.sparse.slice(x, begin, tf.concat([[count], x.dense_shape[1:]], 0))
    if isinstance(x, (tf.Tensor, tf.RaggedTensor)):
        return x[start:start + count]
    return x


def slice_dataset(dataset: tf.data.Dataset, rank: int, size: int, where: str) -> tf.data.Dataset:
    """Each global batch of ``dataset`` replaced by this rank's rows of it."""
    _check_batched(dataset, where)
    if size == 1:
        return dataset

    def take_slice(element: Any) -> Any:
        leaves = tf.nest.flatten(element, expand_composites=False)
        batch = _rows(leaves[0]) if leaves else tf.constant(0, tf.int64)
        base, extra = batch // size, batch % size
        start = rank * base + tf.minimum(tf.constant(rank, tf.int64), extra)
        count = base + tf.cast(rank < extra, tf.int64)
        return tf.nest.map_structure(lambda x: _take(x, start, count), element)

    if type(dataset.element_spec) is tuple:  # tf.data passes a tuple's components as arguments
        return dataset.map(lambda *parts: take_slice(tuple(parts)))
    return dataset.map(take_slice)


def distribute_dataset(strategy: tf.distribute.Strategy, dataset: Any, options: Any) -> MPIDistributedDataset:
    where = f"{type(strategy).__name__}.experimental_distribute_dataset"
    if isinstance(dataset, MPIDistributedDataset):
        return dataset
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(f"{where}: `dataset` must be a tf.data.Dataset, got {type(dataset).__name__}")
    _check_options(options, where)
    ext = strategy.extended
    return MPIDistributedDataset(slice_dataset(dataset, ext._rank, ext._engine.size, where), strategy)


def distribute_from_function(strategy: tf.distribute.Strategy, dataset_fn: Callable[[Any], Any],
                             options: Any) -> MPIDistributedDataset:
    where = f"{type(strategy).__name__}.distribute_datasets_from_function"
    if not callable(dataset_fn):
        raise TypeError(f"{where}: `dataset_fn` must be callable, got {type(dataset_fn).__name__}")
    _check_options(options, where)
    ext = strategy.extended
    size = ext._engine.size
    context = tf.distribute.InputContext(num_input_pipelines=size, input_pipeline_id=ext._rank,
                                         num_replicas_in_sync=size)
    dataset = dataset_fn(context)
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(f"{where}: `dataset_fn` must return a tf.data.Dataset, got {type(dataset).__name__}")
    if size > 1:
        _check_same_cardinality(ext._engine, dataset, where)
    return MPIDistributedDataset(dataset, strategy)


def _check_same_cardinality(engine: Any, dataset: tf.data.Dataset, where: str) -> None:
    """Known, different per-rank step counts would leave some ranks waiting in the last steps."""
    mine = int(dataset.cardinality().numpy())
    counts = engine.allgather(np.array([mine], dtype=np.int64))
    known = sorted({int(c) for c in counts if c >= 0})
    if len(known) > 1:
        raise ValueError(f"{where}: every rank must take the same number of steps, but the datasets that "
                         f"`dataset_fn` returned have {', '.join(f'rank {r}: {int(c)}' for r, c in enumerate(counts))} "
                         f"batches; shard and batch so that every rank gets the same number of batches")


def distribute_values(strategy: tf.distribute.Strategy, value_fn: Callable[[Any], Any]) -> Any:
    where = f"{type(strategy).__name__}.experimental_distribute_values_from_function"
    if not callable(value_fn):
        raise TypeError(f"{where}: `value_fn` must be callable, got {type(value_fn).__name__}")
    ext = strategy.extended
    return value_fn(tf.distribute.experimental.ValueContext(ext._rank, ext._engine.size))
