"""Horovod's reduction constants and the legacy ``average=`` argument."""
from __future__ import annotations

from typing import Any

from ...collectives.ops import ReduceOp

Average = 0
Sum = 1
Adasum = 2
Min = 3
Max = 4
Product = 5

_NAMES = {Average: "Average", Sum: "Sum", Adasum: "Adasum", Min: "Min", Max: "Max", Product: "Product"}
_ENGINE = {Average: ReduceOp.MEAN, Sum: ReduceOp.SUM, Min: ReduceOp.MIN, Max: ReduceOp.MAX, Product: ReduceOp.PROD}


def handle_average_backwards_compatibility(op: Any, average: Any) -> int:
    """The op from Horovod's ``op=`` and legacy ``average=`` (Average when neither is given)."""
    if op is not None:
        if average is not None:
            raise ValueError("The op parameter supersedes average. Please provide only one of them.")
        return op
    if average is not None:
        return Average if average else Sum
    return Average


def engine_op(op: Any, where: str) -> ReduceOp:
    """The engine's ReduceOp for Horovod op ``op``; Adasum is not implemented."""
    if op == Adasum:
        raise NotImplementedError(f"{where}: op=Adasum is not supported by mpidist.horovod "
                                  f"(use Average or Sum)")
    try:
        return _ENGINE[op]
    except (KeyError, TypeError):
        raise ValueError(f"{where}: `op` must be one of hvd.Average, hvd.Sum, hvd.Min, hvd.Max, "
                         f"hvd.Product, got {op!r}") from None


def name_of(op: Any) -> str:
    return _NAMES.get(op, repr(op))
