"""CrossDeviceOps on TensorFlow values: what the public CrossDeviceOps classes (mpidist/frameworks.py)
hand TensorFlow values to when the program uses TensorFlow.

``NcclAllReduce().reduce(...)``, ``batch_reduce(...)`` and ``broadcast(...)`` (every CrossDeviceOps
class) take ``tf.Tensor``, ``tf.Variable``, TensorFlow's or mpidist's distributed values
(PerReplica, Mirrored, distributed variables: this rank's one component) and nests of them, and
return ``tf.Tensor`` results in the same nest. A nest that mixes NumPy arrays in is converted
whole. Eagerly and inside a ``tf.function`` alike, the whole nest (or the whole batch) is ONE call
of the TensorFlow bridge (collectives.py: eager arrays, or one ordered ``tf.numpy_function`` op in
a graph; GPU tensors through gpu_bridge.py) whose engine is an :class:`OpsEngine`: the ops object's
own algorithm, packing and root run on the arrays.

:class:`OpsEngine` is also what a strategy built with ``cross_device_ops=`` reduces and broadcasts
on (``MPIExtended.use_cross_device_ops``).
"""
from __future__ import annotations

from typing import Any, Sequence

import tensorflow as tf

from ..cross_device import ops as ops_lib
from ..cross_device.reduce_op import ReduceOp
from . import collectives
from .collectives import CallOptions

_no_autograph = tf.autograph.experimental.do_not_convert  # library code: never converted


class OpsEngine:
    """An engine-shaped view of a CrossDeviceOps: ``allreduce`` runs its reduction (algorithm,
    packing, root), ``broadcast`` its broadcast; other calls go to its engine. ``options`` (the
    per-call options, CallOptions) a caller passes are merged over the ones it was built with."""

    def __init__(self, cross_device_ops: Any, options: CallOptions | None = None) -> None:
        self.ops = cross_device_ops
        self.options = options if options is not None else CallOptions()

    @property
    def rank(self) -> int:
        return self.ops.engine.rank

    @property
    def size(self) -> int:
        return self.ops.engine.size

    def allreduce(self, value: Any, op: Any = "sum", *, options: CallOptions | None = None) -> Any:
        return self.ops.reduce_arrays(op, value, self.options.merged(options))

    def broadcast(self, value: Any, root: int = 0, *, options: CallOptions | None = None) -> Any:
        return self.ops.broadcast_arrays(value, root, self.options.merged(options))

    def allgather(self, value: Any, *, options: CallOptions | None = None) -> Any:
        return self.ops.engine.allgather(value, options=options)

    def __repr__(self) -> str:
        return f"OpsEngine({self.ops!r})"


def _is_tf_leaf(value: Any) -> bool:
    value = ops_lib.local_value(value)  # mpidist's DistributedValues: its component
    return isinstance(value, (tf.Tensor, tf.Variable, tf.distribute.DistributedValues, tf.IndexedSlices))


@_no_autograph
def handles(value: Any) -> bool:
    """Whether ``value`` (a nest) holds any TensorFlow value."""
    return any(_is_tf_leaf(leaf) for leaf in tf.nest.flatten(value))


def _tensor(leaf: Any, index: int, where: str) -> tf.Tensor:
    value = ops_lib.local_value(leaf)
    if isinstance(value, tf.distribute.DistributedValues):
        components = value.values
        if len(components) != 1:
            raise ValueError(f"{where}: leaf {index} of the value is a {type(value).__name__} with "
                             f"{len(components)} components; mpidist runs one replica per rank, so a "
                             f"distributed value must have exactly one (this rank's)")
        value = components[0]
    if isinstance(value, tf.IndexedSlices):
        raise NotImplementedError(f"{where}: leaf {index} of the value is a tf.IndexedSlices, which "
                                  f"mpidist's CrossDeviceOps do not reduce; pass tf.convert_to_tensor(it)")
    return tf.convert_to_tensor(value)


def _flat(values: Sequence[Any], where: str) -> tuple[list[list[Any]], list[tf.Tensor]]:
    nests = [tf.nest.flatten(v) for v in values]
    tensors = [_tensor(leaf, i, where) for i, leaf in enumerate(leaf for nest in nests for leaf in nest)]
    return nests, tensors


def _bridge_options(ops: Any, options: CallOptions | None) -> CallOptions:
    """What the bridge needs itself: the implementation for GPU tensors (gpu_bridge.py)."""
    return CallOptions(implementation=ops.implementation_for(options))


@_no_autograph
def batch_reduce(ops: Any, op: ReduceOp, values: Sequence[Any], options: CallOptions,
                 where: str) -> list[Any]:
    """Every value of ``values`` (each a nest) reduced over all ranks, in ONE bridge call."""
    nests, tensors = _flat(values, where)
    reduced = collectives.allreduce(OpsEngine(ops, options), tensors, op,
                                    _bridge_options(ops, options), where)
    out, start = [], 0
    for value, nest in zip(values, nests):
        out.append(tf.nest.pack_sequence_as(value, reduced[start:start + len(nest)]))
        start += len(nest)
    return out


@_no_autograph
def reduce(ops: Any, op: ReduceOp, value: Any, options: CallOptions, where: str) -> Any:
    """``value`` (a nest) reduced over all ranks."""
    return batch_reduce(ops, op, [value], options, where)[0]


@_no_autograph
def broadcast(ops: Any, value: Any, root: int, where: str) -> Any:
    """``root``'s ``value`` (a nest) on every rank, in one bridge call."""
    nests, tensors = _flat([value], where)
    out = collectives.broadcast(OpsEngine(ops), tensors, root, _bridge_options(ops, None), where)
    return tf.nest.pack_sequence_as(value, out)


def not_converted(cls: type) -> None:
    """Mark ``cls``'s ``reduce``, ``batch_reduce`` and ``broadcast`` as library code that AutoGraph must
    not convert when a ``tf.function`` calls them (it would convert down into the engine and mpi4py,
    warning on every trace). The public classes, which cannot import TensorFlow when they are
    defined, ask for it when they first meet TensorFlow."""
    for name in ("reduce", "batch_reduce", "broadcast"):
        method = cls.__dict__.get(name)
        if method is not None and not hasattr(method, "autograph_info__"):  # what do_not_convert leaves
            setattr(cls, name, tf.autograph.experimental.do_not_convert(method))
