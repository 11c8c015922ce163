"""Exception types raised by mpidist.

Nothing internal is imported here, and TensorFlow is never imported by this module. When the
program has imported TensorFlow, each error that has a TensorFlow counterpart is built as a
subclass of both (one mechanism, :meth:`MpidistError.__new__`), so TensorFlow programs catch it
with the ``except`` clause they already have:

- ``CollectiveMismatchError`` is also a ``tf.errors.InvalidArgumentError``;
- ``DeadlineExceededError`` is also a ``tf.errors.DeadlineExceededError``;
- ``RanksLostError`` is also a ``tf.errors.UnavailableError``.

``except mpidist.errors.X`` catches it either way.
"""
from __future__ import annotations

import sys
from typing import Any

_TF_ERRORS = "tensorflow.python.framework.errors_impl"
_with_tf: dict[tuple[type, type], type] = {}  # (mpidist class, tf.errors class) -> the class of both


def _tf_error_class(name: str | None) -> type | None:
    """TensorFlow's ``tf.errors.<name>`` when TensorFlow is imported, else None."""
    if name is None:
        return None
    return getattr(sys.modules.get(_TF_ERRORS), name, None)


def _tf_flavoured(cls: type, tf_class: type) -> type:
    """``cls`` that is also ``tf_class`` (built once per pair)."""
    made = _with_tf.get((cls, tf_class))
    if made is None:
        def __init__(self: Any, message: Any = "", *args: Any) -> None:
            tf_class.__init__(self, None, None, str(message))
            self.args = (message,) + args

        made = type(cls.__name__, (cls, tf_class), {
            "__init__": __init__, "__module__": cls.__module__, "__qualname__": cls.__qualname__,
            "__str__": lambda self: str(self.args[0]) if self.args else "",
            "__reduce__": lambda self: (cls, tuple(self.args)),
            "_mpidist_base": cls})
        _with_tf[(cls, tf_class)] = made
    return made


class MpidistError(Exception):
    """Base class of every error mpidist raises on purpose."""

    _tf_error: str | None = None  # the tf.errors class this one also is when TensorFlow is imported

    def __new__(cls, *args: Any, **kwargs: Any) -> "MpidistError":
        tf_class = _tf_error_class(cls._tf_error)
        if tf_class is not None and not issubclass(cls, tf_class):
            cls = _tf_flavoured(cls, tf_class)
        return super().__new__(cls, *args, **kwargs)


class CollectiveMismatchError(MpidistError, ValueError):
    """Ranks issued different collectives (kind, op, dtype, shape, structure, root or settings).

    Raised on every rank of the communicator, with what each rank sent. With TensorFlow imported,
    also a ``tf.errors.InvalidArgumentError`` (what TensorFlow raises for mismatched shapes).
    """

    _tf_error = "InvalidArgumentError"


class DeadlineExceededError(MpidistError, TimeoutError):
    """A collective did not finish within its ``timeout_seconds``.

    With TensorFlow imported, also a ``tf.errors.DeadlineExceededError``."""

    _tf_error = "DeadlineExceededError"


class CommunicatorBrokenError(MpidistError, RuntimeError):
    """A communicator refuses collectives after an earlier one timed out or failed part-way."""


class RanksLostError(MpidistError, RuntimeError):
    """A rank of the communicator died (MPI reported MPI_ERR_PROC_FAILED or MPI_ERR_REVOKED: only
    under ULFM, ``mpirun --with-ft ulfm``). The engine revoked its communicator, so every surviving
    rank gets this error from its current or next collective; ``mpidist.elastic.run`` recovers from
    it. With TensorFlow imported, also a ``tf.errors.UnavailableError``."""

    _tf_error = "UnavailableError"


class GpuUnavailableError(MpidistError, RuntimeError):
    """GPU buffers or NCCL were asked for where CuPy, NCCL or a GPU is missing (raised on every rank)."""


def deadline_exceeded(message: str) -> DeadlineExceededError:
    """The error to raise for an expired deadline (also a ``tf.errors.DeadlineExceededError``
    when TensorFlow is imported; see the module docstring)."""
    return DeadlineExceededError(message)
