"""``auto``'s choice between flat and hierarchical (collectives/algorithms/choice.py): the pure rule
per size and topology, the settings that feed it, and the cost model it shares with tools/costmodel."""
from __future__ import annotations

import types

import pytest

from mpidist import rc
from mpidist._config import Settings
from mpidist.collectives import algorithms
from mpidist.collectives.algorithms import choice, cost, flat, hierarchical
from mpidist.collectives.algorithms.choice import Shape

SIZES = [1 << e for e in range(0, 31, 2)]  # 1 B ... 1 GiB
# (ranks, ranks of the largest node, nodes): the fake-node layout of the tests, a few real clusters
MULTI_NODE = [(4, 2, 2), (8, 4, 2), (16, 8, 2), (64, 8, 8), (256, 8, 32), (4096, 8, 512), (512, 128, 4),
              (4096, 128, 32)]
# a slow, high-latency network (10 Gb/s Ethernet through TCP, 20 µs a message) and fast shared memory
SLOW_NET = cost.Params("slow-net", 8, 0.2e-6, cost.gbyte(10), 20e-6, cost.gbit(10), 1, 3 / 20e9)


@pytest.mark.parametrize("ranks,per_node,nodes", [(1, 1, 1), (8, 8, 1), (8, 1, 8), (4096, 1, 4096)])
def test_one_node_or_one_rank_per_node_is_always_flat(ranks, per_node, nodes):
    for links in (choice.LINKS, SLOW_NET):
        for agreement in (True, False):
            assert {choice.auto(Shape(ranks, per_node, nodes, 1), n, None, agreement, links) for n in SIZES} \
                == {"flat"}
            assert choice.auto(Shape(ranks, per_node, nodes, 1), 1 << 30, 0, agreement, links) == "flat"


@pytest.mark.parametrize("ranks,per_node,nodes", MULTI_NODE)
@pytest.mark.parametrize("nics", [1, 2, 4, 8])
def test_default_links_choose_flat_from_1_mib(ranks, per_node, nodes, nics):
    """The old rule's band (hierarchical from 1 MiB) is where the model says hierarchical loses most:
    with the default links flat is cheaper there on every shape, and by more with more NICs."""
    shape = Shape(ranks, per_node, nodes, nics)
    for n in SIZES:
        f, h = choice.costs(shape, n)
        assert choice.auto(shape, n) == ("hierarchical" if h < f else "flat")
        if n >= 1 << 20:
            assert choice.auto(shape, n) == "flat" and h > f
            more = choice.costs(Shape(ranks, per_node, nodes, nics * 2), n)
            assert more[1] / more[0] >= h / f * 0.999  # more NICs: hierarchical no better (0.1%: the agreement)


def test_fake_node_layout_is_flat_at_every_size():
    """-n 4 with MPIDIST_LOCAL_SIZE=2, costed as two real nodes: flat everywhere (the default links
    are a CPU cluster's, not this machine's)."""
    assert {choice.auto(Shape(4, 2, 2, 1), n) for n in SIZES} == {"flat"}


@pytest.mark.parametrize("ranks,per_node,nodes", [(16, 8, 2), (64, 8, 8), (512, 128, 4), (4096, 8, 512)])
def test_slow_network_without_agreement_goes_hierarchical_in_one_middle_band(ranks, per_node, nodes):
    """Where the network's latency dominates and no agreement round trip is added, the leaders' path
    wins for buffers of a few KiB: tiny ones stay flat (hierarchical's two extra MPI calls cost more
    than they save), large ones too (the best flat algorithm moves fewer bytes through each NIC)."""
    shape = Shape(ranks, per_node, nodes, 1)
    got = [choice.auto(shape, n, None, False, SLOW_NET) for n in SIZES]
    assert got[0] == "flat" and got[-1] == "flat" and got[SIZES.index(1 << 12)] == "hierarchical", got
    switches = sum(a != b for a, b in zip(got, got[1:]))
    assert switches == 2, got
    for n, name in zip(SIZES, got):
        f, h = choice.costs(shape, n, False, SLOW_NET)
        assert (h < f) == (name == "hierarchical")
        # with the agreement's round trip (hierarchical is never speculated) it costs more
        assert choice.costs(shape, n, True, SLOW_NET)[1] > h


def test_hierarchical_cost_is_the_shared_formula_plus_mpidist_extras():
    shape = Shape(64, 8, 8, 2)
    prm = cost.Params(**{**choice.LINKS.__dict__, "nics": 2})
    for n in (1 << 10, 1 << 20, 1 << 28):
        f, h = choice.costs(shape, n)
        assert f == cost.seconds("flat", prm, 64, 8, float(n))
        extra = 2 * choice.CALL_SECONDS + cost.seconds("flat", prm, 64, 8, float(choice.AGREEMENT_BYTES))
        assert h == pytest.approx(cost.seconds("hierarchical", prm, 64, 8, float(n)) + extra, rel=1e-12)


def test_tools_costmodel_predicts_with_the_same_formulas():
    from tools.costmodel.model import predict  # tools/ is at the repository root
    prm = cost.Params(**{**choice.LINKS.__dict__, "ranks_per_node": 8})
    for algorithm in cost.ALGORITHMS:
        assert predict(algorithm, 1 << 20, 64, 8, prm) == cost.seconds(algorithm, prm, 64, 8, float(1 << 20))


def test_a_threshold_restores_the_fixed_rule():
    shape = Shape(8, 4, 2, 1)
    assert [choice.auto(shape, n, 1 << 20) for n in ((1 << 20) - 1, 1 << 20)] == ["flat", "hierarchical"]
    assert choice.auto(shape, 1, 0) == "hierarchical"


def _topo(size: int, node_sizes: tuple[int, ...]):
    return types.SimpleNamespace(size=size, num_nodes=len(node_sizes), node_sizes=node_sizes,
                                 largest_node=max(node_sizes), multi_node=1 < len(node_sizes) < size)


def test_choose_reads_rc_and_an_explicit_algorithm_wins():
    topo = _topo(4096, (128,) * 32)  # the one default-links shape with a hierarchical band (no agreement)
    small = next(n for n in SIZES if choice.auto(Shape(4096, 128, 32, 1), n, None, False) == "hierarchical")
    assert choice.auto(Shape(4096, 128, 32, 1), small, None, True) == "flat"
    with rc.override(hierarchical_threshold=None, nics_per_node=1, check_agreement=True):
        assert algorithms.choose("auto", topo, small) is flat
    with rc.override(hierarchical_threshold=None, nics_per_node=1, check_agreement=False):
        assert algorithms.choose("auto", topo, small) is hierarchical
        assert algorithms.choose("flat", topo, small) is flat
        assert algorithms.choose("auto", topo, 1 << 26) is flat
        assert algorithms.choose("hierarchical", topo, 1 << 26) is hierarchical
        assert "cost model" in algorithms.auto_reason(topo)
    with rc.override(hierarchical_threshold=1 << 20):
        assert algorithms.choose("auto", topo, 1 << 26) is hierarchical
        assert algorithms.choose("auto", topo, small) is flat
        assert algorithms.choose("auto", _topo(8, (8,)), 1 << 26) is flat
        assert "hierarchical_threshold" in algorithms.auto_reason(topo)


def test_settings_from_the_environment():
    s = Settings({"MPIDIST_NICS_PER_NODE": "4", "MPIDIST_HIERARCHICAL_THRESHOLD": "1048576"})
    assert (s.nics_per_node, s.hierarchical_threshold) == (4, 1 << 20)
    s = Settings({"MPIDIST_HIERARCHICAL_THRESHOLD": "model"})
    assert (s.nics_per_node, s.hierarchical_threshold) == (1, None)
    with pytest.raises(ValueError, match="`MPIDIST_NICS_PER_NODE` must be an integer >= 1, got '0'"):
        Settings({"MPIDIST_NICS_PER_NODE": "0"})
    with pytest.raises(ValueError, match="`nics_per_node` must be"):
        Settings({}).nics_per_node = -1


def test_summary_in_words():
    assert choice.summary(choice.bands(Shape(4, 2, 2, 1))) == "flat at every size"
    assert choice.summary(choice.bands(Shape(8, 8, 1, 1))) == "flat at every size"
    rows = choice.bands(Shape(64, 8, 8, 1), None, False, SLOW_NET)
    hier = [n for n, name, _, _ in rows if name == "hierarchical"]
    assert hier and choice.summary(rows) == \
        f"hierarchical at {choice.size_text(hier[0])} to {choice.size_text(hier[-1])}, flat otherwise"
