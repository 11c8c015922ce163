"""The bridge from TensorFlow tensors to the engine: eager calls and ``tf.numpy_function``.

Every function takes a list of tensors and makes ONE engine call for all of them (the engine
packs them by ``bytes_per_pack``), in the order the program issues them:

- eagerly, the tensors' NumPy values go straight to the engine and the results come back as
  constants;
- inside a ``tf.function``, one stateful ``tf.numpy_function`` op makes the call when the graph
  runs. Its first input is one resource handle, the ordering token (one per process for the
  functions of an eager program, one per ``tf.compat.v1`` graph; TensorFlow's own collectives take
  an ordering token too); the function ignores its value. Automatic control
  dependencies treat an op that takes a resource as a write to it and serialize every use of a
  resource in program order, so all collectives run in that order, and so do the ``tf.cond`` /
  ``tf.while_loop`` ops that contain them (they capture the handle), which they would otherwise
  run concurrently (Keras' ``steps_per_execution`` loop runs a step and the next
  ``get_next_as_optional`` in two conds that share no other resource). So every rank issues its
  collectives in the same sequence. Nothing else orders them: a collective starts as soon as its
  inputs exist and the previous collective has finished (buckets.py overlaps backprop that way).
  (Taking the handle as an input replaces two ``AssignVariableOp`` writes around the op, which
  cost two more ops and their control edges per collective: docs/overlap.md.)
  ``numpy_function`` loses static shapes: they are restored with ``set_shape`` (and results are
  reshaped, since NumPy may turn a 0-d array into a 1-d one).

XLA cannot compile a ``numpy_function``: tracing a collective for XLA raises
:class:`XlaCollectiveError` at once, naming the function being compiled and what to do, instead
of TensorFlow's later "No registered 'PyFunc' OpKernel for XLA_CPU_JIT". A training step compiled
with ``jit_compile=True`` under an mpidist strategy is split around its gradients' all-reduce
instead (xla.py, xla_record.py).

bfloat16 tensors travel as float32 (MPI has no such type) and are cast back.

GPU tensors, where CuPy can run, take gpu_bridge.py instead: DLPack to CuPy, the engine's GPU
path (NCCL / MPI), DLPack back, inside a ``tf.py_function`` in graphs: no host copies.
"""
from __future__ import annotations

import re
import weakref
from typing import Any, Callable, Sequence

import numpy as np
import tensorflow as tf

from ..collectives.gpu.cupy_arrays import is_device_array
from ..collectives.ops import ReduceOp
from ..collectives.options import CallOptions  # the engine's one per-call options type
from ..errors import CollectiveMismatchError
from . import _tf_private, deadline_op, gpu_bridge, xla_record
from .xla_record import XlaCollectiveError

DEFAULT = CallOptions()


def check_not_xla(where: str) -> None:
    """Raise :class:`XlaCollectiveError` (why, naming the function, and what to do) while tracing for XLA."""
    if _tf_private.in_xla_context():
        raise XlaCollectiveError(None, None, xla_record.xla_message(where))


def in_v1_control_flow(op: Any) -> bool:
    """Whether graph op ``op`` is inside ``tf.compat.v1`` control flow (control flow v1), where it
    may run zero or many times in one ``Session.run``."""
    return _tf_private.in_v1_control_flow(op)


def wrap_session_callables(wrap: Callable[[Callable[..., Any]], Callable[..., Any]], *, reason: str) -> None:
    """Give every v1 Session's callables (``make_callable``, tf_keras's graph functions) the
    method ``wrap(original)`` in place of ``_make_callable_from_options`` (see _tf_private)."""
    _tf_private.wrap_session_callables(wrap, reason=reason)


def _to_wire(tensors: Sequence[Any]) -> tuple[list[tf.Tensor], list[tf.DType]]:
    """Tensors as the engine can take them; bfloat16 goes as float32."""
    wire, original = [], []
    for t in tensors:
        t = tf.convert_to_tensor(t)
        original.append(t.dtype)
        wire.append(tf.cast(t, tf.float32) if t.dtype == tf.bfloat16 else t)
    return wire, original


def _from_wire(results: Sequence[tf.Tensor], original: Sequence[tf.DType]) -> list[tf.Tensor]:
    return [tf.cast(r, d) if r.dtype != d else r for r, d in zip(results, original)]


def _call(name: str, run: Callable[[list[np.ndarray]], list[np.ndarray]], tensors: Sequence[Any],
          shapes: Callable[[tf.TensorShape], tf.TensorShape], where: str,
          options: CallOptions = DEFAULT) -> list[tf.Tensor]:
    """Run ``run`` (arrays -> arrays, same dtypes) on ``tensors``, eagerly or as one graph op."""
    if not tensors:
        return []
    check_not_xla(where)
    wire, original = _to_wire(tensors)
    # -- GPU hook (issue 8): GPU tensors go DLPack -> CuPy -> engine -> DLPack, no host copies --
    if gpu_bridge.wanted(wire, options.implementation, where):
        return _from_wire(gpu_bridge.call(name, run, wire, shapes), original)
    # -- end of GPU hook --
    if tf.executing_eagerly():
        results = run([t.numpy() for t in wire])
        return _from_wire([tf.convert_to_tensor(r) for r in results], original)

    def func(*arrays: np.ndarray) -> list[np.ndarray]:
        return run(list(arrays))

    timed = options.resolve().timeout is not None  # 0 (here or in rc) is no deadline, as everywhere
    if timed:  # a deadline must reach the program as tf.errors.DeadlineExceededError (deadline_op.py)
        func = deadline_op.reporting(func)

    def ordered(token: Any, *arrays: np.ndarray) -> Any:  # the token's value is not used
        return func(*arrays)

    outs = _tf_private.numpy_op(ordered, [ordering_token()] + wire,
                                [t.dtype for t in wire] + ([tf.bool] if timed else []), name)
    if timed:
        outs = deadline_op.raise_if_late(outs[-1], outs[:-1], name)
    for out, t in zip(outs, wire):
        out.set_shape(shapes(t.shape))
    return _from_wire(outs, original)


_eager_token: list[tf.Tensor] = []
_graph_tokens: weakref.WeakKeyDictionary[Any, tf.Tensor] = weakref.WeakKeyDictionary()


def ordering_token() -> tf.Tensor:
    """The resource every collective's graph ops write, so that they run in program order.

    One handle per outer context: eagerly (where ``tf.function`` graphs capture it) one per process;
    in a ``tf.compat.v1`` graph one per graph, made in that graph (a handle of one v1 graph cannot
    be used in another, nor in a ``tf.function`` traced after the graph is left)."""
    with tf.init_scope():  # the outermost context: eager, or the v1 graph a function is built in
        if tf.executing_eagerly():
            if not _eager_token:
                _eager_token.append(_new_token())
            return _eager_token[0]
        graph = tf.compat.v1.get_default_graph()
        token = _graph_tokens.get(graph)
        if token is None:
            token = _graph_tokens[graph] = _new_token()
        return token


def _new_token() -> tf.Tensor:
    return tf.raw_ops.VarHandleOp(dtype=tf.int32, shape=[], shared_name="mpidist_collective_order")


def _reshaped(results: Sequence[Any], arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    out = []
    for r, a in zip(results, arrays):
        r = r if is_device_array(r) else np.asarray(r)
        out.append(r if r.shape == a.shape else r.reshape(a.shape))
    return out


def _contiguous(array: Any) -> Any:
    return array.copy() if is_device_array(array) else np.ascontiguousarray(array)


def _one_or_list(arrays: list[np.ndarray]) -> Any:
    """A single array goes alone (the engine's cached fast path), several as one list."""
    return arrays[0] if len(arrays) == 1 else arrays


def allreduce(engine: Any, tensors: Sequence[Any], op: ReduceOp, options: CallOptions = DEFAULT,
              where: str = "all_reduce") -> list[tf.Tensor]:
    """Reduce every tensor over all ranks of ``engine`` with ``op``."""
    def run(arrays: list[np.ndarray]) -> list[np.ndarray]:
        result = engine.allreduce(_one_or_list(arrays), op, options=options)
        return _reshaped([result] if len(arrays) == 1 else result, arrays)

    return _call("mpidist_allreduce", run, tensors, lambda s: s, where, options)


def broadcast(engine: Any, tensors: Sequence[Any], root: int = 0, options: CallOptions = DEFAULT,
              where: str = "broadcast") -> list[tf.Tensor]:
    """Every rank gets ``root``'s tensors (same shapes and dtypes on every rank)."""
    def run(arrays: list[np.ndarray]) -> list[np.ndarray]:
        result = engine.broadcast(_one_or_list(arrays), root=root, options=options)
        return _reshaped([result] if len(arrays) == 1 else result, arrays)

    return _call("mpidist_broadcast", run, tensors, lambda s: s, where, options)


def allgather(engine: Any, tensors: Sequence[Any], axis: int = 0, options: CallOptions = DEFAULT,
              where: str = "all_gather") -> list[tf.Tensor]:
    """Concatenate every rank's tensors along ``axis`` in rank order; sizes along it may differ.

    ``axis`` must be valid (non-negative) for every tensor.
    """
    def run(arrays: list[np.ndarray]) -> list[np.ndarray]:
        moved = [np.moveaxis(a, axis, 0) if axis else a for a in arrays]
        try:
            result = engine.allgather(_one_or_list(moved), options=options)
        except CollectiveMismatchError as error:  # add TensorFlow's words for shapes that differ
            raise CollectiveMismatchError(_with_shape_phrase(str(error), arrays, axis)) from error
        result = [result] if len(arrays) == 1 else list(result)
        if axis:
            result = [_contiguous(np.moveaxis(r, 0, axis)) for r in result]  # CuPy arrays dispatch too
        return result

    def shape(s: tf.TensorShape) -> tf.TensorShape:
        if s.rank is None:
            return s
        dims = s.as_list()
        dims[axis] = None
        return tf.TensorShape(dims)

    return _call("mpidist_allgather", run, tensors, shape, where, options)


_GROUP = re.compile(r"^\s+ranks? [^:]+: allgather\(leaves=\[(.*?)\], ", re.M)
_LEAF = re.compile(r"\w+\(([^)]*)\)")


def _with_shape_phrase(message: str, arrays: Sequence[np.ndarray], axis: int) -> str:
    """``message`` (the agreement's rank-by-rank report of a gather whose ranks disagree) with
    TensorFlow's phrase for the first leaf whose shapes differ beyond ``axis``: "Shape mismatch",
    and "Dimension d in both shapes must be equal" or, for ranks that differ, "Shape must be rank
    a but is rank b" / "Ranks of all input tensors should match" (what TensorFlow's strategies say)."""
    groups = [[tuple(d.strip() for d in leaf.split(",") if d.strip()) for leaf in _LEAF.findall(found)]
              for found in _GROUP.findall(message)]
    for i in range(len(arrays)):
        shapes = sorted({g[i] for g in groups if len(g) > i})
        if len(shapes) < 2:
            continue
        ranks = sorted({len(s) for s in shapes})
        if len(ranks) > 1:
            return (f"{message}\nShape mismatch in leaf {i}: Ranks of all input tensors should match: Shape must "
                    f"be rank {ranks[0]} but is rank {ranks[-1]}")
        rest = [k for k in range(ranks[0]) if k != axis]  # the dimensions after axis, moved to 0
        for j in range(1, ranks[0]):
            sizes = sorted({s[j] for s in shapes})
            if len(sizes) > 1:
                return (f"{message}\nShape mismatch in leaf {i}: Dimension {rest[j - 1]} in both shapes must be "
                        f"equal, but are {sizes[0]} and {sizes[1]} (all_gather along axis {axis})")
    return message


def any_rank(engine: Any, flag: Any, options: CallOptions = DEFAULT, where: str = "any_rank",
             stop: bool = False) -> tf.Tensor:
    """Whether the bool ``flag`` is True on any rank (one allreduce). With ``stop``, inside a
    ``tf.function``, the op raises ``tf.errors.OutOfRangeError`` on every rank instead of giving
    False (a ``tf.numpy_function`` raising StopIteration does that)."""
    def run(arrays: list[np.ndarray]) -> list[np.ndarray]:
        result = np.asarray(engine.allreduce(arrays[0], ReduceOp.MAX, options=options)).reshape(1)
        if stop and not result[0]:
            raise StopIteration(f"{where}: no rank has data left (end of sequence on every rank)")
        return [result]

    wire = tf.reshape(tf.cast(flag, tf.int32), [1])
    return tf.greater(_call("mpidist_any_rank", run, [wire], lambda s: s, where)[0][0], 0)
