"""ReduceOp: ``tf.distribute.ReduceOp`` (SUM, MEAN) plus MIN, MAX and PROD."""
from __future__ import annotations

import enum
from typing import Any


class ReduceOp(enum.Enum):
    SUM = "SUM"
    MEAN = "MEAN"
    MIN = "MIN"
    MAX = "MAX"
    PROD = "PROD"

    @staticmethod
    def from_variable_aggregation(aggregation: Any) -> "ReduceOp":
        """``tf.VariableAggregation`` (or its name) to a ReduceOp, as TensorFlow's method does."""
        name = getattr(aggregation, "name", str(aggregation)).upper()
        mapping = {"SUM": ReduceOp.SUM, "MEAN": ReduceOp.MEAN}
        if name not in mapping:
            raise ValueError(f"ReduceOp.from_variable_aggregation: `aggregation` must be SUM or MEAN, "
                             f"got {aggregation!r}")
        return mapping[name]


def as_reduce_op(op: Any, where: str) -> ReduceOp:
    """A ReduceOp from one, a name in any case ("sum"), or TensorFlow's ReduceOp."""
    if isinstance(op, ReduceOp):
        return op
    name = getattr(op, "value", op)
    if isinstance(name, str) and name.upper() in ReduceOp.__members__:
        return ReduceOp[name.upper()]
    raise ValueError(f"{where}: `reduce_op` must be one of SUM, MEAN, MIN, MAX, PROD, got {op!r}")
