"""Distributed input under mpidist's ``tf.distribute.Strategy`` (one replica per rank).

``experimental_distribute_dataset(dataset)``: ``dataset`` yields global batches. It is sharded by
the policy in its options (``experimental_distribute.auto_shard_policy``: AUTO, FILE, DATA, OFF,
HINT), as TensorFlow's MultiWorkerMirroredStrategy shards it: by files (rank r reads files r, r+N,
...), by data (rank r keeps its ``numpy.array_split`` block of each global batch), or not at all;
see ``autoshard`` for each policy. Per-replica batches are B/N rows of a global batch of B.

``distribute_datasets_from_function(dataset_fn)``: ``dataset_fn`` gets an InputContext
(``input_pipeline_id`` = rank, ``num_input_pipelines`` = ``num_replicas_in_sync`` = N) and
returns this rank's dataset, batched with the per-replica batch size, as TensorFlow specifies.

Ranks may hold different numbers of batches (FILE sharding over files of different sizes, a
``dataset_fn`` whose shards differ in length): every step the ranks agree whether any still has
data; a rank that has run out gets empty batches until all are done, and iteration ends on every
rank at the same step (see ``iterator``). When every rank's dataset has the same known number of
batches (DATA sharding of a dataset of known length, for instance), that agreement is skipped.

Building a distributed dataset is collective (one small allgather); do it on every rank.
Both return a ``tf.distribute.DistributedDataset``; ``iter`` gives a ``tf.distribute.
DistributedIterator`` (``get_next``, ``get_next_as_optional``, ``element_spec``) usable eagerly,
in ``for`` loops inside ``tf.function`` and by Keras ``fit`` / ``evaluate``, which take either the
plain ``tf.data.Dataset`` (Keras distributes it through the strategy) or the distributed dataset.
"""
from __future__ import annotations

import logging
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from . import autoshard
from .iterator import MPIDistributedIterator, Shared

_log = logging.getLogger("mpidist")
_no_autograph = tf.autograph.experimental.do_not_convert  # library code: never converted
INFINITE, UNKNOWN = int(tf.data.INFINITE_CARDINALITY), int(tf.data.UNKNOWN_CARDINALITY)


# Keras 3 takes a dataset in fit/evaluate/predict only if a class in its MRO is named
# "DistributedDataset" (or "DatasetV2") and comes from a module under "tensorflow.python."
# (keras/src/trainers/data_adapters/__init__.py, is_tf_dataset: it tests names so as not to import
# TensorFlow); tf.distribute.DistributedDataset itself is named DistributedDatasetInterface. This
# base carries the name Keras looks for, so model.fit(strategy.experimental_distribute_dataset(ds))
# works as with TensorFlow's own strategies. It adds nothing else; the module named is not real.
_KerasNamed: Any = type("DistributedDataset", (tf.distribute.DistributedDataset,),
                        {"__module__": "tensorflow.python.distribute.mpidist_keras_name",
                         "__doc__": "tf.distribute.DistributedDataset under the name Keras 3 recognizes."})


class MPIDistributedDataset(_KerasNamed):
    """This rank's part of a distributed dataset: per-replica batches, every rank in step."""

    def __init__(self, local: tf.data.Dataset, strategy: tf.distribute.Strategy, agree: bool,
                 cardinality: int, where: str, mode: str) -> None:
        self._local = local
        self._shared = Shared(strategy, local.element_spec, agree, where)
        self._cardinality = cardinality
        self._mode = mode

    @_no_autograph
    def __iter__(self) -> MPIDistributedIterator:
        if not (tf.executing_eagerly() or tf.inside_function()):
            raise RuntimeError(f"{self._shared.where}: iterate a distributed dataset eagerly or inside a "
                               f"tf.function")
        return MPIDistributedIterator(self._shared, iter(self._local))

    @property
    def element_spec(self) -> Any:
        """The spec of one per-replica batch (batch dimension None when ranks may run out early)."""
        return self._shared.element_spec

    @_no_autograph
    def reduce(self, initial_state: Any, reduce_func: Callable[[Any, Any], Any]) -> Any:
        """``reduce_func(state, batch)`` over the batches, in a while loop (a tf.function's ``for``)."""
        iterator = iter(self)
        first = iterator.get_next_as_optional()

        def body(optional: Any, state: Any) -> tuple[Any, Any]:
            state = reduce_func(state, optional.get_value())
            return iterator.get_next_as_optional(), state

        _, state = tf.while_loop(lambda optional, _: optional.has_value(), body, [first, initial_state],
                                 parallel_iterations=1)
        return state

    @property
    def cardinality(self) -> int:
        """Steps per epoch on every rank: the longest rank's; -1 infinite, -2 unknown."""
        return self._cardinality

    @property
    def local_dataset(self) -> tf.data.Dataset:
        """This rank's ``tf.data.Dataset`` of per-replica batches (without the step agreement)."""
        return self._local

    @property
    def auto_shard_mode(self) -> str:
        """How the input was split: FILE, DATA, OFF, HINT, "per-rank" (dataset_fn) or "single"."""
        return self._mode

    def __repr__(self) -> str:
        return (f"MPIDistributedDataset(mode={self._mode}, element_spec={self.element_spec}, "
                f"steps={self._cardinality}, agreement per step={self._shared.agree})")


def _check_options(options: Any, where: str) -> None:
    mode = getattr(options, "experimental_replication_mode", None)
    if mode is not None and getattr(mode, "name", str(mode)).upper().endswith("PER_REPLICA"):
        raise NotImplementedError(f"{where}: `options.experimental_replication_mode` PER_REPLICA is not "
                                  f"supported (one replica per rank: PER_WORKER is the same thing here)")


def _steps(counts: list[int]) -> tuple[int, bool]:
    """(steps every rank takes, whether the ranks must agree each step) from each rank's count."""
    if any(c == UNKNOWN for c in counts):
        return UNKNOWN, True
    if len(set(counts)) == 1:
        return counts[0], False
    return (INFINITE if INFINITE in counts else max(counts)), True


def distribute_dataset(strategy: tf.distribute.Strategy, dataset: Any, options: Any) -> MPIDistributedDataset:
    where = f"{type(strategy).__name__}.experimental_distribute_dataset"
    if isinstance(dataset, MPIDistributedDataset):
        return dataset
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(f"{where}: `dataset` must be a tf.data.Dataset, got {type(dataset).__name__}")
    _check_options(options, where)
    ext = strategy.extended
    engine, rank, size = ext.engine, ext.rank, ext.engine.size
    policy = autoshard.policy_of(dataset)
    if size == 1:  # as TensorFlow with one worker: only SHARD_HINT placeholders need filling in
        if policy == autoshard.Policy.HINT:
            dataset = autoshard.fill_hints(dataset)
        return MPIDistributedDataset(dataset, strategy, False, int(dataset.cardinality()), where, "single")
    autoshard.check_batched(dataset, where)
    files = autoshard.count_files(dataset) if policy in (autoshard.Policy.AUTO, autoshard.Policy.FILE) else None
    mine = [files.count if files else autoshard.NO_READER, int(dataset.cardinality())]
    everyone = np.asarray(engine.allgather(np.array([mine], dtype=np.int64), options=ext.default_call_options))
    mode, warning = autoshard.decide(policy, [int(c) for c in everyone[:, 0]], size, where)
    if warning and rank == 0:
        _log.warning("%s", warning)
    _log.debug("%s: auto_shard_policy=%s -> %s%s", where, policy.name, mode, f" ({files.detail})" if files else "")
    local = autoshard.shard(dataset, mode, rank, size)
    if mode == "DATA":  # one block of every global batch: each rank as many steps as there are batches
        steps, agree = _steps([int(c) for c in everyone[:, 1]])
    else:  # pieces of this rank's own batches: counts known only by reading
        steps, agree = (INFINITE, False) if set(everyone[:, 1]) == {INFINITE} else (UNKNOWN, True)
    return MPIDistributedDataset(local, strategy, agree, steps, where, mode)


def distribute_from_function(strategy: tf.distribute.Strategy, dataset_fn: Callable[[Any], Any],
                             options: Any) -> MPIDistributedDataset:
    where = f"{type(strategy).__name__}.distribute_datasets_from_function"
    if not callable(dataset_fn):
        raise TypeError(f"{where}: `dataset_fn` must be callable, got {type(dataset_fn).__name__}")
    _check_options(options, where)
    ext = strategy.extended
    engine, size = ext.engine, ext.engine.size
    context = tf.distribute.InputContext(num_input_pipelines=size, input_pipeline_id=ext.rank,
                                         num_replicas_in_sync=size)
    dataset = dataset_fn(context)
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(f"{where}: `dataset_fn` must return a tf.data.Dataset, got {type(dataset).__name__}")
    mine = int(dataset.cardinality())
    counts = [mine] if size == 1 else \
        [int(c) for c in engine.allgather(np.array([mine], dtype=np.int64), options=ext.default_call_options)]
    steps, agree = _steps(counts)
    return MPIDistributedDataset(dataset, strategy, agree, steps, where, "per-rank")


def distribute_values(strategy: tf.distribute.Strategy, value_fn: Callable[[Any], Any]) -> Any:
    where = f"{type(strategy).__name__}.experimental_distribute_values_from_function"
    if not callable(value_fn):
        raise TypeError(f"{where}: `value_fn` must be callable, got {type(value_fn).__name__}")
    ext = strategy.extended
    return value_fn(tf.distribute.experimental.ValueContext(ext.rank, ext.engine.size))
