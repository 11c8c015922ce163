"""Collectives layer: the engine and its parts (host NumPy buffers; adapters add other array types)."""
from .engine import Engine
from .ops import Op, ReduceOp
from .options import CallOptions
from .pipeline import Call, Pipeline

__all__ = ["Engine", "Op", "ReduceOp", "CallOptions", "Call", "Pipeline"]
