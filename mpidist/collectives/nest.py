"""Nested structures of arrays: flatten to a list of leaves and rebuild.

Dicts (keys sorted when they are sortable, so ranks that built a dict in another order still
agree), lists, tuples and namedtuples are structure; anything else is a leaf. ``structure_key``
gives a deterministic text for the agreement check.
"""
from __future__ import annotations

from typing import Any, Sequence

LEAF = None  # the tree of a single leaf
_CONTAINERS = (dict, list, tuple)


def _keys(mapping: dict) -> list:
    try:
        return sorted(mapping)
    except TypeError:
        return list(mapping)


def flatten(value: Any) -> tuple[list[Any], Any]:
    """``(leaves, tree)``: the leaves in a deterministic order and what ``unflatten`` needs."""
    if type(value) in (list, tuple) and not any([isinstance(x, _CONTAINERS) for x in value]):
        return list(value), (list, type(value), None, None, [LEAF] * len(value))  # flat list: no recursion
    leaves: list[Any] = []

    def walk(v: Any) -> Any:
        if isinstance(v, dict):
            keys = _keys(v)
            return (dict, type(v), keys, list(v), [walk(v[k]) for k in keys])
        if isinstance(v, (list, tuple)):
            return (list, type(v), None, None, [walk(x) for x in v])
        leaves.append(v)
        return LEAF

    tree = walk(value)
    return leaves, tree


def unflatten(tree: Any, leaves: Sequence[Any]) -> Any:
    """Rebuild ``tree`` (from :func:`flatten`) with new leaves, containers of the same types."""
    it = iter(leaves)

    def build(t: Any) -> Any:
        if t is LEAF:
            return next(it)
        kind, cls, keys, order, children = t
        built = [build(c) for c in children]
        if kind is dict:
            by_key = dict(zip(keys, built))
            items = [(k, by_key[k]) for k in order]
            try:
                return cls(items)
            except TypeError:  # e.g. defaultdict; keep the mapping, lose the subclass
                return dict(items)
        if cls is list or cls is tuple:
            return cls(built)
        if hasattr(cls, "_fields"):  # namedtuple
            return cls(*built)
        return cls(built)

    return build(tree)


def structure_key(tree: Any) -> str:
    """Deterministic text of a structure, e.g. ``{'b':[*,*],'w':*}``; leaves are ``*``."""
    if tree is LEAF:
        return "*"
    kind, cls, keys, _, children = tree
    inner = ",".join(structure_key(c) for c in children)
    if kind is dict:
        inner = ",".join(f"{k!r}:{structure_key(c)}" for k, c in zip(keys, children))
        return "{" + inner + "}"
    if hasattr(cls, "_fields"):
        return f"{cls.__name__}(" + inner + ")"
    return ("[" + inner + "]") if cls is list else ("(" + inner + ")")
