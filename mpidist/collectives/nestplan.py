"""Compiled nests: the cache key of a nest of arrays, its leaves and its rebuild, in Python calls per
container rather than per leaf (the engine's cached path, fastpath.py, uses them for nests of nests:
a dict of lists, ``(partials, counts)``).

Only exact ``list``, ``tuple`` and ``dict`` containers and NumPy array leaves: anything else (a
namedtuple, an OrderedDict, a number) makes :func:`key` raise TypeError, and the call takes the
engine's general path. A container whose items are all arrays is handled by ``map`` and slicing
(no Python code per leaf); a leaf beside containers costs one call. :func:`walkers` works from
``nest.flatten``'s tree, so the leaves come in its order (dict keys sorted where they can be) and
the rebuilt nest is what ``nest.unflatten`` would build.
"""
from __future__ import annotations

import operator
from typing import Any, Callable

import numpy as np

from . import nest

_NDARRAY = {np.ndarray}
_DTYPE, _SHAPE = operator.attrgetter("dtype"), operator.attrgetter("shape")

Gather = Callable[[Any, list], None]  # (value, leaves so far): appends the value's leaves
Build = Callable[[list, int], tuple[Any, int]]  # (results, position): the rebuilt value, next position


def key(value: Any) -> tuple:
    """A hashable key of ``value``'s containers (types, dict keys in their order) and leaves (dtypes,
    shapes); TypeError for anything but exact lists, tuples, dicts and NumPy arrays."""
    kind = type(value)
    if kind is np.ndarray:
        return (value.dtype, value.shape)
    if kind is list or kind is tuple:
        if value and set(map(type, value)) == _NDARRAY:
            return (kind, tuple(map(_DTYPE, value)), tuple(map(_SHAPE, value)))
        return (kind, None, tuple(map(key, value)))
    if kind is dict:
        items = value.values()
        if items and set(map(type, items)) == _NDARRAY:
            return (dict, tuple(value), tuple(map(_DTYPE, items)), tuple(map(_SHAPE, items)))
        return (dict, tuple(value), None, tuple(map(key, items)))
    raise TypeError(f"not a list, tuple, dict or NumPy array: {kind.__name__}")


def _leaf_gather(value: Any, out: list) -> None:
    out.append(value)


def _leaf_build(results: list, at: int) -> tuple[Any, int]:
    return results[at], at + 1


def walkers(tree: Any) -> tuple[Gather, Build]:
    """``(gather, build)`` of a nest whose ``nest.flatten`` tree is ``tree``."""
    if tree is nest.LEAF:
        return _leaf_gather, _leaf_build
    kind, cls, keys, order, children = tree
    count = len(children)
    flat = children.count(nest.LEAF) == count
    if kind is dict:
        position = {k: i for i, k in enumerate(keys)}
        perm = [position[k] for k in order]  # the caller's key order, as positions among sorted keys
        if flat:
            def gather_dict(value: Any, out: list) -> None:
                out.extend(map(value.__getitem__, keys))

            def build_dict(results: list, at: int) -> tuple[Any, int]:
                part = results[at:at + count]
                return dict(zip(order, map(part.__getitem__, perm))), at + count
            return gather_dict, build_dict
        parts = [walkers(c) for c in children]

        def gather_nested_dict(value: Any, out: list) -> None:
            for k, (g, _) in zip(keys, parts):
                g(value[k], out)

        def build_nested_dict(results: list, at: int) -> tuple[Any, int]:
            built = []
            for _, b in parts:
                item, at = b(results, at)
                built.append(item)
            return dict(zip(order, map(built.__getitem__, perm))), at
        return gather_nested_dict, build_nested_dict
    if flat:
        def gather_seq(value: Any, out: list) -> None:
            out.extend(value)

        def build_seq(results: list, at: int) -> tuple[Any, int]:
            part = results[at:at + count]
            return (part if cls is list else tuple(part)), at + count
        return gather_seq, build_seq
    parts = [walkers(c) for c in children]

    def gather_nested_seq(value: Any, out: list) -> None:
        for item, (g, _) in zip(value, parts):
            g(item, out)

    def build_nested_seq(results: list, at: int) -> tuple[Any, int]:
        built = []
        for _, b in parts:
            item, at = b(results, at)
            built.append(item)
        return (built if cls is list else tuple(built)), at
    return gather_nested_seq, build_nested_seq
