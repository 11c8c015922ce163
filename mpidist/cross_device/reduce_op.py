"""ReduceOp: ``tf.distribute.ReduceOp`` (SUM, MEAN) plus MIN, MAX and PROD.

The class is defined once, in the collectives layer (``mpidist.collectives.ops.ReduceOp``), so
``mpidist.ReduceOp``, ``mpidist.Op`` and this module's ``ReduceOp`` are the same class and every
spelling ("sum", ``ReduceOp.SUM``, ``Op.SUM``, TensorFlow's ``tf.distribute.ReduceOp.SUM``) means
the same op everywhere.
"""
from __future__ import annotations

from typing import Any

from ..collectives.ops import ReduceOp, parse_op

__all__ = ["ReduceOp", "as_reduce_op"]


def as_reduce_op(op: Any, where: str) -> ReduceOp:
    """A ReduceOp from any spelling (see ReduceOp), or ValueError naming ``where`` and `reduce_op`."""
    return parse_op(op, where, "reduce_op")
