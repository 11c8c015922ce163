"""Array adapters: turn each leaf into a host NumPy array and turn results back.

The engine works on contiguous NumPy arrays. A leaf may be a NumPy array, a NumPy scalar or a
Python number; results come back as the same kind (array, NumPy scalar, Python number) with the
same dtype and shape. Nothing else is taken here: device (CuPy) arrays go to collectives/gpu
before this module sees them, and the TensorFlow layer hands the engine NumPy arrays (or CuPy
ones, gpu_bridge.py) of its tensors.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .ops import check_dtype


@dataclass(frozen=True)
class Adapter:
    """How to move one kind of leaf to a NumPy array and back."""
    name: str
    accepts: Callable[[Any], bool]
    to_numpy: Callable[[Any], np.ndarray]
    from_numpy: Callable[[np.ndarray, Any], Any]   # (result, original leaf) -> leaf of the original kind


def _numpy_back(result: np.ndarray, original: Any) -> Any:
    return result


def _scalar_back(result: np.ndarray, original: Any) -> Any:
    return result.reshape(()).item() if not isinstance(original, np.generic) else result.reshape(())[()]


_NUMPY = Adapter("numpy", lambda x: isinstance(x, np.ndarray), lambda x: x, _numpy_back)
_SCALAR = Adapter("scalar", lambda x: isinstance(x, (np.generic, bool, int, float, complex)),
                  np.asarray, _scalar_back)


def to_host(leaf: Any, where: str, index: int) -> tuple[np.ndarray, Adapter]:
    """A C-contiguous NumPy array holding ``leaf`` and the adapter to rebuild it."""
    if isinstance(leaf, np.ndarray):
        adapter = _NUMPY
    elif _SCALAR.accepts(leaf):
        adapter = _SCALAR
    else:
        raise TypeError(f"{where}: leaf {index} of `value` must be an array or a number, "
                            f"got {type(leaf).__module__}.{type(leaf).__qualname__}")
    array = adapter.to_numpy(leaf)
    check_dtype(array.dtype, where, f"leaf {index} of `value`")
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    return array, adapter


_PLAIN = frozenset("biufc")


def to_host_all(leaves: list[Any], where: str) -> tuple[list[np.ndarray], list[Adapter | None]]:
    """:func:`to_host` of every leaf; the adapter is None for contiguous NumPy arrays (kept as is)."""
    hosts: list[np.ndarray] = []
    adapters: list[Adapter | None] = []
    for i, leaf in enumerate(leaves):
        if type(leaf) is np.ndarray and leaf.flags.c_contiguous and leaf.dtype.kind in _PLAIN \
                and leaf.dtype.fields is None:
            hosts.append(leaf)
            adapters.append(None)
        else:
            host, adapter = to_host(leaf, where, i)
            hosts.append(host)
            adapters.append(adapter)
    return hosts, adapters


def from_host_all(results: list[np.ndarray], adapters: list[Adapter | None], leaves: list[Any]) -> list[Any]:
    return [r if a is None else a.from_numpy(r, leaf) for r, a, leaf in zip(results, adapters, leaves)]
