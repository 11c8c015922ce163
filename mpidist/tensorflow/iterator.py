"""The iterator of an mpidist distributed dataset: every rank steps together, to the same end.

When the ranks' numbers of batches may differ, each step agrees with the other ranks in one tiny
allreduce (MAX of "I have data"), as TensorFlow's MWMS does for partial batches:

- some rank has data: every rank steps; a rank whose data has run out gets an empty batch (0 rows,
  the right dtypes, inner dimensions from the element spec, unknown ones 0), so the collectives
  inside the step still match and sums over rows (losses, metrics) count only real rows;
- no rank has data: ``get_next`` raises ``tf.errors.OutOfRangeError`` (``StopIteration`` from
  ``next``; inside a ``tf.function`` the agreement op itself raises it) and
  ``get_next_as_optional().has_value()`` is False, on every rank at the same step.

The agreement is skipped (``agree=False``) when every rank's dataset has the same known (or
infinite) number of batches: the steps then match by construction, batches keep their static
shapes, and the iterator is a plain wrapper of the ``tf.data`` one. With it, the batch dimension
of ``element_spec`` is None (as in TensorFlow).

Works eagerly and inside ``tf.function`` (the allreduce is then a stateful op, kept in program
order with the step's other collectives). The iterator is a composite tensor (its component: the
``tf.data`` iterator), so passing it into a ``tf.function``, as Keras does every step, traces once.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from ..collectives.ops import ReduceOp
from . import _tf_private, collectives

Optional = tf.experimental.Optional
_no_autograph = tf.autograph.experimental.do_not_convert  # library code: never converted


def empty_value(spec: Any) -> Any:
    """A value of ``spec`` (a nest) with 0 rows: what a rank without data steps with."""
    def empty(s: Any) -> Any:
        shape = s.shape
        if shape.rank is None:
            raise ValueError(f"distributed dataset: cannot make an empty batch of {s} (unknown rank); give "
                             f"the dataset's elements a known rank")
        dims = [0] + [d or 0 for d in shape.as_list()[1:]] if shape.rank else []
        if isinstance(s, tf.SparseTensorSpec):
            return tf.SparseTensor(tf.zeros((0, len(dims)), tf.int64), tf.zeros((0,), s.dtype),
                                   tf.constant(dims, tf.int64))
        if isinstance(s, tf.RaggedTensorSpec):
            value = tf.zeros([0] + dims[1 + s.ragged_rank:], s.dtype)
            for _ in range(s.ragged_rank):
                value = tf.RaggedTensor.from_row_splits(value, tf.zeros((1,), s.row_splits_dtype), validate=False)
            return value
        if isinstance(s, tf.TensorSpec):
            return tf.zeros(dims, s.dtype)
        raise TypeError(f"distributed dataset: cannot make an empty batch of {s}; elements must be "
                        f"tensors, ragged or sparse tensors")
    return tf.nest.map_structure(empty, spec)


def relax_batch(spec: Any) -> Any:
    """``spec`` (a nest of specs) with an unknown batch dimension."""
    def relax(s: Any) -> Any:
        shape = getattr(s, "shape", None)
        if shape is None or shape.rank is None or shape.rank == 0:
            return s
        dims = [None] + shape.as_list()[1:]
        if isinstance(s, tf.RaggedTensorSpec):
            return tf.RaggedTensorSpec(dims, s.dtype, s.ragged_rank, s.row_splits_dtype)
        if isinstance(s, tf.SparseTensorSpec):
            return tf.SparseTensorSpec(dims, s.dtype)
        if isinstance(s, tf.TensorSpec):
            return tf.TensorSpec(dims, s.dtype)
        return s
    return tf.nest.map_structure(relax, spec)


class Shared:
    """What every iterator of one distributed dataset shares (not part of the traced value)."""

    def __init__(self, strategy: Any, local_spec: Any, agree: bool, where: str) -> None:
        self.strategy = strategy
        self.engine = strategy.extended.engine  # pylint: disable=protected-access
        self.call = strategy.extended.default_call_options  # pylint: disable=protected-access
        self.local_spec = local_spec
        self.agree = agree
        self.element_spec = relax_batch(local_spec) if agree else local_spec
        self.where = where
        self.what = f"{where} (does any rank still have data?)"


class MPIDistributedIterator(tf.distribute.DistributedIterator, _tf_private.CompositeTensor):
    """Iterator over this rank's per-replica batches; every rank ends at the same step."""

    def __init__(self, shared: Shared, iterator: Any) -> None:
        self._shared = shared
        self._iterator = iterator  # this rank's tf.data iterator
        self._exhausted = False  # eagerly: this rank's data has run out
        self._empty: Any = None  # eagerly: the empty batch, made once

    @property
    def local_iterator(self) -> Any:
        """This rank's ``tf.data`` iterator (the composite tensor's one component)."""
        return self._iterator

    def __iter__(self) -> MPIDistributedIterator:
        return self

    @_no_autograph
    def __next__(self) -> Any:
        try:
            return self.get_next()
        except tf.errors.OutOfRangeError:
            raise StopIteration from None

    @property
    def element_spec(self) -> Any:
        return self._shared.element_spec

    @_no_autograph
    def get_next(self, name: Any = None) -> Any:
        """This rank's next batch (empty when only other ranks still have data); OutOfRangeError on
        every rank when none has."""
        shared = self._shared
        if not shared.agree:
            return self._iterator.get_next()
        if tf.executing_eagerly():
            value = self._eager_step()
            if value is None:
                raise tf.errors.OutOfRangeError(None, None, f"{shared.where}: end of sequence on every rank")
            return value
        optional = self._iterator.get_next_as_optional()
        mine = optional.has_value()
        # raises OutOfRangeError on every rank when no rank has data; the batch waits for it
        with tf.control_dependencies([collectives.any_rank(shared.engine, mine, shared.call, shared.what,
                                                           stop=True)]):
            return tf.cond(mine, optional.get_value, lambda: empty_value(shared.local_spec))

    @_no_autograph
    def get_next_as_optional(self) -> tf.experimental.Optional:
        """An Optional whose ``has_value()`` is the same on every rank: some rank still has data."""
        shared = self._shared
        if not shared.agree:
            return self._iterator.get_next_as_optional()
        if tf.executing_eagerly():
            value = self._eager_step()
            return Optional.empty(shared.element_spec) if value is None else Optional.from_value(value)
        optional = self._iterator.get_next_as_optional()
        mine = optional.has_value()
        anyone = collectives.any_rank(shared.engine, mine, shared.call, shared.what)
        return tf.cond(mine, lambda: Optional.from_value(optional.get_value()), lambda: tf.cond(
            anyone, lambda: Optional.from_value(empty_value(shared.local_spec)),
            lambda: Optional.empty(shared.element_spec)))

    def _eager_step(self) -> Any:
        """This rank's batch, an empty one, or None when no rank has data (one engine call)."""
        shared = self._shared
        value = None
        if not self._exhausted:
            try:
                value = self._iterator.get_next()
            except tf.errors.OutOfRangeError:
                self._exhausted = True
        flag = np.array([value is not None], dtype=np.int32)
        if not np.asarray(shared.engine.allreduce(flag, ReduceOp.MAX, options=shared.call)).reshape(1)[0]:
            return None
        if value is None:
            if self._empty is None:
                self._empty = empty_value(shared.local_spec)
            value = self._empty
        return value

    @property
    def _type_spec(self) -> MPIIteratorSpec:
        return MPIIteratorSpec(self._shared)

    def __repr__(self) -> str:
        return f"MPIDistributedIterator(element_spec={self.element_spec}, agree={self._shared.agree})"


class MPIIteratorSpec(tf.TypeSpec):
    """The type of an MPIDistributedIterator: its dataset's specs and strategy (compared by id)."""

    __slots__ = ("_shared",)

    def __init__(self, shared: Shared) -> None:
        self._shared = shared

    @property
    def value_type(self) -> type:
        return MPIDistributedIterator

    def _serialize(self) -> tuple:
        s = self._shared
        return (s.local_spec, id(s.strategy), s.agree)

    @classmethod
    def _deserialize(cls, serialization: Any) -> MPIIteratorSpec:
        raise ValueError("MPIIteratorSpec cannot be deserialized (it refers to a live strategy)")

    @property
    def _component_specs(self) -> Any:
        return tf.data.IteratorSpec(self._shared.local_spec)

    def _to_components(self, value: MPIDistributedIterator) -> Any:
        return value.local_iterator

    def _from_components(self, components: Any) -> MPIDistributedIterator:
        return MPIDistributedIterator(self._shared, components)

    def _without_tensor_names(self) -> MPIIteratorSpec:
        return self  # dataset element specs carry no tensor names

    def is_subtype_of(self, other: Any) -> bool:
        return type(other) is type(self) and self == other  # TypeSpec equality: the same _serialize()

    def most_specific_common_supertype(self, others: Any) -> Any:
        return self if all(self.is_subtype_of(o) for o in others) else None
