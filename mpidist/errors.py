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

import builtins
import sys
from typing import Any

_TF_ERRORS = "tensorflow.python.framework.errors_impl"
_with_tf: dict[tuple[type, type], type] = {}  # (mpidist class, tf.errors class) -> the class of both


def _tf_error_class(name: str | None) -> type | None:
    """TensorFlow's ``tf.errors.<name>`` when TensorFlow is imported, else None."""
    if name is None:
        return None
    return getattr(sys.modules.get(_TF_ERRORS), name, None)


def _tf_flavoured(cls: type, tf_class: Any) -> type:
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

    def __new__(cls, *args: Any, **kwargs: Any) -> MpidistError:
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


class StandingByError(CollectiveMismatchError):
    """Raised on the ranks of a collective that some other ranks did not issue because they stand by
    (``Engine.stand_by``: Horovod's ``hvd.join``), after the communicator is left clean (no data
    step outstanding, nothing returned). The layer that made the standing ranks stand by serves them
    and runs the collective again (horovod/tensorflow/joins.py); anywhere else it is the mismatch it
    looks like. ``where``: the collective; ``ranks``: the ranks that stand by."""

    where: str = ""
    ranks: list = []


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


class CollectiveFailedError(MpidistError, RuntimeError):
    """Another rank's call of this collective failed before its data moved (an argument, conversion
    or dtype error there), so the collective raises on every rank: that rank raises its own error,
    every other rank this one, naming the rank and its message.

    Built by :func:`peer_failure`, which makes it also an instance of the failing rank's error type
    when that type is a built-in exception or a ``tf.errors`` class (``except ValueError`` or
    ``except tf.errors.InvalidArgumentError`` then catches it on every rank alike). Attributes:
    ``where`` (the collective), ``rank`` (the lowest rank that failed), ``failures`` (a list of
    ``(rank, type name, message)``, one per failing rank).
    """

    where: str = ""
    rank: int = -1
    failures: list = []


class DeadlockError(MpidistError, RuntimeError):
    """A rank waits for another outside a collective (a save that follows the chief's) while the other
    is inside a collective the waiting rank cannot join: raised on the waiting rank, naming where the
    other rank is, and (through that collective) on the other rank as ``CollectiveFailedError``."""


class GpuUnavailableError(MpidistError, RuntimeError):
    """GPU buffers or NCCL were asked for where CuPy, NCCL or a GPU is missing (raised on every rank)."""


_failed_with: dict[tuple[type, ...], type] = {}  # the failing rank's bases -> CollectiveFailedError with them


def _resolve(types: Any) -> tuple[type, ...]:
    """The classes named by ``types`` ((module, qualname) of the failing rank's exception and its
    bases, most derived first) that this process can raise alike: the most derived ``tf.errors``
    class (when TensorFlow is imported) and the most derived built-in exception other than
    Exception/BaseException."""
    tf_class = builtin = None
    for module, name in types:
        if module == _TF_ERRORS and tf_class is None:
            tf_class = _tf_error_class(name)
        elif module == "builtins" and builtin is None and name not in ("Exception", "BaseException", "object"):
            candidate = getattr(builtins, name, None)
            if isinstance(candidate, type) and issubclass(candidate, Exception) \
                    and candidate.__basicsize__ == Exception.__basicsize__:  # not OSError's own lay-out
                builtin = candidate
    return tuple(c for c in (tf_class, builtin) if c is not None)


def _failed_class(bases: tuple[type, ...]) -> type:
    """CollectiveFailedError that is also each of ``bases`` (built once per tuple; the plain class
    when Python cannot combine them)."""
    key = bases
    made = _failed_with.get(key)
    if made is None:
        tf_class: Any = next((b for b in bases if b.__module__ == _TF_ERRORS), None)

        def __init__(self: Any, message: Any = "", *args: Any) -> None:
            if tf_class is not None:
                tf_class.__init__(self, None, None, str(message))
            else:
                Exception.__init__(self, message)
            self.args = (message,) + args

        made = CollectiveFailedError
        while bases:
            try:
                made = type("CollectiveFailedError", (CollectiveFailedError,) + bases, {
                    "__init__": __init__, "__module__": __name__, "__qualname__": "CollectiveFailedError",
                    "__str__": lambda self: str(self.args[0]) if self.args else "",
                    "__reduce__": lambda self: (CollectiveFailedError, tuple(self.args)),
                    "_mpidist_base": CollectiveFailedError})
                break
            except TypeError:  # an instance lay-out conflict: keep the more important bases
                bases = bases[:-1]
        _failed_with[key] = made
    return made


def failure_types(error: BaseException) -> tuple[tuple[str, str], ...]:
    """What other ranks need to raise an error of ``error``'s type: (module, qualname) of its class
    and its bases, most derived first (see :func:`peer_failure`)."""
    return tuple((c.__module__, c.__qualname__) for c in type(error).__mro__)


def peer_failure(where: str, failures: list[tuple[int, Any, str]]) -> CollectiveFailedError:
    """The error of a rank whose collective ``where`` did not fail itself while ``failures``
    ((rank, :func:`failure_types` of its error, its message), lowest rank first) did."""
    rank, types, message = failures[0]
    type_name = types[0][1] if types else "Exception"
    text = f"{where}: rank {rank} failed before the collective's data moved, so it fails on every rank: " \
           f"{type_name}: {message}"
    if len(failures) > 1:
        text += f" (ranks {', '.join(str(r) for r, _, _ in failures[1:])} failed too)"
    error = _failed_class(_resolve(types))(text)
    error.where, error.rank = where, rank
    error.failures = [(r, t[0][1] if t else "Exception", m) for r, t, m in failures]
    return error


def deadline_exceeded(message: str) -> DeadlineExceededError:
    """The error to raise for an expired deadline (also a ``tf.errors.DeadlineExceededError``
    when TensorFlow is imported; see the module docstring)."""
    return DeadlineExceededError(message)
