"""allgather with ragged first dimensions and reduce_scatter, against NumPy over all ranks' inputs."""
from __future__ import annotations

import numpy as np
import pytest

from mpidist.collectives.reduce_scatter import block_rows
from reference import ALGORITHMS, DTYPES, OPS, assert_same, make, reduce_all, valid

pytestmark = [pytest.mark.mpi, pytest.mark.node_layout, pytest.mark.two_nodes]


def rows(rank: int) -> int:
    return (rank * 3 + 1) % 4  # 1, 0, 3, 2: includes a rank with no rows


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_allgather_ragged(engine, dtype, algorithm):
    def value(r):
        return {"v": make(r, dtype, (rows(r),), seed=1), "m": make(r, dtype, (rows(r) + 1, 3), seed=2)}
    result = engine.allgather(value(engine.rank), algorithm=algorithm)
    for key in ("v", "m"):
        assert_same(result[key], np.concatenate([value(r)[key] for r in range(engine.size)]))


@pytest.mark.parametrize("packing", [dict(), dict(bytes_per_pack=40), dict(num_packs=2), dict(num_packs=0)])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_allgather_many_leaves(engine, packing, algorithm):
    def value(r):
        return [make(r, [np.float32, np.int16, np.bool_][i % 3], (rows(r) + i % 2, i % 4 + 1), seed=i)
                for i in range(30)]
    result = engine.allgather(value(engine.rank), algorithm=algorithm, **packing)
    everyone = [value(r) for r in range(engine.size)]
    for i, got in enumerate(result):
        assert_same(got, np.concatenate([v[i] for v in everyone]))


def test_allgather_large(engine):
    inputs = [make(r, np.float64, (100_000 + r, 2)) for r in range(engine.size)]
    assert_same(engine.allgather(inputs[engine.rank]), np.concatenate(inputs))


def test_allgather_rejects_scalars_on_every_rank(engine):
    with pytest.raises(ValueError, match="allgather: leaf 0 of `value` is 0-d"):
        engine.allgather(np.float32(1.0))


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", [np.bool_, np.int64, np.float16, np.float32, np.complex128],
                         ids=lambda d: np.dtype(d).name)
def test_reduce_scatter(engine, dtype, op, algorithm):
    if not valid(dtype, op):
        return
    shapes = [(7,), (9, 2), (engine.size * 2, 3), (1,)]
    result = engine.reduce_scatter([make(engine.rank, dtype, s, op, seed=5) for s in shapes], op,
                                   algorithm=algorithm)
    for got, shape in zip(result, shapes):
        whole = reduce_all([make(r, dtype, shape, op, seed=5) for r in range(engine.size)], op)
        bounds = np.concatenate([[0], np.cumsum(block_rows(shape[0], engine.size))])
        assert_same(got, whole[bounds[engine.rank]:bounds[engine.rank + 1]])


def test_reduce_scatter_blocks_follow_array_split(engine):
    x = np.arange(11.0)
    expected = np.array_split(x * engine.size, engine.size)[engine.rank]
    assert_same(engine.reduce_scatter(x), expected)
