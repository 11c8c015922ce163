"""Buffer-level algorithms. Each module offers the same five functions, in the same order:
``allreduce(ctx, send, recv, op)``, ``bcast(ctx, buf, root)``, ``reduce(ctx, send, recv, op, root)``,
``allgatherv(ctx, send, recv, counts)`` (byte buffers, counts per rank) and
``reduce_scatter(ctx, send, recv, counts, op)``. ``ctx`` carries ``topo`` (a Topology) and ``call``
(a deadline.Caller). Which one ``auto`` gives a buffer: choice.py (the cost model of cost.py).
"""
from __future__ import annotations

from functools import lru_cache
from types import ModuleType
from typing import Any

from ..._config import rc
from . import choice, flat, hierarchical

__all__ = ["flat", "hierarchical", "choice", "choose", "auto_name", "auto_reason"]


@lru_cache(maxsize=4096)
def _auto(size: int, largest: int, nodes: int, nics: int, nbytes: int, threshold: int | None,
          agreement: bool) -> str:
    """choice.auto, cached by plain values (the engine asks per buffer; choice.auto itself is not cached)."""
    return choice.auto(choice.Shape(size, largest, nodes, nics), nbytes, threshold, agreement)


def auto_name(topo: Any, nbytes: int) -> str:
    """What ``algorithm="auto"`` gives a buffer of ``nbytes`` on ``topo`` under the current ``rc``."""
    if not topo.multi_node:
        return "flat"
    return _auto(topo.size, topo.largest_node, topo.num_nodes, rc.nics_per_node, nbytes,
                 rc.hierarchical_threshold, rc.check_agreement)


def auto_reason(topo: Any) -> str:
    """Why, in a few words (the timeline's ``chosen_by``)."""
    if not topo.multi_node:
        return "one node or one rank per node"
    if rc.hierarchical_threshold is not None:
        return f"rc.hierarchical_threshold={rc.hierarchical_threshold}"
    return (f"cost model, {topo.size} ranks, {topo.num_nodes} nodes of up to {topo.largest_node}, "
            f"{rc.nics_per_node} NIC(s) per node")


def choose(name: str, topo: Any, nbytes: int) -> ModuleType:
    """The algorithm module for one buffer: ``name`` is "flat", "hierarchical" or "auto"."""
    if name == "flat":
        return flat
    if name == "hierarchical":
        return hierarchical
    return hierarchical if auto_name(topo, nbytes) == "hierarchical" else flat
