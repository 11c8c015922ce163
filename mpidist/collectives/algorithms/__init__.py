"""Buffer-level algorithms. Each module offers the same five functions, in the same order:
``allreduce(ctx, send, recv, op)``, ``bcast(ctx, buf, root)``, ``reduce(ctx, send, recv, op, root)``,
``allgatherv(ctx, send, recv, counts)`` (byte buffers, counts per rank) and
``reduce_scatter(ctx, send, recv, counts, op)``. ``ctx`` carries ``topo`` (a Topology) and ``call``
(a deadline.Caller).
"""
from . import flat, hierarchical

__all__ = ["flat", "hierarchical", "choose"]


def choose(name: str, topo, nbytes: int, threshold: int):
    """The algorithm module for one buffer: ``name`` is "flat", "hierarchical" or "auto"."""
    if name == "flat":
        return flat
    if name == "hierarchical":
        return hierarchical
    return hierarchical if topo.multi_node and nbytes >= threshold else flat
