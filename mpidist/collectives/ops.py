"""Reduction operations and the dtype rules of the engine.

- Any numeric NumPy dtype and bool are accepted. Reductions of float16 run in float32 on the
  wire (MPI has no portable half type) and are rounded back once; bool runs as uint8 with
  SUM/MAX = logical or and PROD/MIN = logical and (NumPy's own bool arithmetic).
- MEAN divides the SUM by the number of ranks; for integer dtypes it truncates toward zero, as
  TensorFlow's integer division does. MEAN of bool is an error, as MIN/MAX of complex numbers.
- Data-moving collectives (broadcast, allgather) move raw bytes, so every dtype travels unchanged.
"""
from __future__ import annotations

import enum
from typing import Any

import numpy as np
from mpi4py import MPI


class ReduceOp(enum.Enum):
    """How values are combined across ranks: ``tf.distribute.ReduceOp`` (SUM, MEAN) plus MIN, MAX
    and PROD. ``mpidist.ReduceOp``, ``mpidist.Op`` and ``mpidist.cross_device.ReduceOp`` are this
    one class. Every spelling is accepted where an op is expected (:func:`parse_op`): a member,
    its name in any case ("sum", "SUM", "Mean"), the aliases "avg"/"average"/"product", or another
    enum with such a name or value (TensorFlow's ``tf.distribute.ReduceOp.SUM``); ``ReduceOp("sum")``
    works too. Values are TensorFlow's ("SUM", "MEAN" ...)."""

    SUM = "SUM"
    MEAN = "MEAN"
    MIN = "MIN"
    MAX = "MAX"
    PROD = "PROD"

    @classmethod
    def _missing_(cls, value: object) -> ReduceOp | None:
        return _lookup(value)

    @staticmethod
    def from_variable_aggregation(aggregation: Any) -> ReduceOp:
        """``tf.VariableAggregation`` (or its name) to a ReduceOp, as TensorFlow's method does."""
        name = getattr(aggregation, "name", str(aggregation)).upper()
        if name not in ("SUM", "MEAN"):
            raise ValueError(f"ReduceOp.from_variable_aggregation: `aggregation` must be SUM or MEAN, "
                             f"got {aggregation!r}")
        return ReduceOp[name]


Op = ReduceOp  # the engine's historical name: the same class

_ALIASES = {"product": "PROD", "avg": "MEAN", "average": "MEAN"}
_KNOWN: dict[Any, ReduceOp] = {**{o: o for o in ReduceOp}, **{o.value: o for o in ReduceOp},
                               **{o.value.lower(): o for o in ReduceOp}}
_KINDS = "biufc"  # bool, signed, unsigned, float, complex


def _lookup(op: Any) -> ReduceOp | None:
    found = _KNOWN.get(op) if isinstance(op, (str, ReduceOp)) else None
    if found is not None:
        return found
    for name in (getattr(op, "name", None), getattr(op, "value", None), op):
        if isinstance(name, str):
            text = name.strip().lower()
            found = _KNOWN.get(_ALIASES.get(text, text))
            if found is not None:
                return found
    return None


def parse_op(op: Any, where: str, name: str = "op") -> ReduceOp:
    """``op`` as a :class:`ReduceOp` (any spelling, see the class), or ValueError naming ``where``."""
    try:
        return _KNOWN[op]
    except (KeyError, TypeError):
        pass
    found = _lookup(op)
    if found is None:
        raise ValueError(f"{where}: `{name}` must be one of {', '.join(o.name for o in ReduceOp)}, got {op!r}")
    return found


def check_dtype(dtype: np.dtype, where: str, what: str) -> None:
    """Reject dtypes MPI cannot move meaningfully (object, strings, records, datetimes)."""
    if dtype.kind not in _KINDS or dtype.fields is not None:
        raise TypeError(f"{where}: {what} has dtype {dtype}; expected a numeric or bool dtype")


def wire_dtype(dtype: np.dtype, op: Op, where: str, what: str) -> np.dtype:
    """The dtype a reduction runs in on the wire for data of ``dtype``."""
    check_dtype(dtype, where, what)
    if dtype.kind == "b":
        if op is Op.MEAN:
            raise TypeError(f"{where}: {what} has dtype bool; op MEAN needs a numeric dtype")
        return np.dtype(np.uint8)
    if dtype.kind == "c" and op in (Op.MIN, Op.MAX):
        raise TypeError(f"{where}: {what} has dtype {dtype}; op {op.name} is not defined for complex numbers")
    if dtype == np.float16:
        return np.dtype(np.float32)
    return dtype


MPI_OPS = {Op.SUM: MPI.SUM, Op.MEAN: MPI.SUM, Op.MIN: MPI.MIN, Op.MAX: MPI.MAX, Op.PROD: MPI.PROD}
BOOL_OPS = {Op.SUM: MPI.MAX, Op.MAX: MPI.MAX, Op.PROD: MPI.MIN, Op.MIN: MPI.MIN}  # logical or / and
REDUCTIONS = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX}  # by the GPU rules' names


def mpi_op(op: Op, dtype: np.dtype) -> MPI.Op:
    """The MPI operation for ``op`` on data of (original) ``dtype``."""
    return BOOL_OPS[op] if dtype.kind == "b" else MPI_OPS[op]


_rules: dict[tuple[np.dtype, Op], tuple[np.dtype, MPI.Op]] = {}


def rules(dtype: np.dtype, op: Op, where: str, what: str) -> tuple[np.dtype, MPI.Op]:
    """``(wire dtype, MPI op)`` for reducing ``dtype`` with ``op`` (cached; errors as wire_dtype)."""
    found = _rules.get((dtype, op))
    if found is None:
        found = _rules[(dtype, op)] = (wire_dtype(dtype, op, where, what), mpi_op(op, dtype))
    return found


def finish_mean(buffer: Any, count: int, xp: Any = None) -> None:
    """Turn a SUM into a MEAN over ``count`` ranks, in place (integers truncate toward zero).

    ``xp``: the array module of a device buffer (CuPy); None: a host NumPy buffer."""
    if count == 1:
        return
    dtype = buffer.dtype
    if dtype.kind == "c":  # each part on its own: complex division by (count + 0j) rounds both parts
        parts = buffer.view(np.dtype(f"f{dtype.itemsize // 2}"))  # (real, imag) pairs, in place
        parts /= count
    elif dtype.kind == "f" or dtype.name == "bfloat16":
        buffer /= count
    elif dtype.kind == "u":
        buffer //= count
    elif xp is None:  # signed integers: truncate toward zero, in place
        negative = buffer < 0
        np.abs(buffer, out=buffer)
        buffer //= count
        np.negative(buffer, out=buffer, where=negative)
    else:
        quotient = xp.abs(buffer) // count
        buffer[...] = xp.where(buffer < 0, -quotient, quotient)
