"""Pure helpers of the collectives layer: nests, pack plans, packing, op and dtype rules."""
from __future__ import annotations

import collections

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from mpidist.collectives import nest, packing
from mpidist.collectives.ops import Op, finish_mean, parse_op, wire_dtype

P = collections.namedtuple("P", "x y")


def test_flatten_unflatten_roundtrip_keeps_container_types():
    value = {"b": [1, (2, 3)], "a": P(4, {"z": 5, "y": 6}), "c": collections.OrderedDict(k=7)}
    leaves, tree = nest.flatten(value)
    assert leaves == [4, 6, 5, 1, 2, 3, 7]  # dict keys sorted
    rebuilt = nest.unflatten(tree, [x * 10 for x in leaves])
    assert rebuilt == {"b": [10, (20, 30)], "a": P(40, {"z": 50, "y": 60}), "c": {"k": 70}}
    assert list(rebuilt) == ["b", "a", "c"] and isinstance(rebuilt["a"], P)
    assert isinstance(rebuilt["c"], collections.OrderedDict)


def test_structure_key_ignores_dict_insertion_order():
    k1 = nest.structure_key(nest.flatten({"a": 1, "b": [1, 2]})[1])
    k2 = nest.structure_key(nest.flatten({"b": [1, 2], "a": 1})[1])
    assert k1 == k2 == "{'a':*,'b':[*,*]}"
    assert nest.structure_key(nest.flatten((1, P(1, 2)))[1]) == "(*,P(*,*))"


def test_plan_auto_fuses_every_leaf_up_to_the_fusion_threshold():
    """Automatic packing fuses large leaves too (a ResNet-50 step in 2 packs, not 54 calls): packs of
    up to FUSION_BYTES per dtype, in order; a leaf over the threshold travels alone."""
    limit = packing.FUSION_BYTES
    nb = [100, 1 << 20, 200, 300]
    assert packing.plan(nb, ["f"] * 4, 0, None) == [[0, 1, 2, 3]]
    assert packing.plan(nb, ["f", "f", "i", "f"], 0, None) == [[0, 1, 3], [2]]
    half = limit // 2
    assert packing.plan([half, half, 1, half], ["f"] * 4, 0, None) == [[0, 1], [2, 3]]  # exactly full, then next
    assert packing.plan([10, limit + 1, 20], ["f"] * 3, 0, None) == [[1], [0, 2]]  # too big: alone
    assert packing.plan([10, limit, 20], ["f"] * 3, 0, None) == [[1], [0, 2]]  # a full pack by itself


def test_plan_bytes_per_pack_and_num_packs():
    nb = [10] * 10
    assert packing.plan(nb, [0] * 10, 30, None) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert packing.plan(nb, [0] * 10, 0, 0) == [[i] for i in range(10)]
    assert packing.plan(nb, [0] * 10, 0, 1) == [list(range(10))]
    assert [len(p) for p in packing.plan(nb, [0] * 10, 0, 3)] == [4, 3, 3]
    assert packing.plan([5, 5], [0, 0], 0, 7) == [[0], [1]]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 5000), max_size=40), st.integers(0, 3), st.integers(0, 6000),
       st.one_of(st.none(), st.integers(0, 8)))
def test_plan_is_a_partition_in_order(nbytes, ngroups, bpp, num_packs):
    groups = [i % (ngroups + 1) for i in range(len(nbytes))]
    packs = packing.plan(nbytes, groups, bpp, num_packs)
    assert sorted(i for p in packs for i in p) == list(range(len(nbytes)))
    for p in packs:
        assert p == sorted(p) and len({groups[i] for i in p}) == 1
        if num_packs is None and bpp and len(p) > 1:
            assert sum(nbytes[i] for i in p) <= bpp


def test_pack_single_array_is_a_view_and_unpack_restores():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert np.shares_memory(packing.pack([a], np.dtype(np.float32)), a)
    b = np.array([True, False])
    buf = packing.pack([a, np.arange(3, dtype=np.float32)], np.dtype(np.float32))
    out = packing.unpack(buf, [(3, 4), (3,)], [np.dtype(np.float32)] * 2)
    np.testing.assert_array_equal(out[0], a)
    assert np.shares_memory(out[0], buf)
    wire = packing.pack([b], np.dtype(np.uint8))
    assert np.shares_memory(wire, b)
    assert packing.unpack(wire, [(2,)], [np.dtype(bool)])[0].tolist() == [True, False]


def test_byte_layout_aligns():
    offsets, total = packing.byte_layout([3, 16, 1])
    assert offsets == [0, 16, 32] and total == 48


def test_parse_op():
    assert parse_op("Sum", "f") is Op.SUM and parse_op("product", "f") is Op.PROD
    import enum

    class ReduceOp(enum.Enum):
        MEAN = "MEAN"
    assert parse_op(ReduceOp.MEAN, "f") is Op.MEAN
    with pytest.raises(ValueError, match="f: `op` must be one of SUM, MEAN, MIN, MAX, PROD, got 'avgg'"):
        parse_op("avgg", "f")


def test_op_and_reduce_op_are_one_class_and_every_spelling_works():
    import enum

    import mpidist
    from mpidist.cross_device import ReduceOp, as_reduce_op
    assert mpidist.Op is mpidist.ReduceOp is ReduceOp is Op
    assert Op.SUM is ReduceOp.SUM and ReduceOp.SUM.value == "SUM"  # TensorFlow's values

    class TfReduceOp(enum.Enum):  # what tf.distribute.ReduceOp looks like
        SUM = "SUM"
        MEAN = "MEAN"

    class Aggregation(enum.Enum):  # tf.VariableAggregation: names, integer values
        SUM = 1
        MEAN = 2
        ONLY_FIRST_REPLICA = 3

    for spelling, expected in [("sum", Op.SUM), ("SUM", Op.SUM), (" Mean ", Op.MEAN), ("avg", Op.MEAN),
                               ("average", Op.MEAN), ("product", Op.PROD), (Op.MAX, Op.MAX),
                               (ReduceOp.MIN, Op.MIN), (TfReduceOp.SUM, Op.SUM), (TfReduceOp.MEAN, Op.MEAN)]:
        assert parse_op(spelling, "f") is expected
        assert as_reduce_op(spelling, "g") is expected
        assert ReduceOp(spelling) is expected
    assert ReduceOp.from_variable_aggregation(Aggregation.MEAN) is Op.MEAN
    with pytest.raises(ValueError, match="from_variable_aggregation: `aggregation` must be SUM or MEAN"):
        ReduceOp.from_variable_aggregation(Aggregation.ONLY_FIRST_REPLICA)
    with pytest.raises(ValueError, match="g: `reduce_op` must be one of SUM, MEAN, MIN, MAX, PROD, got 'sump'"):
        as_reduce_op("sump", "g")
    with pytest.raises(ValueError):
        ReduceOp("sump")


def test_wire_dtypes_and_errors():
    assert wire_dtype(np.dtype(np.float16), Op.SUM, "f", "x") == np.float32
    assert wire_dtype(np.dtype(bool), Op.MAX, "f", "x") == np.uint8
    with pytest.raises(TypeError, match="f: x has dtype complex64; op MIN is not defined for complex"):
        wire_dtype(np.dtype(np.complex64), Op.MIN, "f", "x")
    with pytest.raises(TypeError, match="f: x has dtype object; expected a numeric or bool dtype"):
        wire_dtype(np.dtype(object), Op.SUM, "f", "x")
    with pytest.raises(TypeError, match="expected a numeric or bool dtype"):
        wire_dtype(np.dtype("U3"), Op.SUM, "f", "x")


def test_integer_mean_truncates_toward_zero():
    x = np.array([-7, 7, -8, 5], dtype=np.int32)
    finish_mean(x, 2)
    assert x.tolist() == [-3, 3, -4, 2]
    u = np.array([7], dtype=np.uint8)
    finish_mean(u, 2)
    assert u.tolist() == [3]


def test_buffer_pool_reuses_only_dropped_blocks():
    from mpidist.collectives import buffers
    n = buffers.MIN_BYTES // 4
    a = buffers.empty(n, np.dtype(np.float32))
    a[:] = 1
    view = a[10:20]
    address = a.__array_interface__["data"][0]
    del a
    b = buffers.empty(n, np.dtype(np.float32))  # a view of the first block is alive: new block
    assert b.__array_interface__["data"][0] != address
    b[:] = 2
    assert (view == 1).all()
    del view
    c = buffers.empty(n, np.dtype(np.int32))  # first block now free: reused, any dtype
    assert c.__array_interface__["data"][0] == address
    small = buffers.empty(10, np.dtype(np.float64))
    assert small.base is None  # small requests are plain allocations


def test_buffer_slot_never_hands_out_a_result_that_is_still_held():
    """buffers.Slot (the cached fast path's result buffer) reuses its block only once nothing
    outside the pool refers to it, a view of a result included."""
    from mpidist.collectives import buffers
    n = buffers.MIN_BYTES // 4
    slot = buffers.Slot(n, np.dtype(np.float32), (n // 4, 4))
    a = slot.take()
    assert a.shape == (n // 4, 4) and a.dtype == np.float32
    a[...] = 1
    address = a.__array_interface__["data"][0]
    b = slot.take()  # `a` is held: another block
    assert b.__array_interface__["data"][0] != address
    b[...] = 2
    row = a[3]
    del a
    c = slot.take()  # a view of `a` is alive: still not a's block
    assert c.__array_interface__["data"][0] != address
    c[...] = 3
    assert (row == 1).all()
    del row, b, c
    d = slot.take()
    e = slot.take()  # `d` is held: never the same block twice
    assert d.__array_interface__["data"][0] != e.__array_interface__["data"][0]
