"""broadcast from every root and reduce to every root, against NumPy over all ranks' inputs."""
from __future__ import annotations

import numpy as np
import pytest

from reference import ALGORITHMS, DTYPES, OPS, SHAPES, assert_same, make, reduce_all, valid

pytestmark = [pytest.mark.mpi, pytest.mark.node_layout, pytest.mark.two_nodes]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_broadcast_every_root(engine, dtype, algorithm):
    for root in range(engine.size):
        value = {name: make(engine.rank, dtype, shape, seed=7) for name, shape in SHAPES.items()}
        result = engine.broadcast(value, root=root, algorithm=algorithm)
        for name, shape in SHAPES.items():
            assert_same(result[name], make(root, dtype, shape, seed=7))


@pytest.mark.parametrize("packing", [dict(), dict(bytes_per_pack=64), dict(num_packs=2), dict(num_packs=0)])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_broadcast_mixed_nest_and_large(engine, packing, algorithm):
    root = engine.size - 1
    def value(r):
        return [make(r, np.bool_, (3,)), make(r, np.float16, (5,)), (make(r, np.complex128, (2, 2)),),
                make(r, np.float32, (300_000,)), {"k": make(r, np.int8, (7,))}]
    result = engine.broadcast(value(engine.rank), root, algorithm=algorithm, **packing)
    expected = value(root)
    for got, want in zip([result[0], result[1], result[2][0], result[3], result[4]["k"]],
                         [expected[0], expected[1], expected[2][0], expected[3], expected[4]["k"]]):
        assert_same(got, want)


def test_broadcast_root_gets_its_own_arrays(engine):
    x = np.arange(5.0)
    out = engine.broadcast(x, root=0)
    assert (out is x) == (engine.rank == 0)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [np.bool_, np.int32, np.uint8, np.float16, np.float64, np.complex64],
                         ids=lambda d: np.dtype(d).name)
def test_reduce_every_root(engine, dtype, op, algorithm):
    if not valid(dtype, op):
        return
    for root in range(engine.size):
        value = [make(engine.rank, dtype, shape, op, seed=3) for shape in SHAPES.values()]
        result = engine.reduce(value, op, root=root, algorithm=algorithm)
        if engine.rank != root:
            assert result is None
            continue
        for got, shape in zip(result, SHAPES.values()):
            assert_same(got, reduce_all([make(r, dtype, shape, op, seed=3) for r in range(engine.size)], op))


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_reduce_large_to_last_rank(engine, algorithm):
    root = engine.size - 1
    inputs = [make(r, np.float32, (300_000,)) for r in range(engine.size)]
    result = engine.reduce(inputs[engine.rank], "max", root=root, algorithm=algorithm)
    if engine.rank == root:
        assert_same(result, reduce_all(inputs, "max"))
    else:
        assert result is None
