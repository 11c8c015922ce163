"""What the strategies' dataset methods do (``Strategy.experimental_distribute_dataset`` and the others
call these; ``strategy`` is any object with ``extended.engine`` and ``num_replicas_in_sync``)."""
from __future__ import annotations

import logging
from typing import Any, Callable

from .context import InputContext, InputOptions
from .distributed import DistributedDataset
from .numpy_dataset import NumpyDataset

_log = logging.getLogger("mpidist")


def _check_options(options: Any, where: str) -> None:
    if options is not None and not isinstance(options, InputOptions) and \
            not hasattr(options, "experimental_replication_mode"):
        raise TypeError(f"{where}: `options` must be an InputOptions or None, got {type(options).__name__}")


def distribute_dataset(strategy: Any, dataset: Any, options: Any = None) -> DistributedDataset:
    """Each rank iterates ``dataset``'s global batches and keeps its block of each one."""
    where = f"{type(strategy).__name__}.experimental_distribute_dataset"
    _check_options(options, where)
    if isinstance(dataset, NumpyDataset):
        raise ValueError(f"{where}: `dataset` holds examples, not batches: call .batch(global_batch_size) first")
    if hasattr(dataset, "element_spec") and type(dataset).__module__.startswith("tensorflow"):
        raise TypeError(f"{where}: a tf.data.Dataset needs mpidist's TensorFlow strategies: import tensorflow "
                        f"before building the strategy (or set mpidist.rc.framework = 'tensorflow')")
    try:
        iter(dataset)
    except TypeError:
        raise TypeError(f"{where}: `dataset` must be an iterable of global batches, got "
                        f"{type(dataset).__name__}") from None
    if iter(dataset) is dataset:
        _log.debug("%s: `dataset` is an iterator: it can be iterated once", where)
    return DistributedDataset(strategy.extended.engine, lambda: iter(dataset), split=True, where=where)


def distribute_datasets_from_function(strategy: Any, dataset_fn: Callable[[InputContext], Any],
                                      options: Any = None) -> DistributedDataset:
    """``dataset_fn(InputContext)`` builds this rank's input; its batches are per-replica batches."""
    where = f"{type(strategy).__name__}.distribute_datasets_from_function"
    _check_options(options, where)
    if not callable(dataset_fn):
        raise TypeError(f"{where}: `dataset_fn` must be callable, got {type(dataset_fn).__name__}")
    engine = strategy.extended.engine
    dataset = dataset_fn(InputContext(engine.size, engine.rank, engine.size))
    return DistributedDataset(engine, lambda: iter(dataset), split=False, where=where)


def make_numpy_dataset(strategy: Any, numpy_input: Any) -> NumpyDataset:
    return NumpyDataset(numpy_input)
