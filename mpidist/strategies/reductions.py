"""Reductions and gathers along an axis, for ``Strategy.reduce(..., axis=)`` and ``gather``.

``reduce(op, value, axis=k)`` first reduces each leaf along axis k on this rank, then across ranks.
MEAN divides by the global number of elements along the axis (the sum of every rank's length), so
a smaller last batch on some rank weighs exactly as its rows do. All leaves travel in one engine
call. CuPy leaves stay on the GPU: their local work is done by CuPy's functions of the same names.

``axis`` takes what the TensorFlow strategies take (tensorflow/reductions.py): an int, or a
non-empty list/tuple of ints (reduced along all of them; MEAN divides by the product of their global
lengths); a scalar reduced along axis 0 (or -1) counts as one element (Keras's multi-worker path
calls ``reduce("MEAN", scalar, axis=0)``).
"""
from __future__ import annotations

import sys
from typing import Any

import numpy as np

from ..collectives import Engine, gpu, nest
from ..collectives.options import CallOptions
from ..cross_device import ReduceOp
from ..validation import is_integer
from ..values import local

_NDARRAY = {np.ndarray}


def map_local(value: Any) -> Any:
    """``value`` with every DistributedValues replaced by its local component."""
    kind = type(value)
    if kind is np.ndarray or ((kind is tuple or kind is dict) and not value):  # nothing to replace
        return value
    if (kind is list or kind is tuple) and set(map(type, value)) == _NDARRAY \
            or kind is dict and set(map(type, value.values())) == _NDARRAY:
        return value  # a flat nest of host arrays (gradients, metrics): nothing to replace, no walk per leaf
    leaves, tree = nest.flatten(local(value))
    return nest.unflatten(tree, [local(leaf) for leaf in leaves])


def map_local_call(args: Any, kwargs: dict | None) -> tuple[tuple, dict]:
    """A call's positional and keyword arguments through :func:`map_local` one by one, so that an
    argument that is a flat nest of host arrays (``strategy.run(fn, args=(grads,))``) stays as it
    is, with no walk per leaf (the argument tuple around it would make it a nest of nests)."""
    return tuple(map(map_local, args)), ({k: map_local(v) for k, v in kwargs.items()} if kwargs else {})


def _axis(value: Any, ndim: int, where: str) -> int:
    if not is_integer(value):
        raise TypeError(f"{where}: `axis` must be an int or None, got {value!r}")
    if not -ndim <= value < ndim:
        raise ValueError(f"{where}: `axis` {value} is out of range for a value of rank {ndim}")
    return int(value) % ndim


def _axes(axis: Any, ndim: int, where: str) -> tuple[int, ...]:
    """``axis`` (an int or a non-empty list/tuple of ints) as sorted non-negative axes of a value
    of rank ``ndim``."""
    given = tuple(axis) if isinstance(axis, (list, tuple)) else (axis,)
    if not given or not all(is_integer(a) for a in given):
        raise TypeError(f"{where}: `axis` must be an int, a list/tuple of ints, or None, got {axis!r}")
    for a in given:
        if not -ndim <= a < ndim:
            raise ValueError(f"{where}: `axis` {axis!r} is out of range for a value of rank {ndim}")
    axes = tuple(sorted(int(a) % ndim for a in given))
    if len(set(axes)) != len(axes):
        raise ValueError(f"{where}: `axis` {axis!r} names the same axis twice")
    return axes


_SCALAR_AXES = (0, -1)  # a scalar reduced along these counts as one element


def _arrays(value: Any) -> tuple[list[np.ndarray], Any]:
    leaves, tree = nest.flatten(map_local(value))
    return [gpu.as_cupy(leaf) if gpu.is_device_array(leaf) else np.asarray(leaf) for leaf in leaves], tree


def _xp(a: Any) -> Any:
    """The array module of ``a``: CuPy for device arrays (CuPy arrays by then, see ``_arrays``), else NumPy."""
    return sys.modules["cupy"] if gpu.is_device_array(a) else np


_LOCAL = {ReduceOp.SUM: "sum", ReduceOp.MEAN: "sum", ReduceOp.MIN: "min", ReduceOp.MAX: "max",
          ReduceOp.PROD: "prod"}


def _local_reduce(a: np.ndarray, op: ReduceOp, axes: tuple[int, ...]) -> np.ndarray:
    if op in (ReduceOp.MIN, ReduceOp.MAX) and any(a.shape[k] == 0 for k in axes):  # empty local batch: identity
        info = np.finfo(a.dtype) if a.dtype.kind == "f" else np.iinfo(a.dtype)
        fill = info.max if op is ReduceOp.MIN else info.min
        return _xp(a).full(tuple(n for k, n in enumerate(a.shape) if k not in axes), fill, dtype=a.dtype)
    xp = _xp(a)
    return xp.asarray(getattr(xp, _LOCAL[op])(a, axis=axes)).astype(a.dtype, copy=False)


def _as_vector_if_scalar(a: Any, axis: Any, where: str) -> Any:
    """A scalar reduced along axis 0 or -1 (an int or a 1-tuple) as a vector of one element."""
    if a.ndim:
        return a
    given = tuple(axis) if isinstance(axis, (list, tuple)) else (axis,)
    if len(given) == 1 and is_integer(given[0]) and given[0] in _SCALAR_AXES:
        return a.reshape(1)
    raise ValueError(f"{where}: `axis` {axis!r} is out of range for a scalar value (rank 0); "
                     f"a scalar can be reduced along axis 0 or -1 only")


def reduce_along_axis(engine: Engine, op: ReduceOp, value: Any, axis: Any, options: CallOptions,
                      where: str) -> Any:
    arrays, tree = _arrays(value)
    arrays = [_as_vector_if_scalar(a, axis, where) for a in arrays]
    axes = [_axes(axis, a.ndim, where) for a in arrays]
    partial = [_local_reduce(a, op, k) for a, k in zip(arrays, axes)]
    if op is not ReduceOp.MEAN:
        reduced = engine.allreduce(partial, op, options=options)
        return nest.unflatten(tree, reduced)
    counts = np.array([int(np.prod([a.shape[k] for k in ks])) for a, ks in zip(arrays, axes)], dtype=np.int64)
    # device sums, host counts: one call
    sums, total = engine.allreduce((partial, counts), ReduceOp.SUM, options=options)
    results = []
    for s, n, a in zip(sums, total.tolist(), arrays):
        xp = _xp(s)
        if a.dtype.kind in "fc":
            results.append((s / n).astype(a.dtype, copy=False) if n else xp.full_like(s, np.nan))
        else:
            results.append((xp.sign(s) * (xp.abs(s) // max(n, 1))).astype(a.dtype))
    return nest.unflatten(tree, results)


def gather_along_axis(engine: Engine, value: Any, axis: Any, options: CallOptions, where: str) -> Any:
    arrays, tree = _arrays(value)
    for a in arrays:
        if a.ndim == 0:
            raise ValueError(f"{where}: cannot gather a scalar value; give it at least one dimension")
    axes = [_axis(axis, a.ndim, where) for a in arrays]
    moved = [_xp(a).moveaxis(a, k, 0) for a, k in zip(arrays, axes)]
    gathered = engine.allgather(moved, options=options)
    return nest.unflatten(tree, [_xp(g).moveaxis(g, 0, k) for g, k in zip(gathered, axes)])
