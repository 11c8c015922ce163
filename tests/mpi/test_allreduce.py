"""allreduce against NumPy over all ranks' inputs: every op, dtype, shape kind and algorithm."""
from __future__ import annotations

import collections

import numpy as np
import pytest

import mpidist
from reference import ALGORITHMS, DTYPES, OPS, SHAPES, assert_same, make, reduce_all, valid

pytestmark = [pytest.mark.mpi, pytest.mark.node_layout, pytest.mark.two_nodes]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_every_op_dtype_shape(engine, dtype, op, algorithm):
    if not valid(dtype, op):
        with pytest.raises(TypeError, match="allreduce: leaf 0 of `value` has dtype"):
            engine.allreduce({"a": make(engine.rank, dtype, (2,))}, op, algorithm=algorithm)
        return
    value = {name: make(engine.rank, dtype, shape, op) for name, shape in SHAPES.items()}
    result = engine.allreduce(value, op, algorithm=algorithm)
    assert list(result) == list(value)
    for name, shape in SHAPES.items():
        expected = reduce_all([make(r, dtype, shape, op) for r in range(engine.size)], op)
        assert_same(result[name], expected)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("timeout", [None, 60.0])
def test_large_buffer_single_array(engine, algorithm, timeout):
    # 1.2 MB: "auto" takes what the cost model picks for this layout (flat with the default links;
    # test_algorithm_choice.py covers both of auto's outcomes)
    inputs = [make(r, np.float32, (300_001,)) for r in range(engine.size)]
    result = engine.allreduce(inputs[engine.rank], "sum", algorithm=algorithm, timeout_seconds=timeout)
    assert_same(result, reduce_all(inputs, "sum"))


Pair = collections.namedtuple("Pair", "left right")
PACKINGS = [dict(), dict(bytes_per_pack=1), dict(bytes_per_pack=300), dict(bytes_per_pack=1 << 20),
            dict(num_packs=0), dict(num_packs=1), dict(num_packs=3)]


def _nest(rank: int, op: str):
    dtypes = [np.float32, np.float64, np.int32, np.float16, np.int8 if op == "mean" else np.bool_, np.int64]
    leaves = [make(rank, dtypes[i % len(dtypes)], (i % 7, 3) if i % 5 else (i,), op, seed=i) for i in range(100)]
    return {"layers": [Pair(leaves[i], leaves[i + 1]) for i in range(0, 60, 2)],
            "bias": tuple(leaves[60:80]), "z": {str(i): leaves[i] for i in range(80, 100)}}


@pytest.mark.parametrize("packing", PACKINGS, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()) or "auto")
@pytest.mark.parametrize("op", ["sum", "max", "mean"])
def test_many_tensor_nest(engine, packing, op):
    mine = _nest(engine.rank, op)
    result = engine.allreduce(mine, op, **packing)
    leaves_in = [mpidist.collectives.nest.flatten(_nest(r, op))[0] for r in range(engine.size)]
    leaves_out, tree = mpidist.collectives.nest.flatten(result)
    assert mpidist.collectives.nest.structure_key(tree) == \
        mpidist.collectives.nest.structure_key(mpidist.collectives.nest.flatten(mine)[1])
    assert isinstance(result["layers"][0], Pair) and isinstance(result["bias"], tuple)
    for i, out in enumerate(leaves_out):
        assert_same(out, reduce_all([leaves[i] for leaves in leaves_in], op))


def test_bool_mean_in_nest_is_refused(engine):
    with pytest.raises(TypeError, match="op MEAN needs a numeric dtype"):
        engine.allreduce([np.ones(2), np.ones(2, bool)], "mean")


def test_python_and_numpy_scalars_keep_their_type(engine):
    n = engine.size
    out = engine.allreduce({"f": 1.5, "i": 2, "b": engine.rank == 0, "np": np.float32(0.5), "c": 1j})
    assert out == {"f": 1.5 * n, "i": 2 * n, "b": True, "np": np.float32(0.5 * n), "c": 1j * n}
    assert type(out["f"]) is float and type(out["i"]) is int and type(out["b"]) is bool
    assert type(out["np"]) is np.float32 and type(out["c"]) is complex


def test_non_contiguous_input(engine):
    inputs = [(np.arange(40, dtype=np.float64) * (r + 1)).reshape(8, 5)[::2, 1::2] for r in range(engine.size)]
    assert not inputs[engine.rank].flags.c_contiguous
    assert_same(engine.allreduce(inputs[engine.rank]), reduce_all(inputs, "sum"))


def test_input_is_not_modified(engine):
    x = make(engine.rank, np.float32, (1000,))
    before = x.copy()
    engine.allreduce(x, "mean")
    engine.allreduce([x, x], "sum")
    np.testing.assert_array_equal(x, before)


def test_op_names_and_enum(engine):
    x = np.array([engine.rank + 1.0])
    assert engine.allreduce(x, "SUM")[0] == engine.allreduce(x, mpidist.Op.SUM)[0] == \
        sum(range(1, engine.size + 1))
    assert engine.allreduce(x, "Product")[0] == np.prod(np.arange(1, engine.size + 1))
    assert engine.allreduce(x, mpidist.ReduceOp.MAX)[0] == engine.allreduce(x, "max")[0] == engine.size


def test_call_options_object_and_keywords_mean_the_same(engine):
    """options=CallOptions(...) and the keyword arguments are one per-call options type."""
    from mpidist.collectives import CallOptions
    values = [np.full(5, engine.rank, np.float64), np.arange(3, dtype=np.int32) * engine.rank]
    expected = [np.full(5, sum(range(engine.size)), np.float64),
                np.arange(3, dtype=np.int32) * sum(range(engine.size))]
    for kwargs in ({"options": CallOptions(bytes_per_pack=16, algorithm="flat", timeout_seconds=30)},
                   {"bytes_per_pack": np.int64(16), "algorithm": "flat", "timeout_seconds": np.float32(30)},
                   {"options": CallOptions(num_packs=0), "timeout_seconds": 0},  # keywords over options
                   {"options": CallOptions(bytes_per_pack=16), "num_packs": 2}):
        for result, want in zip(engine.allreduce(values, **kwargs), expected):
            assert_same(result, want)
        assert engine.allgather(values[0], **kwargs).shape == (5 * engine.size,)
    with pytest.raises(TypeError, match="allreduce: `options` must be a CallOptions or None, got dict"):
        engine.allreduce(values, options={"bytes_per_pack": 16})
    with pytest.raises(ValueError, match="broadcast: `num_packs` must be an integer >= 0, got -1"):
        engine.broadcast(values, num_packs=-1)
    with pytest.raises(ValueError, match="reduce: `root` must be a rank in \\[0, .*\\), got True"):
        engine.reduce(values, root=True)


def test_large_results_kept_alive_are_never_recycled(engine):
    """Result buffers are pooled; one still referenced (or viewed) must never be handed out again."""
    n = engine.size
    kept = [engine.allreduce(np.full(100_000, i, dtype=np.float32)) for i in range(4)]
    view = engine.allreduce(np.full(100_000, 9, dtype=np.float32))[5:10]
    for _ in range(3):
        engine.allreduce(np.full(100_000, -1, dtype=np.float32))  # dropped at once: recycled
    for i, result in enumerate(kept):
        assert (result == i * n).all()
    assert (view == 9 * n).all()


@pytest.mark.parametrize("op", OPS)
def test_repeated_plain_calls_take_the_cached_path(engine, op):
    """The second and later plain calls of a signature skip validation; results must not change."""
    inputs = [make(r, np.int32, (6,), op) for r in range(engine.size)]
    expected = reduce_all(inputs, op)
    for _ in range(3):
        assert_same(engine.allreduce(inputs[engine.rank], op), expected)
    assert engine.pipeline.fast.lookup(op, inputs[engine.rank]) is not None
    with mpidist.rc.override(check_agreement=False):  # a settings change drops the cached entry
        assert_same(engine.allreduce(inputs[engine.rank], op), expected)


LIST_CASES = {
    "one dtype": [((1024,), np.float32)] * 12,
    "two dtypes, one large leaf alone": [((5, 3), np.float64), ((7,), np.int64), ((20_000,), np.float64),
                                         ((2, 2), np.int64), ((1,), np.float64)],
    "scalars and empty leaves": [((), np.float32), ((0,), np.float32), ((4, 0), np.float32), ((3,), np.float32)],
}


def _nested(leaves: list, shape: str):
    """The same leaves in a nest of nests of the named shape (a dict's keys not in sorted order)."""
    half = len(leaves) // 2
    if shape == "dict of lists":
        return {"b": list(leaves[half:]), "a": list(leaves[:half])}
    if shape == "(list, array)":  # what reduce(..., axis=k) MEAN sends: (partials, counts)
        return (list(leaves[:-1]), leaves[-1])
    if shape == "list of dicts and arrays":
        return [{f"k{i}": a for i, a in enumerate(leaves[:half])}, leaves[half], tuple(leaves[half + 1:])]
    raise ValueError(shape)


NESTED = ["dict of lists", "(list, array)", "list of dicts and arrays"]


@pytest.mark.parametrize("kind", [list, tuple])
@pytest.mark.parametrize("case", LIST_CASES)
@pytest.mark.parametrize("op", OPS)
def test_repeated_lists_take_the_cached_path(engine, case, kind, op):
    """A list/tuple of arrays (gradients, every step) is cached after its first call: results equal the
    NumPy reference on every call, earlier results stay intact, and the cache is really used."""
    specs = LIST_CASES[case]
    inputs = [kind(make(r, d, s, op, seed=i) for i, (s, d) in enumerate(specs)) for r in range(engine.size)]
    expected = [reduce_all([inputs[r][i] for r in range(engine.size)], op) for i in range(len(specs))]
    kept = []
    for step in range(3):
        result = engine.allreduce(inputs[engine.rank], op)
        assert type(result) is kind and len(result) == len(specs)
        kept.append(result)
        if step == 0:
            assert engine.pipeline.fast.lookup(op, inputs[engine.rank]) is not None
    for result in kept:  # results of earlier steps were not overwritten by later ones
        for got, want in zip(result, expected):
            assert_same(got, want)


@pytest.mark.parametrize("case", LIST_CASES)
@pytest.mark.parametrize("op", OPS)
def test_repeated_dicts_take_the_cached_path(engine, case, op):
    """A dict of arrays (metrics, named gradients) is cached too: every rank builds its dict in another
    key order (agreement and packing follow sorted keys), results equal the NumPy reference in the
    caller's key order, earlier results stay intact, and the cache is really used."""
    specs = LIST_CASES[case]
    names = [f"leaf{i:02d}" for i in range(len(specs))]
    inputs = [{n: make(r, d, s, op, seed=i) for i, (n, (s, d)) in enumerate(zip(names, specs))}
              for r in range(engine.size)]
    mine = dict(sorted(inputs[engine.rank].items(), key=lambda item: hash((item[0], engine.rank))))
    expected = {n: reduce_all([inputs[r][n] for r in range(engine.size)], op) for n in names}
    kept = []
    for step in range(3):
        result = engine.allreduce(mine, op)
        assert type(result) is dict and list(result) == list(mine)
        kept.append(result)
        if step == 0:
            assert engine.pipeline.fast.lookup(op, mine) is not None
    for result in kept:
        for n in names:
            assert_same(result[n], expected[n])


@pytest.mark.parametrize("kind", [list, tuple, dict] + NESTED)
@pytest.mark.parametrize("op", ["sum", "mean"])
def test_cached_nests_are_bit_identical_to_the_general_path(engine, kind, op):
    """Random float32 leaves (sums that round): the cached path's results are the general path's, bit
    for bit (the same plan, packs and MPI calls), for 100 leaves of 4 KB and mixed shapes."""
    rng = np.random.default_rng(engine.rank)
    shapes = [(1024,)] * 100 + [(3, 5), (2, 2, 2), (20_000,), ()]
    leaves = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    value = {f"w{i:03d}": a for i, a in enumerate(leaves)} if kind is dict else \
        _nested(leaves, kind) if isinstance(kind, str) else kind(leaves)
    general = engine.allreduce(value, op, bytes_per_pack=mpidist.rc.bytes_per_pack)  # not plain: never cached
    for _ in range(3):
        cached = engine.allreduce(value, op)
    assert engine.pipeline.fast.lookup(op, value) is not None
    flatten = mpidist.collectives.nest.flatten
    pairs = list(zip(flatten(cached)[0], flatten(general)[0]))
    assert len(pairs) == len(leaves)
    for got, want in pairs:
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize("shape", NESTED)
@pytest.mark.parametrize("op", OPS)
def test_repeated_nests_of_nests_take_the_cached_path(engine, shape, op):
    """A nest of nests of arrays is cached too (per structure): results equal the NumPy reference in
    the caller's structure, earlier results stay intact, and the cache is really used."""
    specs = LIST_CASES["two dtypes, one large leaf alone"] * 2
    inputs = [[make(r, d, s, op, seed=i) for i, (s, d) in enumerate(specs)] for r in range(engine.size)]
    expected = _nested([reduce_all([inputs[r][i] for r in range(engine.size)], op) for i in range(len(specs))], shape)
    mine = _nested(inputs[engine.rank], shape)
    kept = []
    for step in range(3):
        kept.append(engine.allreduce(mine, op))
        if step == 0:
            assert engine.pipeline.fast.lookup(op, mine) is not None
    for result in kept:
        got, want = mpidist.collectives.nest.flatten(result), mpidist.collectives.nest.flatten(expected)
        assert mpidist.collectives.nest.structure_key(got[1]) == mpidist.collectives.nest.structure_key(want[1])
        assert type(result) is type(expected)
        for g, w in zip(got[0], want[0]):
            assert_same(g, w)


def test_cached_list_path_with_non_contiguous_leaves(engine):
    base = np.arange(40, dtype=np.float32).reshape(4, 10) + engine.rank
    value = [base[:, ::2], base.T, base[1]]
    expected = [a * engine.size + sum(range(engine.size)) - engine.rank * engine.size for a in value]
    for _ in range(3):
        for got, want in zip(engine.allreduce(value), expected):
            np.testing.assert_array_equal(got, want)
            assert got.flags.c_contiguous


def test_cached_list_path_is_not_used_for_conversions_or_deadlines(engine):
    halves = [np.ones(3, np.float16), np.ones(2, np.float16)]
    for _ in range(2):
        assert [r.dtype for r in engine.allreduce(halves)] == [np.float16, np.float16]
    assert engine.pipeline.fast.lookup("sum", halves) is None  # float16 travels as float32: general path
    x = [np.ones(3), np.ones(4)]
    with mpidist.rc.override(timeout_seconds=30):
        for _ in range(2):
            assert engine.allreduce(x)[1][0] == engine.size
        assert engine.pipeline.fast.lookup("sum", x) is None
