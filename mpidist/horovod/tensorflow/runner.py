"""Running a NumPy-level collective on tensors: eagerly, in a ``tf.function``, or in a v1 graph.

- Eagerly the tensors' NumPy values go to ``run`` at once.
- Inside a ``tf.function`` one stateful ``tf.numpy_function`` op calls ``run`` between two writes
  to mpidist's ordering resource (``mpidist.tensorflow.collectives.ordering_token``), so every
  rank issues its collectives in program order, as mpidist's own strategies do.
- In a ``tf.compat.v1`` graph (no automatic control dependencies) the collectives a
  ``Session.run`` needs run in creation order, on a thread beside the step (sessions.py).

Errors are errors on every rank, of Horovod's types, in every mode:

- ``run`` and everything a collective does before it (``guard``) run under the engine's guard
  (``Engine.guard``): an error on one rank before its engine call still takes part in that
  collective's agreement exchange, so every rank raises for the same collective and the next one
  matches (collectives/agreement.py).
- Mismatches between ranks (shapes, dtypes, ops, roots; a collective refused while a rank has
  joined) are ``tf.errors.FailedPreconditionError``, as Horovod's coordinator raises them.
  Eagerly that is the exception raised. A Python function inside a graph cannot raise it:
  TensorFlow turns every exception of a ``numpy_function`` into InvalidArgumentError (ValueError,
  TypeError), UnimplementedError (NotImplementedError) or UnknownError. So the op returns two more
  outputs, a status and the message, and a ``tf.cond`` after it raises FailedPreconditionError when
  the status says so, by reading the file ``/dev/null/<message>`` (``/dev/null`` is no directory:
  TensorFlow's "Not a directory" is a FailedPreconditionError, and its message carries ours, with
  "/" written as U+2215).
  ``tf.errors`` raised inside ``run`` keep their type that way or by the mapping above.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import tensorflow as tf

from ...errors import CollectiveMismatchError
from ...tensorflow.collectives import check_not_xla, ordering_token
from . import sessions

Run = Callable[[list[np.ndarray]], list[np.ndarray]]


_FAILED_PRECONDITION = 1  # the status output of a graph op whose collective raised FailedPreconditionError
_MAX_MESSAGE = 3000  # bytes of the message in the path read to raise it (PATH_MAX is 4096)


def horovod_error(error: BaseException) -> BaseException:
    """The error Horovod raises for ``error`` of the engine: FailedPreconditionError for a
    mismatch between ranks (``error`` itself otherwise)."""
    if isinstance(error, CollectiveMismatchError):
        converted = tf.errors.FailedPreconditionError(None, None, str(error))
        converted.__cause__ = error
        return converted
    return error


@contextlib.contextmanager
def guard(process_set: Any, where: str) -> Iterator[None]:
    """Around a Horovod collective's own code (argument checks, conversions) up to its engine call:
    an error there on one rank is an error on every rank (``Engine.guard``). Ranks outside the
    process set, or before ``hvd.init()``, raise at once (they have no engine to tell)."""
    engine = process_set.require_engine(where)
    with engine.guard(where):
        yield


def _eager(engine: Any, run: Run, arrays: list[np.ndarray], where: str) -> list[np.ndarray]:
    try:
        with engine.guard(where):
            return run(arrays)
    except CollectiveMismatchError as e:
        raise horovod_error(e) from e


def _in_graph(engine: Any, run: Run, arrays: list[np.ndarray], where: str, out_dtypes: Sequence[tf.DType],
              shapes: Sequence[tf.TensorShape | None]) -> list[Any]:
    """The body of the graph op: ``run``'s results, then the status and message outputs."""
    try:
        with engine.guard(where):
            results = run(arrays)
    except Exception as e:  # each kind becomes the TensorFlow error Horovod raises
        error = horovod_error(e)
        code = getattr(error, "error_code", None)
        if code == tf.errors.FAILED_PRECONDITION:
            message = _as_file_name(str(getattr(error, "message", error)))
            return [_placeholder(s, d) for s, d in zip(shapes, out_dtypes)] + [np.int32(_FAILED_PRECONDITION), message]
        if code == tf.errors.INVALID_ARGUMENT:  # numpy_function raises InvalidArgumentError for these
            raise ValueError(str(getattr(error, "message", error))) from e
        if code == tf.errors.UNIMPLEMENTED:
            raise NotImplementedError(str(getattr(error, "message", error))) from e
        raise
    return [np.asarray(r, dtype=d.as_numpy_dtype) for r, d in zip(results, out_dtypes)] + [np.int32(0), b""]


def _as_file_name(message: str) -> bytes:
    """``message`` as one path component under /dev/null: no NUL, and "/" as U+2215 (a "." or ".."
    component would make TensorFlow clean the path into another file)."""
    return message.replace("\0", " ").replace("/", "\u2215").encode()[:_MAX_MESSAGE]


def _placeholder(shape: Any, dtype: tf.DType) -> np.ndarray:
    """Zeros standing in for an output that is never used (the op's check raises first)."""
    shape = tf.TensorShape(shape)
    dims = [0] if shape.rank is None else [0 if d is None else d for d in shape.as_list()]
    return np.zeros(dims, dtype=dtype.as_numpy_dtype)


def _raise_failed_precondition(message: tf.Tensor) -> tf.Tensor:
    """An op that raises FailedPreconditionError carrying ``message`` (see the module docstring)."""
    return tf.strings.length(tf.io.read_file(tf.strings.join(["/dev/null/", message])))


def execute(name: str, run: Run, tensors: Sequence[tf.Tensor], out_dtypes: Sequence[tf.DType],
            shapes: Sequence[tf.TensorShape | None], where: str, engine: Any) -> list[tf.Tensor]:
    """``run(arrays) -> arrays`` on ``tensors``; outputs get ``out_dtypes`` and static ``shapes``.
    ``engine``: the process set's engine, whose guard makes errors errors on every rank."""
    check_not_xla(where)
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if tf.executing_eagerly():
        results = _eager(engine, run, [t.numpy() for t in tensors], where)
        return [tf.convert_to_tensor(np.asarray(r), dtype=d) for r, d in zip(results, out_dtypes)]

    def func(*arrays: np.ndarray) -> list[Any]:
        return _in_graph(engine, run, list(arrays), where, out_dtypes, shapes)

    types = list(out_dtypes) + [tf.int32, tf.string]
    graph = tf.compat.v1.get_default_graph()
    if getattr(graph, "outer_graph", None) is not None or isinstance(graph, tf.__internal__.FuncGraph):
        token = ordering_token()
        with tf.control_dependencies([tf.raw_ops.AssignVariableOp(resource=token, value=tf.constant(0))]):
            outs = _checked(list(tf.numpy_function(func, tensors, types, stateful=True, name=name)))
        # the next collective waits for this one's check: after an error no rank starts it (every rank
        # raised in this one, and TensorFlow abandons the step before the next op runs)
        with tf.control_dependencies(outs):
            tf.raw_ops.AssignVariableOp(resource=token, value=tf.constant(0))
    else:  # a v1 graph: ordered per Session.run (sessions.py)
        raw, reraise = sessions.collective(name, func, tensors, types, where)
        outs = _checked(raw, reraise)
    for out, shape in zip(outs, shapes):
        if shape is not None:
            out.set_shape(shape)
    return outs


def _checked(outs: list[tf.Tensor], reraise: Callable[[np.ndarray], np.int32] | None = None) -> list[tf.Tensor]:
    """The op's results, after a check that raises FailedPreconditionError when its status says so
    (or, in a v1 graph, ``reraise``'s error: sessions.RAISED).

    (In a v1 graph TensorFlow may log "Operation ... was changed by setting attribute after it was
    run by a session" for these identities when a later custom_gradient is built: the change has no
    effect. Passing the results through the cond instead avoids the message, but TensorFlow then
    prunes the failing branch's file read, and nothing raises.)"""
    status, message = outs[-2], outs[-1]

    def failed() -> tf.Tensor:  # reraise's op raises first where it has the error
        first = [] if reraise is None else [tf.numpy_function(reraise, [status], tf.int32, stateful=True)]
        with tf.control_dependencies(first):
            return _raise_failed_precondition(message)
    if reraise is None:  # a tf.function
        check = tf.cond(tf.equal(status, 0), lambda: tf.constant(0), failed)
    else:  # a v1 graph: Switch/Merge, not a functional cond (sessions.select)
        check = sessions.select(tf.equal(status, 0), [status], lambda: [failed()])[0]
    with tf.control_dependencies([check]):
        return [tf.identity(o) for o in outs[:-2]]


def scope_name(name: str | None, default: str) -> str:
    """An op name TensorFlow accepts, from Horovod's ``name=`` (None: ``default``)."""
    if not name:
        return default
    cleaned = "".join(c if c.isalnum() or c in "_.-/" else "_" for c in name)
    return cleaned if cleaned[:1].isalnum() else "H" + cleaned
