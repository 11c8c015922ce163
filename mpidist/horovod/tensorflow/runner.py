"""Running a NumPy-level collective on tensors: eagerly, in a ``tf.function``, or in a v1 graph.

- Eagerly the tensors' NumPy values go to ``run`` at once.
- Inside a ``tf.function`` one stateful ``tf.numpy_function`` op calls ``run`` between two writes
  to mpidist's ordering resource (``mpidist.tensorflow.collectives.ordering_token``), so every
  rank issues its collectives in program order, as mpidist's own strategies do.
- In a ``tf.compat.v1`` graph (no automatic control dependencies) each collective op gets a
  control dependency on the graph's previous one, for the same reason.

Errors of the engine (mismatched shapes, dtypes, ops or roots on different ranks) come as
``tf.errors.FailedPreconditionError`` eagerly, as Horovod raises them; inside graphs TensorFlow
turns a Python ValueError into ``tf.errors.InvalidArgumentError``.
"""
from __future__ import annotations

import weakref
from typing import Callable, Sequence

import numpy as np
import tensorflow as tf

from ...errors import CollectiveMismatchError
from ...tensorflow.collectives import check_not_xla, ordering_token

_last_op: "weakref.WeakKeyDictionary[tf.Graph, tf.Operation]" = weakref.WeakKeyDictionary()

Run = Callable[[list[np.ndarray]], list[np.ndarray]]


def _eager(run: Run, arrays: list[np.ndarray], where: str) -> list[np.ndarray]:
    try:
        return run(arrays)
    except CollectiveMismatchError as e:
        raise tf.errors.FailedPreconditionError(None, None, str(e)) from e


def execute(name: str, run: Run, tensors: Sequence[tf.Tensor], out_dtypes: Sequence[tf.DType],
            shapes: Sequence[tf.TensorShape | None], where: str) -> list[tf.Tensor]:
    """``run(arrays) -> arrays`` on ``tensors``; outputs get ``out_dtypes`` and static ``shapes``."""
    check_not_xla(where)
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if tf.executing_eagerly():
        results = _eager(run, [t.numpy() for t in tensors], where)
        return [tf.convert_to_tensor(np.asarray(r), dtype=d) for r, d in zip(results, out_dtypes)]

    def func(*arrays: np.ndarray) -> list[np.ndarray]:
        results = run(list(arrays))
        return [np.asarray(r, dtype=d.as_numpy_dtype) for r, d in zip(results, out_dtypes)]

    graph = tf.compat.v1.get_default_graph()
    if getattr(graph, "outer_graph", None) is not None or isinstance(graph, tf.__internal__.FuncGraph):
        token = ordering_token()
        with tf.control_dependencies([tf.raw_ops.AssignVariableOp(resource=token, value=tf.constant(0))]):
            outs = tf.numpy_function(func, tensors, list(out_dtypes), stateful=True, name=name)
        with tf.control_dependencies(outs):
            tf.raw_ops.AssignVariableOp(resource=token, value=tf.constant(0))
    else:  # a v1 graph: chain the collectives in program order
        previous = _last_op.get(graph)
        with tf.control_dependencies([previous] if previous is not None else []):
            outs = tf.numpy_function(func, tensors, list(out_dtypes), stateful=True, name=name)
        _last_op[graph] = outs[0].op if outs else None
    outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    for out, shape in zip(outs, shapes):
        if shape is not None:
            out.set_shape(shape)
    return outs


def scope_name(name: str | None, default: str) -> str:
    """An op name TensorFlow accepts, from Horovod's ``name=`` (None: ``default``)."""
    if not name:
        return default
    cleaned = "".join(c if c.isalnum() or c in "_.-/" else "_" for c in name)
    return cleaned if cleaned[:1].isalnum() else "H" + cleaned
