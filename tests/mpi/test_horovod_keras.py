"""DistributedGradientTape, DistributedOptimizer (Keras 3 and tf.compat.v1), the Keras callbacks and
load_model, against single-process references computed from every rank's known data."""
from __future__ import annotations

import logging

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import mpidist.horovod.tensorflow as hvd
import mpidist.horovod.keras as hvdk
from horovod_support import data
from reference import CLIPS, clipping_acts


@pytest.fixture(scope="module", autouse=True)
def initialized():
    hvd.init()


def batch(rank, rows=4, seed=0):
    rng = np.random.default_rng([seed, rank])
    return rng.standard_normal((rows, 3)).astype(np.float32), rng.standard_normal((rows, 1)).astype(np.float32)


W0 = np.arange(3, dtype=np.float32).reshape(3, 1) / 3


def local_grad(rank):
    x, y = batch(rank)
    return 2 * x.T @ (x @ W0 - y) / len(x)


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("kwargs,scale", [
    ({}, "mean"), ({"op": hvd.Sum}, "sum"), ({"compression": hvd.Compression.fp16}, "mean"),
    ({"gradient_predivide_factor": 2.0}, "mean"), ({"num_groups": 2}, "mean")],
    ids=["default", "sum", "fp16", "predivide", "num_groups"])
def test_distributed_gradient_tape(mode, kwargs, scale):
    n, me = hvd.size(), hvd.rank()
    w = tf.Variable(W0)
    b = tf.Variable(np.zeros(1, np.float32))
    x, y = batch(me)

    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((tf.matmul(x, w) + b - y) ** 2)
        tape = hvd.DistributedGradientTape(tape, **kwargs)
        return tape.gradient(loss, [w, b])
    gw, gb = (tf.function(step) if mode == "function" else step)()
    grads = [local_grad(r) for r in range(n)]
    want = np.sum(grads, axis=0) if scale == "sum" else np.mean(grads, axis=0)
    tol = 2e-3 if "compression" in kwargs else 1e-5
    np.testing.assert_allclose(gw.numpy(), want, rtol=tol, atol=tol)
    assert gb.shape == (1,)


def test_tape_groups_sparse_as_dense_and_partial():
    n, me = hvd.size(), hvd.rank()
    table = tf.Variable(np.ones((5, 2), np.float32))
    local = keras.layers.Dense(1)
    local.build((None, 2))
    ids = np.array([me % 5])
    with tf.GradientTape(persistent=True) as tape:
        loss = tf.reduce_sum(tf.gather(table, ids)) * (me + 1) + tf.reduce_sum(local(tf.ones([1, 2]))) * (me + 1)
    dense = hvd.DistributedGradientTape(tape, sparse_as_dense=True, groups=[[table]])
    g = dense.gradient(loss, table)
    assert isinstance(g, tf.Tensor)
    want = np.zeros((5, 2), np.float32)
    for r in range(n):
        want[r % 5] += (r + 1) / n
    np.testing.assert_allclose(g.numpy(), want)
    partial = hvd.PartialDistributedGradientTape(tape, local_layers=[local])
    g_kernel, g_table = partial.gradient(loss, [local.kernel, table])
    np.testing.assert_allclose(g_kernel.numpy(), np.full((2, 1), (me + 1.0) / n))  # local, scaled by 1/size
    want_table = np.zeros((5, 2), np.float32)
    for r in range(n):
        want_table[r % 5] += (r + 1) / n
    np.testing.assert_allclose(tf.convert_to_tensor(g_table).numpy(), want_table)  # still averaged
    unscaled = hvd.PartialDistributedGradientTape(tape, local_layers=local, scale_local_gradients=False)
    np.testing.assert_allclose(unscaled.gradient(loss, local.kernel).numpy(), np.full((2, 1), me + 1.0))
    registered = hvd.DistributedGradientTape(tape)
    registered.register_local_source(local.bias)
    np.testing.assert_allclose(registered.gradient(loss, local.bias).numpy(), [(me + 1.0) / n])
    with pytest.raises(ValueError, match="local_layers"):
        hvd.PartialDistributedGradientTape(tape, local_layers=[table])


def test_tape_argument_errors():
    with tf.GradientTape() as tape:
        pass
    with pytest.raises(ValueError, match="gradient_predivide_factor"):
        hvd.DistributedGradientTape(tape, op=hvd.Sum, gradient_predivide_factor=2.0)
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.DistributedGradientTape(tape, op=hvd.Adasum)


@pytest.fixture(autouse=True)
def forget_global_seed():
    """make_model sets a global seed; later test files must not inherit it."""
    yield
    tf.random.set_seed(None)


def make_model():
    keras.utils.set_random_seed(1234)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(1)])


def dataset(n, steps, per_rank=4):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((steps * per_rank * n, 3)).astype(np.float32)
    return x, (x @ np.array([[1.0], [-2.0], [0.5]], np.float32) + 0.1).astype(np.float32)


def weights(model):
    return np.concatenate([v.numpy().ravel() for v in model.weights])


@pytest.mark.parametrize("passes, clip", [(1, "global_clipnorm"), (2, "clipvalue")])
def test_keras_fit_equals_large_batch_reference(passes, clip):
    """Clipping acts on the aggregated gradient (as one process clips the large batch's)."""
    n, me = hvd.size(), hvd.rank()
    steps, per = 4, 4
    x, y = dataset(n, steps)
    mine = np.arange(len(x)).reshape(steps, n, per)[:, me].ravel()  # rank me's batch s: rows [s, me]

    def sgd():
        return keras.optimizers.SGD(0.05, momentum=0.0 if passes > 1 else 0.9, **{clip: CLIPS[clip]})
    model = make_model()
    opt = hvdk.DistributedOptimizer(sgd(), backward_passes_per_step=passes, average_aggregated_gradients=True)
    model.compile(optimizer=opt, loss="mse")
    model.fit(x[mine], y[mine], batch_size=per, epochs=2, shuffle=False, verbose=0,
              callbacks=[hvdk.callbacks.BroadcastGlobalVariablesCallback(0)])
    ref = make_model()
    ref.compile(optimizer=sgd(), loss="mse")
    with tf.GradientTape() as tape:
        loss = keras.losses.MeanSquaredError()(y[:per * n * passes], ref(x[:per * n * passes]))
    assert clipping_acts(clip, tape.gradient(loss, ref.trainable_variables)), "this test could not fail"
    ref.fit(x, y, batch_size=per * n * passes, epochs=2, shuffle=False, verbose=0)
    np.testing.assert_allclose(weights(model), weights(ref), rtol=1e-5, atol=1e-6)
    assert int(opt.iterations.numpy()) == 2 * steps // passes
    assert hvd.allgather_object(weights(model).tolist()) == [weights(model).tolist()] * n


def test_v1_optimizer_in_graph_mode():
    n, me = hvd.size(), hvd.rank()
    x, y = batch(me)
    with tf.Graph().as_default():
        w = tf.compat.v1.get_variable("w", initializer=W0)
        loss = tf.reduce_mean((tf.matmul(x, w) - y) ** 2)
        opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))
        train = opt.minimize(loss)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(train)
            got = sess.run(w)
    np.testing.assert_allclose(got, W0 - 0.1 * np.mean([local_grad(r) for r in range(n)], axis=0), rtol=1e-5)


class _Record(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.lrs, self.logs = [], []

    def on_train_batch_begin(self, batch, logs=None):
        self.lrs.append(float(self.model.optimizer.learning_rate.numpy()))

    def on_epoch_end(self, epoch, logs=None):
        self.logs.append(dict(logs))


def test_lr_callbacks_and_metric_average():
    n, me = hvd.size(), hvd.rank()
    x, y = batch(me, rows=8)
    model = make_model()
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.0)), loss="mse")
    rec = _Record()
    warm = hvdk.callbacks.LearningRateWarmupCallback(initial_lr=0.8, warmup_epochs=2, steps_per_epoch=2)
    model.fit(x, y, batch_size=4, epochs=3, shuffle=False, verbose=0,
              callbacks=[warm, rec])
    want = [0.8 / n * ((e + b / 2 + 1 / 2) * (n - 1) / 2 + 1) for e in range(2) for b in range(2)]
    np.testing.assert_allclose(rec.lrs[:4], want, rtol=1e-6)
    np.testing.assert_allclose(rec.lrs[4:], [rec.lrs[3]] * 2, rtol=1e-6)  # after warmup: unchanged

    model2 = make_model()
    model2.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.0)), loss="mse")
    rec2 = _Record()
    sched = hvdk.callbacks.LearningRateScheduleCallback(initial_lr=0.5, multiplier=lambda e: 0.1 ** e, start_epoch=1)
    model2.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0,
               callbacks=[sched, hvdk.callbacks.MetricAverageCallback(), rec2])
    np.testing.assert_allclose(rec2.lrs, [0.0, 0.05, 0.005], rtol=1e-6)
    losses = []
    for r in range(n):  # learning rate 0 in epoch 0: each rank's loss is its data's mse at the start
        xr, yr = batch(r, rows=8)
        losses.append(float(np.mean((make_model()(xr).numpy() - yr) ** 2)))
    np.testing.assert_allclose(rec2.logs[0]["loss"], np.mean(losses), rtol=1e-5)


def test_load_model_keeps_state_and_distributes(tmp_path_factory):
    n, me = hvd.size(), hvd.rank()
    path = os.path.join(str(tmp_path_factory.mktemp(f"rank{me}")), "model.keras")
    model = make_model()
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="mse")
    x, y = batch(0, rows=4)
    model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    model.save(path)
    loaded = hvdk.load_model(path)
    assert int(loaded.optimizer.iterations.numpy()) == 1
    xm, ym = batch(me, rows=4, seed=9)
    before = weights(loaded)
    loaded.fit(xm, ym, batch_size=4, epochs=1, verbose=0)
    assert not np.allclose(weights(loaded), before)
    assert hvd.allgather_object(weights(loaded).tolist()) == [weights(loaded).tolist()] * n


@pytest.mark.parametrize("sparse_as_dense", [False, True], ids=["indexed_slices", "sparse_as_dense"])
@pytest.mark.parametrize("run_eagerly", [False, True], ids=["graph", "eager"])
def test_keras_embedding_fit_equals_reference(sparse_as_dense, run_eagerly):
    n, me = hvd.size(), hvd.rank()
    steps, per = 3, 4
    rng = np.random.default_rng(11)
    ids = rng.integers(0, 12, (steps * per * n, 2))
    target = rng.standard_normal((steps * per * n, 1)).astype(np.float32)
    mine = np.arange(len(ids)).reshape(steps, n, per)[:, me].ravel()

    def build():
        keras.utils.set_random_seed(7)
        return keras.Sequential([keras.Input((2,), dtype="int32"), keras.layers.Embedding(12, 3),
                                 keras.layers.Flatten(), keras.layers.Dense(1)])
    model = build()
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1), sparse_as_dense=sparse_as_dense,
                                                      ),
                  loss="mse", run_eagerly=run_eagerly)
    model.fit(ids[mine], target[mine], batch_size=per, epochs=1, shuffle=False, verbose=0)
    ref = build()
    ref.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    ref.fit(ids, target, batch_size=per * n, epochs=1, shuffle=False, verbose=0)
    np.testing.assert_allclose(weights(model), weights(ref), rtol=1e-5, atol=1e-6)


def test_keras_backward_passes_eagerly():
    n, me = hvd.size(), hvd.rank()
    steps, per = 4, 4
    x, y = dataset(n, steps)
    mine = np.arange(len(x)).reshape(steps, n, per)[:, me].ravel()
    model = make_model()
    opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(0.05), backward_passes_per_step=2)
    model.compile(optimizer=opt, loss="mse", run_eagerly=True)
    model.fit(x[mine], y[mine], batch_size=per, epochs=1, shuffle=False, verbose=0)
    ref = make_model()
    ref.compile(optimizer=keras.optimizers.SGD(0.05 * 2), loss="mse")  # summed over 2 passes, not averaged
    ref.fit(x, y, batch_size=per * n * 2, epochs=1, shuffle=False, verbose=0)
    np.testing.assert_allclose(weights(model), weights(ref), rtol=1e-5, atol=1e-6)
    assert int(opt.iterations.numpy()) == steps // 2


class _WeightsAtBatchBegin(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.seen = []

    def on_train_batch_begin(self, batch, logs=None):
        self.seen.append(weights(self.model).tolist())


def test_broadcast_callback_after_the_first_batch_equalizes_weights_and_optimizer_state():
    """As Horovod: the first batch runs on each rank's own weights, then the root's model and optimizer
    variables (slots included) are on every rank."""
    n, me = hvd.size(), hvd.rank()
    root = n - 1
    keras.utils.set_random_seed(100 + me)  # different initial weights on every rank
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(1)])
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.05, momentum=0.9)), loss="mse")
    model.optimizer.build(model.trainable_variables)
    for v in model.optimizer.variables:  # different optimizer state too (momenta, iterations)
        if "float" in str(v.dtype) and len(v.shape) > 0:
            v.assign(np.full(v.shape, 0.1 * (me + 1), str(v.dtype)))
    model.optimizer.iterations.assign(7 * me)
    seen = _WeightsAtBatchBegin()
    x, y = batch(me, rows=12)
    model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0,
              callbacks=[hvdk.callbacks.BroadcastGlobalVariablesCallback(root), seen])
    first = hvd.allgather_object(seen.seen[0])
    if n > 1:
        assert first[0] != first[1]  # the broadcast is not at train begin
    assert hvd.allgather_object(seen.seen[1]) == [seen.seen[1]] * n  # it happened after batch 0
    opt_state = [v.numpy().ravel().tolist() for v in model.optimizer.variables]
    assert hvd.allgather_object(opt_state) == [opt_state] * n
    assert int(model.optimizer.iterations.numpy()) == 7 * root + 3
    assert hvd.allgather_object(weights(model).tolist()) == [weights(model).tolist()] * n


@pytest.mark.parametrize("correction", [True, False], ids=["momentum_correction", "no_correction"])
def test_warmup_momentum_correction_equals_horovods_update(correction):
    """Horovod multiplies SGD's momentum by new_lr / old_lr on each step whose rate the callback changed."""
    n, me = hvd.size(), hvd.rank()
    x, y = batch(me, rows=8)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")])
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.3, momentum=0.9)), loss="mse")
    warm = hvdk.callbacks.LearningRateWarmupCallback(initial_lr=0.3, warmup_epochs=2, steps_per_epoch=2,
                                                     momentum_correction=correction)
    model.fit(x, y, batch_size=4, epochs=3, shuffle=False, verbose=0, callbacks=[warm])
    w, v, lr_before = np.zeros((3, 1)), np.zeros((3, 1)), 0.3
    for e in range(3):
        for b in range(2):
            lr = 0.3 / n * ((e + b / 2 + 1 / 2) * (n - 1) / 2 + 1) if e < 2 else lr_before
            momentum = 0.9 * (lr / lr_before if correction else 1.0)
            g = np.mean([2 * batch(r, rows=8)[0][4 * b:4 * b + 4].T
                         @ (batch(r, rows=8)[0][4 * b:4 * b + 4] @ w - batch(r, rows=8)[1][4 * b:4 * b + 4]) / 4
                         for r in range(n)], axis=0)
            v = momentum * v - lr * g
            w, lr_before = w + v, lr
    np.testing.assert_allclose(model.layers[0].kernel.numpy(), w, rtol=1e-5, atol=1e-6)


def test_momentum_correction_is_skipped_with_a_warning_where_it_cannot_be_applied(caplog):
    """RMSprop(momentum=...) trains as without the correction (Horovod's scripts keep running); the
    chief says so once, the other ranks say nothing."""
    x, y = batch(hvd.rank(), rows=4)
    results = []
    for correction in (True, False):
        model = make_model()
        model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.RMSprop(0.01, momentum=0.5)), loss="mse")
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="mpidist"):
            model.fit(x, y, batch_size=2, epochs=2, verbose=0, callbacks=[hvdk.callbacks.LearningRateWarmupCallback(
                initial_lr=0.01, warmup_epochs=2, steps_per_epoch=2, momentum_correction=correction)])
        warned = [r for r in caplog.records if "momentum_correction" in r.getMessage()]
        assert len(warned) == (1 if correction and hvd.rank() == 0 else 0), warned
        results.append(model.layers[0].kernel.numpy())
    np.testing.assert_array_equal(results[0], results[1])


@pytest.mark.parametrize("scale", [True, False], ids=["scaled", "unscaled"])
def test_partial_distributed_optimizer_keeps_local_layers_local(scale):
    n, me = hvd.size(), hvd.rank()
    keras.utils.set_random_seed(21)
    local = keras.layers.Dense(2, name="local")
    model = keras.Sequential([keras.Input((3,)), local, keras.layers.Dense(1, name="shared")])
    start = [v.numpy() for v in model.trainable_variables]
    opt = hvdk.PartialDistributedOptimizer(keras.optimizers.SGD(0.1), local_layers=[local],
                                           scale_local_gradients=scale)
    model.compile(optimizer=opt, loss="mse")
    x, y = batch(me, rows=4, seed=4)
    model.train_on_batch(x, y)

    def grads(r):
        for v, s in zip(model.trainable_variables, start):
            v.assign(s)
        xr, yr = batch(r, rows=4, seed=4)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(xr) - yr) ** 2)
        return [g.numpy() for g in tape.gradient(loss, model.trainable_variables)]
    got = [v.numpy() for v in model.trainable_variables]
    everyone = [grads(r) for r in range(n)]
    for i, (v, s) in enumerate(zip(model.trainable_variables, start)):
        if i < 2:  # the local layer: this rank's own gradient
            want = s - 0.1 * everyone[me][i] / (n if scale else 1)
        else:
            want = s - 0.1 * np.mean([g[i] for g in everyone], axis=0)
        np.testing.assert_allclose(got[i], want, rtol=1e-5, atol=1e-6)
    with pytest.raises(TypeError, match="must be a Keras optimizer"):
        hvdk.PartialDistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1), local_layers=[local])


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_compute_gradients_then_apply_reduces_once(mode):
    """Horovod's Keras 2 method on Keras 3: _compute_gradients allreduces, apply_gradients of its
    pairs does not reduce again (op=Sum would count every rank's gradient twice)."""
    n, me = hvd.size(), hvd.rank()
    v = tf.Variable([0.0, 0.0])
    opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(1.0), op=hvd.Sum)
    coef = tf.constant([me + 1.0, 2.0])

    def step():
        pairs = opt._compute_gradients(lambda: tf.reduce_sum(coef * v), var_list=[v])
        opt.apply_gradients(pairs)
        return pairs[0][0]

    grad = (step if mode == "eager" else tf.function(step))()
    want = np.array([sum(r + 1.0 for r in range(n)), 2.0 * n])
    np.testing.assert_allclose(grad.numpy(), want)
    np.testing.assert_allclose(v.numpy(), -want)
    model = make_model()  # fit still reduces in apply (once)
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    x, y = batch(me, rows=4)
    model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    assert hvd.allgather_object(weights(model).tolist()) == [weights(model).tolist()] * n


def test_broadcast_callback_keeps_local_variables():
    n, me = hvd.size(), hvd.rank()
    root = n - 1
    init = keras.initializers.Constant(float(me))
    model = keras.Sequential([keras.Input((3,)),
                              keras.layers.Dense(3, kernel_initializer=init, bias_initializer=init, trainable=False),
                              keras.layers.Dense(2, kernel_initializer=init, bias_initializer=init)])
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.0)), loss="mse")
    local = model.layers[0].variables
    x, y = batch(me, rows=4)
    model.fit(x, y, batch_size=4, epochs=1, verbose=0,
              callbacks=[hvdk.callbacks.BroadcastGlobalVariablesCallback(root, local_variables=local)])
    for v in model.variables:
        want = float(me) if any(v is lv for lv in local) else float(root)
        np.testing.assert_array_equal(v.numpy(), np.full(v.shape, want, np.float32))
    with pytest.raises(ValueError, match="local_variables"):
        hvdk.callbacks.BroadcastGlobalVariablesCallback(0, local_variables=[np.zeros(2)])


def test_elastic_keras_state_sync_commit_restore():
    n, me = hvd.size(), hvd.rank()
    keras.utils.set_random_seed(50 + me)  # different weights on every rank
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    opt = keras.optimizers.Adam(0.01)
    opt.build(model.trainable_variables)
    state = hvdk.elastic.KerasState(model, opt, batch=10 + me, epoch=me)
    state.sync()
    synced = weights(model)
    assert hvd.allgather_object(synced.tolist()) == [synced.tolist()] * n
    assert (state.batch, state.epoch) == (10, 0)
    model.set_weights([w + 1 for w in model.get_weights()])
    state.batch = 99
    state.restore()
    np.testing.assert_array_equal(weights(model), synced)
    assert state.batch == 10
    model.set_weights([w * 2 for w in model.get_weights()])
    state.commit()
    state.restore()
    np.testing.assert_array_equal(weights(model), synced * 2)
    assert hvdk.elastic.run(lambda s, k: (s.batch, k))(state, 3) == (10, 3)
