"""mpidist.horovod.tensorflow collectives against NumPy references over every rank's known inputs,
eagerly, in tf.function and in tf.compat.v1 graphs."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import mpidist
import mpidist.horovod.tensorflow as hvd
from horovod_support import MODES, data, run

OPS = [(hvd.Average, lambda xs: np.mean(xs, axis=0)), (hvd.Sum, lambda xs: np.sum(xs, axis=0)),
       (hvd.Min, lambda xs: np.min(xs, axis=0)), (hvd.Max, lambda xs: np.max(xs, axis=0)),
       (hvd.Product, lambda xs: np.prod(xs, axis=0))]


@pytest.fixture(scope="module", autouse=True)
def initialized():
    hvd.init()


def everyone(shape, dtype=np.float32, seed=0):
    return [data(r, shape, dtype, seed) for r in range(hvd.size())]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op,ref", OPS, ids=["Average", "Sum", "Min", "Max", "Product"])
def test_allreduce_ops(mode, op, ref):
    xs = everyone((3, 2))
    out = run(mode, lambda x: hvd.allreduce(x, op=op), xs[hvd.rank()])
    np.testing.assert_allclose(out, ref(np.stack(xs)), rtol=1e-6)


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_product_is_the_rank_ordered_product_bit_for_bit(mode):
    """Product equals one process's product over the ranks' tensors stacked in rank order, rounded
    in the tensor's dtype at each step (np.prod, tf.reduce_prod), bit for bit at any size: floats
    with fractions (where MPI_PROD's order would show in the last bit), large and small tensors,
    float16, wrapping int8, bool; alone and grouped."""
    n, me = hvd.size(), hvd.rank()
    cases = [(np.float16, (17,)), (np.float32, (17, 17, 17)), (np.float64, (5, 3)), (np.int8, (40,)), (np.bool_, (6,))]
    xs = []
    for i, (dtype, shape) in enumerate(cases):
        rngs = [np.random.default_rng([i, r]) for r in range(n)]
        if dtype == np.bool_:
            xs.append([g.integers(0, 4, shape) > 0 for g in rngs])
        elif dtype == np.int8:
            xs.append([g.integers(-100, 100, shape).astype(dtype) for g in rngs])
        else:
            xs.append([g.uniform(-3, 3, shape).astype(dtype) for g in rngs])
    mine = [x[me] for x in xs]
    alone = run(mode, lambda *ts: [hvd.allreduce(t, op=hvd.Product) for t in ts], *mine)
    grouped = run(mode, lambda *ts: hvd.grouped_allreduce(list(ts), op=hvd.Product), *mine)
    for x, a, g in zip(xs, alone, grouped):
        want = np.prod(np.stack(x), axis=0, dtype=x[0].dtype)
        assert a.dtype == want.dtype and g.dtype == want.dtype
        np.testing.assert_array_equal(a, want)
        np.testing.assert_array_equal(g, want)


@pytest.mark.parametrize("mode", MODES)
def test_allreduce_scaling_average_and_compression(mode):
    xs = everyone((4,))
    mine = xs[hvd.rank()]

    def fn(x):
        return (hvd.allreduce(x, average=False, prescale_factor=2.0, postscale_factor=0.5),
                hvd.allreduce(x, average=True),
                hvd.allreduce(x, op=hvd.Sum, prescale_factor=3.0),
                hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16),
                hvd.allreduce(tf.cast(x, tf.int32), op=hvd.Sum))
    scaled, avg, pre, fp16, ints = run(mode, fn, mine)
    total = np.sum(xs, axis=0)
    np.testing.assert_allclose(scaled, total)
    np.testing.assert_allclose(avg, total / hvd.size())
    np.testing.assert_allclose(pre, 3 * total)
    assert fp16.dtype == np.float32
    np.testing.assert_allclose(fp16, total)
    assert ints.dtype == np.int32 and (ints == total.astype(np.int32)).all()


def test_allreduce_variable_and_argument_errors():
    v = tf.Variable(data(hvd.rank(), (2,)))
    np.testing.assert_allclose(hvd.allreduce(v, op=hvd.Sum).numpy(), np.sum(everyone((2,)), axis=0))
    with pytest.raises(ValueError, match="supersedes average"):
        hvd.allreduce(v, average=True, op=hvd.Sum)
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.allreduce(v, op=hvd.Adasum)
    with pytest.raises(ValueError, match="`op`"):
        hvd.allreduce(v, op=17)


@pytest.mark.parametrize("mode", MODES)
def test_grouped_allreduce(mode):
    a, b = everyone((2, 3)), everyone((5,), np.float64, seed=1)
    out = run(mode, lambda x, y: hvd.grouped_allreduce([x, y], op=hvd.Sum), a[hvd.rank()], b[hvd.rank()])
    np.testing.assert_allclose(out[0], np.sum(a, axis=0))
    np.testing.assert_allclose(out[1], np.sum(b, axis=0))
    assert out[1].dtype == np.float64


@pytest.mark.parametrize("mode", MODES)
def test_grouped_average_of_equal_values_is_exact(mode, monkeypatch):
    """grouped_allreduce's Average reduces float32 in float64 and rounds once, so equal values average
    to themselves at any size (Horovod's tests demand it at 3 ranks, where a float32 sum divided by 3
    can be off by an ulp); the default allreduce takes the engine's MEAN in the tensor's dtype."""
    seen = []
    original = mpidist.Engine.allreduce

    def spy(self, value, op="sum", **kwargs):
        leaves = value if isinstance(value, (list, tuple)) else [value]
        seen.append((str(getattr(op, "value", op)).lower(), tuple(np.asarray(v).dtype.name for v in leaves)))
        return original(self, value, op, **kwargs)
    monkeypatch.setattr(mpidist.Engine, "allreduce", spy)
    x = np.random.default_rng(5).uniform(-100, 100, (17, 17)).astype(np.float32)  # the same on every rank
    grouped = run(mode, lambda t: hvd.grouped_allreduce([t], op=hvd.Average), x)
    np.testing.assert_array_equal(grouped[0], x)
    assert ("mean", ("float64",)) in seen, seen
    seen.clear()
    plain = run(mode, lambda t: hvd.allreduce(t, op=hvd.Average), x)
    np.testing.assert_allclose(plain, x, rtol=1e-6)
    assert ("mean", ("float32",)) in seen, seen


@pytest.mark.parametrize("mode", MODES)
def test_allgather_ragged_and_grouped(mode):
    rows = [r + 1 for r in range(hvd.size())]
    xs = [data(r, (rows[r], 2)) for r in range(hvd.size())]
    ys = [data(r, (r % 2 + 1,), np.int64, seed=3) for r in range(hvd.size())]
    got = run(mode, lambda x: hvd.allgather(x), xs[hvd.rank()])
    np.testing.assert_array_equal(got, np.concatenate(xs))
    g1, g2 = run(mode, lambda x, y: hvd.grouped_allgather([x, y]), xs[hvd.rank()], ys[hvd.rank()])
    np.testing.assert_array_equal(g1, np.concatenate(xs))
    np.testing.assert_array_equal(g2, np.concatenate(ys))


@pytest.mark.parametrize("mode", MODES)
def test_broadcast_every_root(mode):
    xs = everyone((2, 2), np.int32)
    for root in range(hvd.size()):
        np.testing.assert_array_equal(run(mode, lambda x: hvd.broadcast(x, root), xs[hvd.rank()]), xs[root])


@pytest.mark.parametrize("mode", MODES)
def test_alltoall_with_and_without_splits(mode):
    n, me = hvd.size(), hvd.rank()
    splits = [[(r + j) % 3 for j in range(n)] for r in range(n)]  # rows rank r sends to rank j
    xs = [data(r, (sum(splits[r]), 2)) for r in range(n)]
    out, received = run(mode, lambda x: hvd.alltoall(x, splits=splits[me]), xs[me])
    want = [xs[r][sum(splits[r][:me]):sum(splits[r][:me + 1])] for r in range(n)]
    np.testing.assert_array_equal(out, np.concatenate(want))
    np.testing.assert_array_equal(received, [splits[r][me] for r in range(n)])
    even = [data(r, (2 * n,), seed=4) for r in range(n)]
    out = run(mode, lambda x: hvd.alltoall(x), even[me])  # without splits: only the tensor, as Horovod
    np.testing.assert_array_equal(out, np.concatenate([even[r][2 * me:2 * me + 2] for r in range(n)]))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int32, np.int64, np.float16, np.float64])
def test_alltoall_uneven_splits_of_every_dtype(mode, dtype):
    """Splits that differ per rank and do not divide the rows evenly, rows past sum(splits) not
    sent, integer and uint8 tensors: equal to slicing every rank's rows."""
    n, me = hvd.size(), hvd.rank()
    splits = [[(3 * r + j) % 4 for j in range(n)] for r in range(n)]
    extra = [r % 2 for r in range(n)]  # rows left over at the end, never sent
    xs = [data(r, (sum(splits[r]) + extra[r], 3), dtype=dtype, seed=6) for r in range(n)]
    out, received = run(mode, lambda x: hvd.alltoall(x, splits=splits[me]), xs[me])
    want = [xs[r][sum(splits[r][:me]):sum(splits[r][:me + 1])] for r in range(n)]
    assert out.dtype == dtype
    np.testing.assert_array_equal(out, np.concatenate(want))
    np.testing.assert_array_equal(received, [splits[r][me] for r in range(n)])


def test_alltoall_errors():
    n = hvd.size()
    with pytest.raises(tf.errors.InvalidArgumentError, match="splits"):  # Horovod's type, every rank alike
        hvd.alltoall(tf.zeros([3]), splits=[4] + [0] * (n - 1))
    with pytest.raises(tf.errors.InvalidArgumentError, match="one entry per rank"):
        hvd.alltoall(tf.zeros([3]), splits=[1] * (n + 1))
    if n > 1:
        with pytest.raises(tf.errors.InvalidArgumentError, match="divisible"):
            hvd.alltoall(tf.zeros([n + 1]))
        with pytest.raises(tf.errors.FailedPreconditionError, match="same dtype and trailing shape"):
            hvd.alltoall(tf.zeros([n, 2 if hvd.rank() == 0 else 3]))
        np.testing.assert_array_equal(hvd.alltoall(tf.ones([n])).numpy(), np.ones(n))  # usable afterwards


@pytest.mark.parametrize("mode", MODES)
def test_reducescatter(mode):
    n, me = hvd.size(), hvd.rank()
    xs = everyone((2 * n + 1, 3))
    total = np.sum(xs, axis=0)
    blocks = np.array_split(total, n)  # the first n % size ranks get one row more, as Horovod's
    avg, summed = run(mode, lambda x: (hvd.reducescatter(x), hvd.reducescatter(x, op=hvd.Sum)), xs[me])
    np.testing.assert_allclose(avg, blocks[me] / n, rtol=1e-6)
    np.testing.assert_allclose(summed, blocks[me])
    ys = everyone((n, 2), seed=5)
    g = run(mode, lambda x, y: hvd.grouped_reducescatter([x, y], op=hvd.Sum, postscale_factor=2.0), xs[me], ys[me])
    np.testing.assert_allclose(g[0], 2 * blocks[me])
    np.testing.assert_allclose(g[1], 2 * np.sum(ys, axis=0)[me:me + 1])


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_join_and_barrier(mode):
    assert int(run(mode, lambda x: hvd.join() + 0 * x, np.int32(0))) == hvd.size() - 1
    hvd.barrier()


@pytest.mark.parametrize("mode", ["eager", "function", "graph"])
def test_broadcast_inplace_one_call_for_mixed_dtypes(mode):
    root = hvd.size() - 1
    a0, b0 = data(hvd.rank(), (2, 3)), data(hvd.rank(), (4,), np.int64, seed=2)
    if mode == "graph":
        with tf.Graph().as_default():
            a, b = tf.compat.v1.Variable(a0), tf.compat.v1.Variable(b0)
            out = hvd.broadcast_([a, b], root_rank=root)
            single = hvd.broadcast_(a, root_rank=0)
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                got = sess.run(out)
                values = sess.run([a, b])
                got_single = sess.run(single)
    else:
        a, b = tf.Variable(a0), tf.Variable(b0)
        fn = tf.function(hvd.broadcast_) if mode == "function" else hvd.broadcast_
        got = [t.numpy() for t in fn([a, b], root_rank=root)]
        values = [a.numpy(), b.numpy()]
        got_single = fn(a, root_rank=0).numpy()
    for g in (got, values):
        np.testing.assert_array_equal(g[0], data(root, (2, 3)))
        np.testing.assert_array_equal(g[1], data(root, (4,), np.int64, seed=2))
    np.testing.assert_array_equal(got_single, data(root, (2, 3)))  # rank 0 holds root's values by then


def test_broadcast_variables_and_objects():
    v = tf.Variable(data(hvd.rank(), (3,)))
    hvd.broadcast_variables([v], root_rank=0)
    np.testing.assert_array_equal(v.numpy(), data(0, (3,)))
    root = hvd.size() - 1
    obj = {"rank": hvd.rank(), "list": list(range(hvd.rank()))}
    assert hvd.broadcast_object(obj, root_rank=root) == {"rank": root, "list": list(range(root))}
    assert hvd.broadcast_object_fn(root_rank=0)(obj) == {"rank": 0, "list": []}
    assert hvd.allgather_object(("r", hvd.rank())) == [("r", r) for r in range(hvd.size())]


def test_mismatch_is_an_error_on_every_rank():
    shape = (hvd.rank() + 1,) if hvd.size() > 1 else (1,)
    if hvd.size() == 1:
        pytest.skip("a mismatch needs two ranks")
    with pytest.raises(tf.errors.FailedPreconditionError, match="allreduce"):
        hvd.allreduce(tf.zeros(shape))
    with pytest.raises(tf.errors.FailedPreconditionError):
        hvd.allreduce(tf.zeros([2]), op=hvd.Sum if hvd.rank() else hvd.Max)
    with pytest.raises(tf.errors.FailedPreconditionError):
        hvd.broadcast(tf.zeros([2]), root_rank=hvd.rank() % 2)
    with pytest.raises(tf.errors.FailedPreconditionError):
        hvd.allgather(tf.zeros([1, 2], tf.float32 if hvd.rank() else tf.float64))

    @tf.function
    def step():
        return hvd.allreduce(tf.zeros(shape))
    with pytest.raises(tf.errors.FailedPreconditionError, match="allreduce: ranks issued different"):
        step()  # in a graph too, as Horovod (runner.py says how)
    np.testing.assert_allclose(hvd.allreduce(tf.ones([2]), op=hvd.Sum).numpy(), [hvd.size()] * 2)  # still usable


def test_broadcast_global_variables_in_a_v1_graph_and_keras_value_forms():
    import mpidist.horovod.keras as hvdk
    with pytest.raises(RuntimeError, match="eager"):
        hvd.broadcast_global_variables(0)
    with tf.Graph().as_default():
        v = tf.compat.v1.get_variable("v", initializer=data(hvd.rank(), (3,)))
        op = hvd.broadcast_global_variables(hvd.size() - 1)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(op)
            np.testing.assert_array_equal(sess.run(v), data(hvd.size() - 1, (3,)))
    xs = everyone((2,))
    np.testing.assert_allclose(hvdk.allreduce(xs[hvd.rank()], "named").numpy(), np.mean(xs, axis=0))  # name 2nd
    np.testing.assert_array_equal(hvdk.allgather(xs[hvd.rank()], "g").numpy(), np.concatenate(xs))
    assert int(hvd.process_set_included_op()) == 1
