"""hvd.SyncBatchNormalization against one process's keras BatchNormalization on the batch
concatenated over every rank: outputs, moving statistics, and training with DistributedOptimizer."""
from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import mpidist.horovod.tensorflow as hvd
import mpidist.horovod.tensorflow.keras as hvdk
from reference import assert_batch_norm_is_global


@pytest.fixture(scope="module", autouse=True)
def initialized():
    hvd.init()


@pytest.fixture(autouse=True)
def forget_global_seed():
    yield
    tf.random.set_seed(None)


def rows(rank, count, shape=(3,), seed=0):
    rng = np.random.default_rng([seed, rank])
    return (rng.standard_normal((count,) + shape) * (rank + 1) + rank).astype(np.float32)


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("uneven", [False, True], ids=["even", "uneven"])
def test_training_moments_are_the_concatenated_batch(mode, uneven):
    n, me = hvd.size(), hvd.rank()
    counts = [(r % 3) + 2 if uneven else 4 for r in range(n)]
    xs = [rows(r, counts[r], shape=(2, 3)) for r in range(n)]  # (batch, 2, 3): moments over axes 0 and 1
    sync = hvd.SyncBatchNormalization(momentum=0.5)
    ref = keras.layers.BatchNormalization(momentum=0.5)
    call = tf.function(lambda layer, x: layer(x, training=True)) if mode == "function" else \
        (lambda layer, x: layer(x, training=True))
    assert_batch_norm_is_global(sync, ref, xs, me, lambda layer, x: call(layer, tf.constant(x)))


def test_v1_graph_outputs_and_moving_statistics_fetched_by_a_session():
    """In a tf.compat.v1 graph (Horovod programs' graph mode): the Session fetches the layers'
    Keras 3 variables as it fetches tf.Variables, and the outputs are the concatenated batch's."""
    n, me = hvd.size(), hvd.rank()
    xs = [rows(r, 3, seed=2) for r in range(n)]
    with tf.Graph().as_default():
        sync = hvd.SyncBatchNormalization(axis=1)
        ref = keras.layers.BatchNormalization(axis=1)
        got_op = sync(tf.constant(xs[me]), training=True)
        want_op = ref(tf.constant(np.concatenate(xs)), training=True)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            got, want = sess.run([got_op, want_op])
            stats = sess.run([sync.moving_mean, sync.moving_variance, ref.moving_mean, ref.moving_variance])
    np.testing.assert_allclose(got, want[3 * me:3 * me + 3], rtol=1e-4, atol=1e-4)
    assert all(s.shape == (3,) for s in stats)
    np.testing.assert_allclose(stats[0], stats[2], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(stats[1], stats[3], rtol=1e-4, atol=1e-5)


def test_masked_moments():
    n, me = hvd.size(), hvd.rank()
    xs = [rows(r, 2, shape=(4, 3), seed=1) for r in range(n)]
    masks = [np.arange(4)[None, :].repeat(2, 0) < (r % 4) + 1 for r in range(n)]
    got = hvd.SyncBatchNormalization()(tf.constant(xs[me]), training=True, mask=tf.constant(masks[me])).numpy()
    want = keras.layers.BatchNormalization()(np.concatenate(xs), training=True, mask=np.concatenate(masks)).numpy()
    np.testing.assert_allclose(got, want[2 * me:2 * me + 2], rtol=1e-4, atol=1e-4)


def _model(norm):
    keras.utils.set_random_seed(3)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), norm(), keras.layers.Dense(1)])


def weights(model):
    return np.concatenate([v.numpy().ravel() for v in model.weights])


@pytest.mark.parametrize("run_eagerly", [False, True], ids=["graph", "eager"])
def test_fit_equals_batch_norm_on_the_global_batch(run_eagerly):
    n, me = hvd.size(), hvd.rank()
    steps, per = 3, 4
    x = np.concatenate([rows(r, steps * per, seed=2) for r in range(n)])
    y = (x @ np.array([[1.0], [-1.0], [2.0]], np.float32)).astype(np.float32)
    order = np.arange(len(x)).reshape(n, steps, per).transpose(1, 0, 2)  # global batch s: every rank's step s
    mine = order[:, me].ravel()
    model = _model(hvdk.SyncBatchNormalization)
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.05)), loss="mse", run_eagerly=run_eagerly)
    model.fit(x[mine], y[mine], batch_size=per, epochs=1, shuffle=False, verbose=0)
    ref = _model(keras.layers.BatchNormalization)
    ref.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    ref.fit(x[order.ravel()], y[order.ravel()], batch_size=per * n, epochs=1, shuffle=False, verbose=0)
    np.testing.assert_allclose(weights(model), weights(ref), rtol=1e-4, atol=1e-5)


def test_arguments_and_config():
    with pytest.raises(ValueError, match="fused=True"):
        hvd.SyncBatchNormalization(fused=True)
    layer = hvdk.SyncBatchNormalization(axis=1)
    assert layer.name.startswith("sync_batch_normalization")
    clone = keras.layers.deserialize(keras.layers.serialize(layer))
    assert isinstance(clone, hvd.SyncBatchNormalization) and clone.axis == layer.axis
