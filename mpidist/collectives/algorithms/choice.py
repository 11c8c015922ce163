"""Which algorithm ``auto`` gives one buffer: flat or hierarchical, whichever the cost model predicts
is faster for this job's shape and this many bytes.

The rule, in one place (the engine, its cached fast paths, the GPU path's MPI transports,
``python -m mpidist info`` and the timeline all ask here):

- one node, or one rank per node: flat (there is nothing to be hierarchical about);
- ``rc.hierarchical_threshold`` set to a byte count: the old fixed rule, hierarchical from that many
  bytes (0: always) on multi-node jobs;
- otherwise (the default) the cheaper of the two predictions of :func:`costs`, from the job's shape
  (:class:`Shape`: ranks, ranks of the largest node, nodes, ``rc.nics_per_node``) and
  :data:`LINKS`. Ties go flat.

**Every rank makes the same choice**: the shape comes from the Topology, which every rank built from
the same allgather, and ``rc`` settings that shape a collective are part of the agreed key
(pipeline.py), so a rank whose ``nics_per_node`` or threshold differs is reported, not silently
split onto another algorithm.

**The predictions** are ``cost.seconds`` (the alpha-beta-gamma formulas that ``tools/costmodel``
uses too): ``flat`` is the best of ring, recursive doubling, Rabenseifner and reduce + broadcast
(what a well-tuned MPI library can pick); ``hierarchical`` is mpidist's own algorithm (reduce inside
the node, flat allreduce among node leaders, broadcast inside the node), plus what mpidist pays for
it and not for flat: :data:`CALL_SECONDS` for each of its two extra MPI calls, and one agreement
round trip (a flat allreduce of :data:`AGREEMENT_BYTES`), since hierarchical steps are never
speculated (agreement.py) while flat ones overlap the agreement with the data on repeats.

**The default links** (:data:`LINKS`) assume a CPU cluster, the host engine's home: shared memory
inside a node (0.4 µs per message, 10 GB/s per rank: one core's copy; reducing at 20 GB/s, 3 bytes
moved per byte), one 100 Gb/s NIC per node unless ``rc.nics_per_node`` says more (1.5 µs per
message: EDR/HDR InfiniBand MPI latency). These are the ``cpu-2s-100g`` preset's links
(docs/scaling.md: datasheets and stated assumptions), not a fit to any machine here. Fake nodes
(``rc.local_size``) are costed as if they were real nodes with these links, so the choice on a
fake layout is what a real cluster of that shape would get, not what is fastest on one machine.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from .cost import Params, gbit, gbyte, seconds

__all__ = ["AGREEMENT_BYTES", "CALL_SECONDS", "LINKS", "Shape", "auto", "bands", "costs", "shape_of", "size_text",
           "summary"]

LINKS = Params("mpidist-default", 2, 0.4e-6, gbyte(10), 1.5e-6, gbit(100), 1, 3 / (20e9), None,
               "CPU nodes: shared memory inside (10 GB/s per rank), 100 Gb/s NICs across",
               ("the cpu-2s-100g preset's links (tools/costmodel/presets.py, docs/scaling.md)",))
CALL_SECONDS = 2e-6  # one more MPI call from Python (deadline.Caller + mpi4py): an assumption, ~1-3 µs
AGREEMENT_BYTES = 24  # the agreement's allreduce (agreement.py)


@dataclass(frozen=True)
class Shape:
    """What the choice depends on: ranks, ranks of the largest node, nodes, NICs per node."""

    ranks: int
    ranks_per_node: int
    nodes: int
    nics: int

    @property
    def hierarchy_possible(self) -> bool:
        """Several nodes, and some node with several ranks."""
        return 1 < self.nodes < self.ranks


def shape_of(topo: Any, nics: int) -> Shape:
    """The Shape of a Topology (uneven nodes are costed as if all were as full as the largest)."""
    return Shape(topo.size, topo.largest_node, topo.num_nodes, nics)


@lru_cache(maxsize=256)
def _with_nics(links: Params, nics: int) -> Params:
    return links if nics == links.nics else Params(
        links.name, links.ranks_per_node, links.alpha_intra, links.beta_intra, links.alpha_inter,
        links.beta_inter, nics, links.gamma, links.gamma_leader, links.description, links.sources)


def costs(shape: Shape, nbytes: int, agreement: bool = True, links: Params = LINKS) -> tuple[float, float]:
    """Predicted seconds of one allreduce of ``nbytes`` per rank: (flat, hierarchical). ``agreement``
    (``rc.check_agreement``): hierarchical pays the agreement's round trip, flat overlaps it."""
    prm = _with_nics(links, shape.nics)
    p, k = shape.ranks, min(shape.ranks_per_node, shape.ranks)
    flat = seconds("flat", prm, p, k, float(nbytes))
    extra = 2 * CALL_SECONDS + (seconds("flat", prm, p, k, float(AGREEMENT_BYTES)) if agreement else 0.0)
    return flat, seconds("hierarchical", prm, p, k, float(nbytes)) + extra


def auto(shape: Shape, nbytes: int, threshold: int | None = None, agreement: bool = True,
         links: Params = LINKS) -> str:
    """"flat" or "hierarchical" for one buffer of ``nbytes`` under ``algorithm="auto"``."""
    if not shape.hierarchy_possible:
        return "flat"
    if threshold is not None:
        return "hierarchical" if nbytes >= threshold else "flat"
    flat, hier = costs(shape, nbytes, agreement, links)
    return "hierarchical" if hier < flat else "flat"


def bands(shape: Shape, threshold: int | None = None, agreement: bool = True, links: Params = LINKS,
          low: int = 1 << 10, high: int = 1 << 30, factor: int = 4) -> list[tuple[int, str, float, float]]:
    """(bytes, choice, flat seconds, hierarchical seconds) at ``low``, ``low·factor`` ... ``high``:
    what ``python -m mpidist info`` shows (costs 0 where hierarchy is impossible)."""
    rows, n = [], low
    while n <= high:
        flat, hier = costs(shape, n, agreement, links) if shape.hierarchy_possible else (0.0, 0.0)
        rows.append((n, auto(shape, n, threshold, agreement, links), flat, hier))
        n *= factor
    return rows


def summary(rows: list[tuple[int, str, float, float]]) -> str:
    """:func:`bands` rows in words: "flat at every size", "hierarchical from 1 KiB to 16 KiB, flat
    otherwise" (sizes as sampled)."""
    names = {name for _, name, _, _ in rows}
    if len(names) == 1:
        return f"{names.pop()} at every size"
    runs: list[tuple[int, int]] = []
    for n, name, _, _ in rows:
        if name == "hierarchical":
            if runs and runs[-1][1] * (rows[1][0] // rows[0][0]) == n:
                runs[-1] = (runs[-1][0], n)
            else:
                runs.append((n, n))
    spans = ", ".join(size_text(a) if a == b else f"{size_text(a)} to {size_text(b)}" for a, b in runs)
    return f"hierarchical at {spans}, flat otherwise"


def size_text(n: int) -> str:
    """1024 -> '1 KiB'."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} B"
