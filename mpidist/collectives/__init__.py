"""Collectives layer: the engine and its parts (host NumPy buffers; adapters add other array types)."""
from .engine import Engine
from .ops import Op

__all__ = ["Engine", "Op"]
