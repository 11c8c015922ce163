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


class Op(enum.Enum):
    SUM = "sum"
    MEAN = "mean"
    MIN = "min"
    MAX = "max"
    PROD = "prod"


_ALIASES = {"product": "prod", "avg": "mean", "average": "mean"}
_KNOWN: dict[Any, Op] = {**{o: o for o in Op}, **{o.value: o for o in Op}, **{o.name: o for o in Op}}
_KINDS = "biufc"  # bool, signed, unsigned, float, complex


def parse_op(op: Any, where: str) -> Op:
    """``op`` as an :class:`Op`: an Op, a name ("sum", "SUM", "Mean"), or an enum whose value is one."""
    try:
        return _KNOWN[op]
    except (KeyError, TypeError):
        pass
    name = op.value if isinstance(op, enum.Enum) else op
    if isinstance(name, str):
        text = name.strip().lower()
        try:
            return Op(_ALIASES.get(text, text))
        except ValueError:
            pass
    raise ValueError(f"{where}: `op` must be one of {', '.join(o.name for o in Op)}, got {op!r}")


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


_MPI_OPS = {Op.SUM: MPI.SUM, Op.MEAN: MPI.SUM, Op.MIN: MPI.MIN, Op.MAX: MPI.MAX, Op.PROD: MPI.PROD}
_BOOL_OPS = {Op.SUM: MPI.MAX, Op.MAX: MPI.MAX, Op.PROD: MPI.MIN, Op.MIN: MPI.MIN}


def mpi_op(op: Op, dtype: np.dtype) -> MPI.Op:
    """The MPI operation for ``op`` on data of (original) ``dtype``."""
    return _BOOL_OPS[op] if dtype.kind == "b" else _MPI_OPS[op]


_rules: dict[tuple[np.dtype, Op], tuple[np.dtype, MPI.Op]] = {}


def rules(dtype: np.dtype, op: Op, where: str, what: str) -> tuple[np.dtype, MPI.Op]:
    """``(wire dtype, MPI op)`` for reducing ``dtype`` with ``op`` (cached; errors as wire_dtype)."""
    found = _rules.get((dtype, op))
    if found is None:
        found = _rules[(dtype, op)] = (wire_dtype(dtype, op, where, what), mpi_op(op, dtype))
    return found


def finish_mean(buffer: np.ndarray, count: int) -> None:
    """Turn a SUM into a MEAN over ``count`` ranks, in place."""
    if count == 1:
        return
    if buffer.dtype.kind in "fc":
        buffer /= count
    elif buffer.dtype.kind == "u":
        buffer //= count
    else:  # signed integers: truncate toward zero
        negative = buffer < 0
        np.abs(buffer, out=buffer)
        buffer //= count
        np.negative(buffer, out=buffer, where=negative)
