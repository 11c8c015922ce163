"""Gradients of mpidist.horovod.tensorflow's collectives, with Horovod's definitions, against NumPy
references built from every rank's known upstream gradients: GradientTape eagerly and in a
tf.function, tf.gradients in a tf.compat.v1 graph."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import mpidist.horovod.tensorflow as hvd
from horovod_support import MODES, data, gradient, run


@pytest.fixture(scope="module", autouse=True)
def initialized():
    hvd.init()


def upstream_of(rank, shape_seed=7):
    """This rank's upstream gradient for an output y: known values of y's shape."""
    return lambda y: tf.cast(tf.reshape(tf.range(tf.size(y)) % 5 + rank, tf.shape(y)), y.dtype)


def upstream_np(rank, shape):
    return (np.arange(int(np.prod(shape))) % 5 + rank).reshape(shape).astype(np.float32)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op,factor", [(hvd.Sum, 1.0), (hvd.Average, None)], ids=["Sum", "Average"])
def test_allreduce_gradient_is_allreduce_of_gradient(mode, op, factor):
    n, me = hvd.size(), hvd.rank()
    x = data(me, (2, 3))
    g = gradient(mode, lambda t: hvd.allreduce(t, op=op, prescale_factor=2.0, postscale_factor=3.0), x, upstream_of(me))
    ups = np.stack([upstream_np(r, (2, 3)) for r in range(n)])
    want = 6.0 * (ups.sum(0) if op == hvd.Sum else ups.mean(0))
    np.testing.assert_allclose(g, want, rtol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_grouped_allreduce_gradient(mode):
    n, me = hvd.size(), hvd.rank()
    x = data(me, (4,))
    g = gradient(mode, lambda t: tf.add_n(hvd.grouped_allreduce([t, 2 * t], op=hvd.Sum)), x, upstream_of(me))
    np.testing.assert_allclose(g, 3 * sum(upstream_np(r, (4,)) for r in range(n)))


@pytest.mark.parametrize("mode", MODES)
def test_allgather_gradient_is_my_rows_of_the_averaged_gradient(mode):
    """Horovod 0.28.1 averages the upstream gradients over the ranks (it summed before)."""
    n, me = hvd.size(), hvd.rank()
    rows = [r + 1 for r in range(n)]
    x = data(me, (rows[me], 2))
    g = gradient(mode, hvd.allgather, x, upstream_of(me))
    total = sum(upstream_np(r, (sum(rows), 2)) for r in range(n))
    start = sum(rows[:me])
    np.testing.assert_allclose(g, total[start:start + rows[me]] / n, rtol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_allgather_gradient_of_the_same_upstream_is_that_upstream(mode):
    """Every rank passing the same upstream gradient gets back its own rows of it, unscaled."""
    n, me = hvd.size(), hvd.rank()
    rows = [r % 3 + 1 for r in range(n)]
    g = gradient(mode, lambda t: hvd.grouped_allgather([t, 2 * t])[1], data(me, (rows[me], 3)), upstream_of(0))
    start = sum(rows[:me])
    np.testing.assert_allclose(g, 2 * upstream_np(0, (sum(rows), 3))[start:start + rows[me]], rtol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_broadcast_gradient_goes_to_the_root(mode):
    n, me = hvd.size(), hvd.rank()
    root = n - 1
    g = gradient(mode, lambda t: hvd.broadcast(t, root), data(me, (3,)), upstream_of(me))
    want = sum(upstream_np(r, (3,)) for r in range(n)) / n if me == root else np.zeros(3)  # averaged
    np.testing.assert_allclose(g, want, rtol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_alltoall_gradient_is_alltoall_back(mode):
    n, me = hvd.size(), hvd.rank()
    splits = [[(r + 2 * j) % 3 + 1 for j in range(n)] for r in range(n)]
    received = [[splits[r][j] for r in range(n)] for j in range(n)]  # what rank j receives from each rank
    g = gradient(mode, lambda t: hvd.alltoall(t, splits=splits[me])[0], data(me, (sum(splits[me]), 2)),
                 upstream_of(me))
    parts = []
    for j in range(n):  # my rows sent to rank j came back with rank j's upstream rows at my place
        up = upstream_np(j, (sum(received[j]), 2))
        start = sum(received[j][:me])
        parts.append(up[start:start + splits[me][j]])
    np.testing.assert_allclose(g, np.concatenate(parts))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("op", [hvd.Sum, hvd.Average], ids=["Sum", "Average"])
def test_reducescatter_gradient_is_allgather_of_gradient(mode, op):
    """Horovod's convention, as for allreduce: Sum's gradient is ``size`` times Average's, which is
    the allgather of the upstream gradients."""
    n, me = hvd.size(), hvd.rank()
    rows = 2 * n + 1
    g = gradient(mode, lambda t: hvd.reducescatter(t, op=op), data(me, (rows, 2)), upstream_of(me))
    blocks = [len(b) for b in np.array_split(np.arange(rows), n)]
    want = np.concatenate([upstream_np(r, (blocks[r], 2)) for r in range(n)])
    np.testing.assert_allclose(g, want * (n if op == hvd.Sum else 1), rtol=1e-6)


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_indexed_slices_allreduced_by_allgather(mode):
    n, me = hvd.size(), hvd.rank()
    table = tf.Variable(np.zeros((6, 2), np.float32))
    ids = [np.array([r % 6, (2 * r + 1) % 6]) for r in range(n)]

    def sparse_grad(index):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.gather(table, index) * float(me + 1))
        g = tape.gradient(loss, table)
        assert isinstance(g, tf.IndexedSlices)
        reduced = hvd.allreduce(g, op=hvd.Average)
        assert isinstance(reduced, tf.IndexedSlices)
        return tf.convert_to_tensor(reduced), tf.convert_to_tensor(hvd.allreduce(g, op=hvd.Sum))
    avg, summed = run(mode, sparse_grad, ids[me])
    want = np.zeros((6, 2), np.float32)
    for r in range(n):
        np.add.at(want, ids[r], r + 1)
    np.testing.assert_allclose(summed, want)
    np.testing.assert_allclose(avg, want / n)
