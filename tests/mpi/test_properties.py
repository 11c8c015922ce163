"""Property-based: random nests, dtypes, shapes and packings through the collectives, against NumPy.

Hypothesis is derandomized and does not shrink, so every rank draws the same examples in the same
order (each rank derives its own data from the example and its rank); a failure on one rank still
leaves the ranks in step, and the agreement check turns any drift into an error, never a hang.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

from reference import assert_same, make, reduce_all

pytestmark = [pytest.mark.mpi, pytest.mark.node_layout, pytest.mark.two_nodes]

DTYPES = [np.int8, np.int32, np.int64, np.uint16, np.float16, np.float32, np.float64, np.complex64, np.bool_]
SETTINGS = settings(derandomize=True, database=None, max_examples=40, deadline=None, phases=[Phase.generate],
                    suppress_health_check=list(HealthCheck))

leaf_specs = st.tuples(st.sampled_from(DTYPES), st.lists(st.integers(0, 5), min_size=0, max_size=3).map(tuple))
nests = st.recursive(
    leaf_specs,
    lambda children: st.one_of(st.lists(children, min_size=1, max_size=4),
                               st.dictionaries(st.sampled_from("abcdefg"), children, min_size=1, max_size=4)),
    max_leaves=12)
packings = st.sampled_from([{}, {"bytes_per_pack": 1}, {"bytes_per_pack": 64}, {"num_packs": 0}, {"num_packs": 2}])
algorithms = st.sampled_from(["flat", "hierarchical", "auto"])


def build(spec, rank: int, op: str, seed: list[int]):
    if isinstance(spec, list):
        return [build(s, rank, op, seed) for s in spec]
    if isinstance(spec, dict):
        return {k: build(v, rank, op, seed) for k, v in spec.items()}
    dtype, shape = spec
    seed[0] += 1
    return make(rank, dtype, shape, op, seed=seed[0])


def leaves(value):
    if isinstance(value, list):
        return [x for v in value for x in leaves(v)]
    if isinstance(value, dict):
        return [x for k in sorted(value) for x in leaves(value[k])]
    return [value]


@SETTINGS
@given(spec=nests, op=st.sampled_from(["sum", "max", "prod"]), packing=packings, algorithm=algorithms)
def test_allreduce_random_nests(engine, spec, op, packing, algorithm):
    value = build(spec, engine.rank, op, [0])
    if op == "max" and any(np.asarray(leaf).dtype.kind == "c" for leaf in leaves(value)):
        with pytest.raises(TypeError, match="op MAX is not defined for complex numbers"):
            engine.allreduce(value, op, algorithm=algorithm, **packing)  # on every rank, before any message
        return
    result = engine.allreduce(value, op, algorithm=algorithm, **packing)
    everyone = [leaves(build(spec, r, op, [0])) for r in range(engine.size)]
    for i, got in enumerate(leaves(result)):
        assert_same(got, reduce_all([e[i] for e in everyone], op))


@SETTINGS
@given(spec=nests, packing=packings, algorithm=algorithms, root_pick=st.integers(0, 1000))
def test_broadcast_random_nests(engine, spec, packing, algorithm, root_pick):
    root = root_pick % engine.size
    result = engine.broadcast(build(spec, engine.rank, "sum", [0]), root=root, algorithm=algorithm, **packing)
    for got, want in zip(leaves(result), leaves(build(spec, root, "sum", [0]))):
        assert_same(np.asarray(got), want)


@SETTINGS
@given(dtypes=st.lists(st.sampled_from(DTYPES), min_size=1, max_size=5),
       tails=st.lists(st.integers(0, 3), max_size=2).map(tuple), packing=packings, algorithm=algorithms)
def test_allgather_random_ragged(engine, dtypes, tails, packing, algorithm):
    def value(r):
        return [make(r, d, ((r * 7 + i) % 4,) + tails, seed=i) for i, d in enumerate(dtypes)]
    result = engine.allgather(value(engine.rank), algorithm=algorithm, **packing)
    for i, got in enumerate(result):
        assert_same(got, np.concatenate([value(r)[i] for r in range(engine.size)]))
