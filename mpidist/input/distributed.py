"""DistributedDataset and DistributedIterator: per-replica batches, every rank in step.

A source yields either global batches (``split=True``: this rank keeps its block of axis 0, cut as
``numpy.array_split`` cuts, so a partial last batch is shared consistently and some ranks may get
an empty block) or this rank's own batches (``split=False``: from ``distribute_datasets_from_function``).

Every step the ranks agree, with one tiny allreduce, whether any rank still has data. While any
does, all ranks step; a rank whose source is exhausted gets an empty batch (0 rows, the right
dtypes and trailing shapes), so collectives inside the step still match and ``reduce(..., axis=0)``
weighs rows correctly. When no rank has data, iteration ends on every rank at the same step.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import numpy as np
from mpi4py import MPI

from ..collectives import Engine, nest
from ..collectives.reduce_scatter import block_rows
from ..errors import MpidistError


class OutOfRangeError(MpidistError, IndexError):
    """``get_next`` past the end of a distributed dataset (on every rank at the same step)."""


@dataclass(frozen=True)
class ArraySpec:
    """Shape (batch dimension None) and dtype of one component of an element."""
    shape: tuple
    dtype: np.dtype


class Optional:
    """What ``get_next_as_optional`` returns: the same ``has_value()`` on every rank."""

    def __init__(self, value: Any) -> None:
        self._value = value

    def has_value(self) -> bool:
        return self._value is not None

    def get_value(self) -> Any:
        if self._value is None:
            raise OutOfRangeError("Optional.get_value: the distributed dataset is exhausted on every rank")
        return self._value


def _arrays(element: Any, where: str) -> tuple[list[np.ndarray], Any]:
    leaves, tree = nest.flatten(element)
    arrays = [np.asarray(leaf) for leaf in leaves]
    if any(a.ndim == 0 for a in arrays):
        raise ValueError(f"{where}: every component of a batch needs a batch dimension (axis 0); got a scalar")
    return arrays, tree


class DistributedDataset:
    def __init__(self, engine: Engine, make_source: Callable[[], Iterable[Any]], split: bool, where: str) -> None:
        self._engine, self._make_source, self._split, self._where = engine, make_source, split, where

    @property
    def engine(self) -> Engine:
        """The engine the iterators agree on batches with."""
        return self._engine

    @property
    def split(self) -> bool:
        """Whether each element is a global batch that every rank takes its block of."""
        return self._split

    @property
    def where(self) -> str:
        """The API call that made this dataset (for error messages)."""
        return self._where

    def make_source(self) -> Iterable[Any]:
        """A fresh iterable of this rank's elements."""
        return self._make_source()

    def __iter__(self) -> DistributedIterator:
        return DistributedIterator(self)

    @property
    def element_spec(self) -> Any:
        """Nest of ArraySpec of one per-replica batch, from the source's first element (local, no MPI)."""
        first = next(iter(self._make_source()), None)
        if first is None:
            return None
        arrays, tree = _arrays(first, self._where)
        return nest.unflatten(tree, [ArraySpec((None,) + a.shape[1:], a.dtype) for a in arrays])


class DistributedIterator:
    def __init__(self, dataset: DistributedDataset) -> None:
        self._ds = dataset
        self._source: Iterator[Any] = iter(dataset.make_source())
        self._template: tuple[list[tuple[np.dtype, tuple]], Any] | None = None
        self._exhausted = False

    def __iter__(self) -> DistributedIterator:
        return self

    def __next__(self) -> Any:
        value = self._local_next()
        engine = self._ds.engine
        flags = engine.allreduce(np.array([value is not None, value is None and self._template is None],
                                          dtype=np.uint8), "max")
        if flags[1]:
            self._share_template(value)
        if not flags[0]:
            raise StopIteration
        return value if value is not None else self._empty()

    def get_next(self) -> Any:
        try:
            return next(self)
        except StopIteration:
            raise OutOfRangeError(f"{self._ds.where}: get_next: end of sequence") from None

    def get_next_as_optional(self) -> Optional:
        try:
            return Optional(next(self))
        except StopIteration:
            return Optional(None)

    @property
    def element_spec(self) -> Any:
        return self._ds.element_spec

    # -- internals -------------------------------------------------------------------------------
    def _local_next(self) -> Any:
        if self._exhausted:
            return None
        try:
            element = next(self._source)
        except StopIteration:
            self._exhausted = True
            return None
        arrays, tree = _arrays(element, self._ds.where)
        if self._ds.split:
            arrays = self._my_block(arrays)
        self._template = ([(a.dtype, a.shape[1:]) for a in arrays], tree)
        return nest.unflatten(tree, arrays)

    def _my_block(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        lengths = {a.shape[0] for a in arrays}
        if len(lengths) != 1:
            raise ValueError(f"{self._ds.where}: the components of a global batch differ in batch size: "
                             f"{sorted(lengths)}")
        engine = self._ds.engine
        rows = block_rows(lengths.pop(), engine.size)
        start = sum(rows[:engine.rank])
        return [a[start:start + rows[engine.rank]] for a in arrays]

    def _share_template(self, value: Any) -> None:
        """Some rank has never had an element: the lowest rank that has one sends its layout."""
        comm = self._ds.engine.topology.comm
        have = self._template is not None
        root = comm.allreduce(comm.Get_rank() if have else comm.Get_size(), op=MPI.MIN)
        if root < comm.Get_size():
            template = comm.bcast(self._template if comm.Get_rank() == root else None, root=root)
            if self._template is None:
                self._template = template

    def _empty(self) -> Any:
        if self._template is None:  # only called once a rank shared its template
            raise RuntimeError("DistributedIterator: no rank has produced a batch yet, so the shape of an "
                               "empty one is unknown")
        specs, tree = self._template
        return nest.unflatten(tree, [np.empty((0,) + tuple(shape), dtype=dtype) for dtype, shape in specs])
