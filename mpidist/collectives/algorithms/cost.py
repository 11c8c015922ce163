"""Alpha-beta-gamma cost model of allreduce algorithms: scaling beyond this machine on paper.

A message of m bytes over a link costs ``α + m·β`` seconds (α: latency per message, β = 1/bandwidth
in seconds per byte; Hockney's model), and reducing m bytes costs ``m·γ`` (Thakur, Rabenseifner and
Gropp, "Optimization of collective communication operations in MPICH", IJHPCA 2005, whose formulas
are used here). Two kinds of link: inside a node (``alpha_intra``, ``beta_intra``: one rank's link —
NVLink, PCIe, shared memory) and across nodes (``alpha_inter``; ``beta_inter`` for one flow through one
NIC; a node has ``nics`` of them, so flows leaving a node at once share ``nics / beta_inter`` bytes/s).

Placement: p ranks fill nodes in consecutive blocks of k = ``ranks_per_node``; N = ceil(p/k) nodes
(a last, partial node costs as a full one). In every step of an algorithm all ranks exchange with
their partners at once, and the step lasts as long as its slowest pair: a pair inside a node costs
``α_intra + m·β_intra``; a pair across nodes ``α_inter + m·max(β_inter, f·β_inter/nics)`` where f is
the number of this node's ranks talking off-node in that step (they share the NICs).

Algorithms (``ALGORITHMS``), n = bytes per rank, p ranks:
- ``ring``: 2(p-1) steps of n/p bytes; 2(p-1)α + 2(p-1)/p·nβ + (p-1)/p·nγ; one flow per node
  boundary;
- ``recursive_doubling``: log2 p steps of n bytes, each reduced: log2 p·(α + nβ + nγ);
- ``rabenseifner``: reduce-scatter by recursive halving, allgather by recursive doubling (distance
  doubling, as MPICH and Open MPI do: the big early steps stay inside a node):
  2·log2 p·α + 2(p-1)/p·nβ + (p-1)/p·nγ;
- ``reduce_bcast``: the best reduce (binomial tree, pipelined chain, reduce-scatter + gather) followed
  by the best broadcast (binomial, pipelined chain, scatter + allgather);
- ``flat``: the best of the four above for each size — what a well-tuned MPI library could pick;
- ``hierarchical`` (mpidist's algorithm): reduce inside the node, ``flat`` allreduce of n bytes among
  the N node leaders (one flow per node), broadcast inside the node;
- ``hierarchical_rs``: reduce-scatter inside the node, k concurrent ``flat`` allreduces of n/k bytes
  across nodes (one per shard: k flows share the node's NICs), allgather inside the node;
- ``nccl_ring`` / ``nccl_tree``: NCCL alone over the whole job, for reference: rings (one channel per
  NIC) whose steps run at min(link, node NIC bandwidth); double binary tree across nodes with a chain
  inside, pipelined: 2(⌈log2 N⌉α_inter + (k-1)α_intra) + 2n·max(β_intra, β_inter/nics) + nγ.
Non-powers of two: recursive doubling and Rabenseifner first fold the p - 2^⌊log2 p⌋ extra ranks into
partners (one step of n bytes each way). Pipelined chains are charged their asymptotic cost
(k-1)α + nβ, without pipeline fill.

What the model ignores (so its times are lower bounds for the given links, not measurements):
contention beyond the NIC sharing above (switch congestion, oversubscribed fat trees, adaptive
routing), topology-aware rank placement and the network's shape, protocol switches (eager /
rendezvous, NCCL's LL/LL128/Simple), message segmentation, caches (γ and intra-node β are memory
speeds), software overhead per call (mpidist's agreement check, Python), GPU kernel launches,
and CPU oversubscription. Exact placement holds for powers of two; other sizes are approximations.

This module holds the formulas and the link parameters (:class:`Params`); mpidist's automatic
algorithm choice (``choice.py``) and the paper tools (``tools/costmodel``: presets, fits, step
predictions) both use them.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import lru_cache

ALGORITHMS = ("flat", "ring", "recursive_doubling", "rabenseifner", "reduce_bcast",
              "hierarchical", "hierarchical_rs", "nccl_ring", "nccl_tree")
FLAT_CANDIDATES = ("ring", "recursive_doubling", "rabenseifner", "reduce_bcast")

__all__ = ["ALGORITHMS", "FLAT_CANDIDATES", "GB", "Params", "gbit", "gbyte", "seconds"]

GB = 1e9  # bytes per second in one GB/s


def gbit(rate: float) -> float:
    """Seconds per byte of a link of `rate` Gb/s."""
    return 8 / (rate * 1e9)


def gbyte(rate: float) -> float:
    """Seconds per byte of a link of `rate` GB/s."""
    return 1 / (rate * GB)


@dataclass(frozen=True)
class Params:
    """One cluster: ranks per node, intra-node link (per rank), inter-node link (per flow) and NICs."""

    name: str
    ranks_per_node: int
    alpha_intra: float   # s per message between two ranks of one node
    beta_intra: float    # s per byte on one rank's intra-node link (all ranks moving data at once)
    alpha_inter: float   # s per message between nodes
    beta_inter: float    # s per byte of one flow across nodes: one NIC's rate
    nics: int = 1        # NICs per node: flows leaving a node at once share nics / beta_inter bytes/s
    gamma: float = 0.0   # s per byte reduced (e.g. a float32 sum: read two, write one), all ranks busy
    gamma_leader: float | None = None  # s per byte reduced when one rank per node works; None: gamma
    description: str = ""
    sources: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("ranks_per_node", "nics"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Params: `{name}` must be an integer >= 1, got {value!r}")
        for name in ("alpha_intra", "beta_intra", "alpha_inter", "beta_inter", "gamma", "gamma_leader"):
            value = getattr(self, name)
            if name == "gamma_leader" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 \
                    or math.isinf(value):
                raise ValueError(f"Params: `{name}` must be a finite number >= 0 (seconds), got {value!r}")

    @property
    def gamma_one(self) -> float:
        """γ when only one rank per node works (the node leaders)."""
        return self.gamma if self.gamma_leader is None else self.gamma_leader

    def to_dict(self) -> dict:
        out = asdict(self)
        out["sources"] = list(self.sources)
        return out

    def summary(self) -> str:
        """One line in human units: µs, GB/s, ns/B."""
        def bw(beta: float) -> str:
            return "inf GB/s" if beta == 0 else f"{1 / beta / GB:.3g} GB/s"
        return (f"{self.name}: {self.ranks_per_node} ranks/node; intra α {self.alpha_intra * 1e6:.3g} µs, "
                f"{bw(self.beta_intra)} per rank; inter α {self.alpha_inter * 1e6:.3g} µs, "
                f"{self.nics} × {bw(self.beta_inter)}; γ {self.gamma * 1e9:.3g} ns/B"
                + (f" ({self.gamma_one * 1e9:.3g} with one rank per node)" if self.gamma_leader is not None else ""))


@dataclass(frozen=True)
class _Net:
    """p ranks in nodes of k consecutive ranks; `streams` copies of the collective run at once."""

    p: int
    k: int
    prm: Params
    streams: int = 1

    @property
    def nodes(self) -> int:
        return -(-self.p // self.k)

    @property
    def gamma(self) -> float:
        """γ of this group: a lone rank per node (leaders) may reduce faster than a busy node's ranks."""
        return self.prm.gamma_one if self.k == 1 and self.streams == 1 else self.prm.gamma

    def step(self, m: float, off_node: int) -> float:
        """One step of m bytes per pair; `off_node` ranks of each node talk across nodes."""
        P = self.prm
        intra = P.alpha_intra + m * P.beta_intra
        if off_node == 0 or self.nodes == 1:
            return intra
        flows = off_node * self.streams
        inter = P.alpha_inter + m * max(P.beta_inter, flows * P.beta_inter / P.nics)
        return inter if off_node >= min(self.k, self.p) else max(inter, intra)

    def off_xor(self, d: int) -> int:
        """Ranks of a node whose partner rank ^ d sits on another node (pairwise exchange)."""
        return 0 if self.nodes == 1 else _off_node_xor(self.k, d)

    def off_tree(self, d: int) -> int:
        """Ranks of a node sending across nodes in a binomial-tree step of distance d."""
        return 0 if self.nodes == 1 or d < self.k else 1


@lru_cache(maxsize=4096)
def _off_node_xor(k: int, d: int) -> int:
    return sum(1 for r in range(k) if (r ^ d) // k != 0)


def _pow2(p: int) -> tuple[int, int]:
    p2 = 1 << (p.bit_length() - 1)
    return p2, p - p2


def _distances(p: int) -> list[int]:
    return [1 << i for i in range(max(0, (p - 1).bit_length()))]  # 1, 2, 4, ... < p


def _fold_in(net: _Net, n: float) -> float:
    """Non-power-of-two p: the extra ranks first send their n bytes to a partner, which reduces."""
    return net.step(n, net.off_xor(1)) + n * net.gamma if _pow2(net.p)[1] else 0.0


def _fold_out(net: _Net, n: float) -> float:
    """... and at the end get the n-byte result back."""
    return net.step(n, net.off_xor(1)) if _pow2(net.p)[1] else 0.0


def _ring(net: _Net, n: float) -> float:
    p, m = net.p, n / net.p
    return 2 * (p - 1) * net.step(m, 1 if net.nodes > 1 else 0) + (p - 1) * m * net.gamma


def _recursive_doubling(net: _Net, n: float) -> float:
    p2 = _pow2(net.p)[0]
    steps = sum(net.step(n, net.off_xor(d)) + n * net.gamma for d in _distances(p2))
    return _fold_in(net, n) + _fold_out(net, n) + steps


def _reduce_scatter_halving(net: _Net, n: float) -> float:
    t, m = _fold_in(net, n), float(n)
    for d in _distances(_pow2(net.p)[0]):
        m /= 2
        t += net.step(m, net.off_xor(d)) + m * net.gamma
    return t


def _allgather_doubling(net: _Net, n: float) -> float:
    t, m = _fold_out(net, n), float(n)
    for d in _distances(_pow2(net.p)[0]):
        m /= 2
        t += net.step(m, net.off_xor(d))
    return t


def _rabenseifner(net: _Net, n: float) -> float:
    return _reduce_scatter_halving(net, n) + _allgather_doubling(net, n)


def _chain(net: _Net, n: float, reduce: bool) -> float:
    """Pipelined chain through all ranks: (p-N) intra and (N-1) inter hops of latency, n bytes at
    the slowest link's rate (asymptotic: no pipeline fill)."""
    P, N = net.prm, net.nodes
    beta = max(P.beta_intra, P.beta_inter * max(1.0, net.streams / P.nics)) if N > 1 else P.beta_intra
    return (net.p - N) * P.alpha_intra + (N - 1) * P.alpha_inter + n * beta + (n * net.gamma if reduce else 0.0)


def _tree_gather(net: _Net, n: float) -> float:
    """Binomial gather (or scatter) of n bytes in p blocks: d·n/p bytes at distance d."""
    return sum(net.step(d * n / net.p, net.off_tree(d)) for d in _distances(net.p))


def _reduce(net: _Net, n: float) -> float:
    if net.p == 1:
        return 0.0
    binomial = sum(net.step(n, net.off_tree(d)) + n * net.gamma for d in _distances(net.p))
    return min(binomial, _chain(net, n, True), _reduce_scatter_halving(net, n) + _tree_gather(net, n))


def _bcast(net: _Net, n: float) -> float:
    if net.p == 1:
        return 0.0
    binomial = sum(net.step(n, net.off_tree(d)) for d in _distances(net.p))
    return min(binomial, _chain(net, n, False), _tree_gather(net, n) + _allgather_doubling(net, n))


def _reduce_scatter(net: _Net, n: float) -> float:
    """Inside one node: ring (NCCL-style) or recursive halving, whichever is cheaper."""
    p, m = net.p, n / net.p
    ring = (p - 1) * (net.step(m, 0) + m * net.gamma)
    return min(ring, _reduce_scatter_halving(net, n))


def _allgather(net: _Net, n: float) -> float:
    p, m = net.p, n / net.p
    return min((p - 1) * net.step(m, 0), _allgather_doubling(net, n))


_FLAT = {"ring": _ring, "recursive_doubling": _recursive_doubling, "rabenseifner": _rabenseifner,
         "reduce_bcast": lambda net, n: _reduce(net, n) + _bcast(net, n)}


def _flat(net: _Net, n: float) -> float:
    return min(fn(net, n) for fn in _FLAT.values())


def _hierarchical(prm: Params, p: int, k: int, n: float, sharded: bool) -> float:
    node = _Net(k, k, prm)
    nodes = -(-p // k)
    if sharded:
        inside = _reduce_scatter(node, n) + _allgather(node, n) if k > 1 else 0.0
        across = _flat(_Net(nodes, 1, prm, streams=k), n / k) if nodes > 1 else 0.0
    else:
        inside = _reduce(node, n) + _bcast(node, n)
        across = _flat(_Net(nodes, 1, prm), n) if nodes > 1 else 0.0
    return inside + across


def _nccl_ring(prm: Params, p: int, k: int, n: float) -> float:
    multi = p > k
    beta = max(prm.beta_intra, prm.beta_inter / prm.nics) if multi else prm.beta_intra
    alpha = prm.alpha_inter if multi else prm.alpha_intra
    return 2 * (p - 1) * (alpha + n / p * beta) + (p - 1) / p * n * prm.gamma


def _nccl_tree(prm: Params, p: int, k: int, n: float) -> float:
    nodes = -(-p // k)
    beta = max(prm.beta_intra, prm.beta_inter / prm.nics) if nodes > 1 else prm.beta_intra
    hops = math.ceil(math.log2(nodes)) * prm.alpha_inter + (k - 1) * prm.alpha_intra
    return 2 * hops + 2 * n * beta + n * prm.gamma


def seconds(algorithm: str, prm: Params, p: int, k: int, n: float) -> float:
    """Seconds of one allreduce of ``n`` bytes per rank by ``algorithm`` (one of ``ALGORITHMS``) on
    ``p`` ranks in nodes of ``k`` (1 <= k <= p; arguments already checked by the caller)."""
    if p == 1:
        return 0.0
    if algorithm in ("hierarchical", "hierarchical_rs"):
        return _hierarchical(prm, p, k, n, algorithm == "hierarchical_rs")
    if algorithm == "nccl_ring":
        return _nccl_ring(prm, p, k, n)
    if algorithm == "nccl_tree":
        return _nccl_tree(prm, p, k, n)
    net = _Net(p, k, prm)
    return _flat(net, n) if algorithm == "flat" else _FLAT[algorithm](net, n)
