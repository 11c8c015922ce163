"""mpidist.horovod's Keras API with Keras 2 (tf_keras, ``TF_USE_LEGACY_KERAS=1``), against references
computed from every rank's known data: DistributedOptimizer of tf_keras's current and legacy
optimizers (fit, Horovod's gradient aggregation, local variables), the callbacks, load_model and
hvd.elastic's KerasState.

Runs in a job of its own with TF_USE_LEGACY_KERAS=1 (tests/run); elsewhere it skips itself.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from mpidist.tensorflow.keras import flavor  # noqa: E402

if not flavor.is_keras2():
    pytest.skip("Keras 2 tests: run with TF_USE_LEGACY_KERAS=1 and tf_keras installed (tests/run does)",
                allow_module_level=True)

import mpidist.horovod.keras as hvdk  # noqa: E402
import mpidist.horovod.tensorflow as hvd  # noqa: E402
from reference import CLIPS, assert_batch_norm_is_global, clipping_acts  # noqa: E402

pytestmark = [pytest.mark.keras2]
keras = tf.keras
OPTIMIZERS = {"current": keras.optimizers.SGD, "legacy": keras.optimizers.legacy.SGD}


@pytest.fixture(scope="module", autouse=True)
def initialized():
    hvd.init()


def batch(rank, rows=4, seed=0):
    rng = np.random.default_rng([seed, rank])
    return rng.standard_normal((rows, 3)).astype(np.float32), rng.standard_normal((rows, 1)).astype(np.float32)


def make_model(seed=3):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(1)])


def dataset(n, steps, per_rank=4):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((steps * per_rank * n, 3)).astype(np.float32)
    return x, (x @ np.array([[1.0], [-2.0], [0.5]], np.float32) + 0.1).astype(np.float32)


def weights(model):
    return np.concatenate([np.asarray(v).ravel() for v in model.weights])


@pytest.mark.parametrize("kind, passes, clip", [
    ("current", 1, "global_clipnorm"), ("current", 2, None), ("legacy", 1, "clipnorm"), ("legacy", 2, "clipvalue")])
def test_fit_equals_large_batch_reference(kind, passes, clip):
    """With clipping, the aggregated gradient is clipped (as one process clips the large batch's)."""
    n, me = hvd.size(), hvd.rank()
    steps, per = 4, 4
    x, y = dataset(n, steps)
    mine = np.arange(len(x)).reshape(steps, n, per)[:, me].ravel()  # rank me's batch s: rows [s, me]
    momentum = 0.0 if passes > 1 else 0.9

    def sgd(clipping):
        return OPTIMIZERS[kind](0.05, momentum=momentum, **({} if clipping is None else {clipping: CLIPS[clipping]}))
    model = make_model()
    opt = hvdk.DistributedOptimizer(sgd(clip), backward_passes_per_step=passes, average_aggregated_gradients=True)
    assert type(opt).__name__ == "SGD" and flavor.keras2_optimizer_kind(opt) == kind
    model.compile(optimizer=opt, loss="mse")
    history = model.fit(x[mine], y[mine], batch_size=per, epochs=2, shuffle=False, verbose=0,
                        callbacks=[hvdk.callbacks.BroadcastGlobalVariablesCallback(0),
                                   hvdk.callbacks.MetricAverageCallback()])

    ref = make_model()
    ref.compile(optimizer=sgd(clip), loss="mse")
    if clip is not None:
        with tf.GradientTape() as tape:
            loss = keras.losses.MeanSquaredError()(y[:per * n * passes], ref(x[:per * n * passes]))
        assert clipping_acts(clip, tape.gradient(loss, ref.trainable_variables)), "this test could not fail"
    ref.fit(x, y, batch_size=per * n * passes, epochs=2, shuffle=False, verbose=0)
    np.testing.assert_allclose(weights(model), weights(ref), rtol=1e-5, atol=1e-6)
    assert int(opt.iterations.numpy()) == 2 * steps  # Horovod: every call counts, applied or not
    assert hvd.allgather_object(weights(model).tolist()) == [weights(model).tolist()] * n
    losses = hvd.allgather_object(history.history["loss"])
    assert losses == [losses[0]] * n  # MetricAverageCallback: the same logs everywhere


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("average", [True, False], ids=["averaged", "summed"])
def test_gradient_aggregation_and_local_variables(mode, average):
    """Horovod's _agg_helper: local sums of 3 passes, allreduced on the third (divided by 3 when
    averaged), applied then; iterations count every call; a registered local variable keeps this
    rank's gradient, divided by the size (scale_local_gradients)."""
    n, me = hvd.size(), hvd.rank()
    passes = 3
    shared, local = tf.Variable([0.0, 0.0]), tf.Variable([0.0])
    opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(1.0), backward_passes_per_step=passes,
                                    average_aggregated_gradients=average)
    opt.register_local_var(local)
    _ = opt.iterations

    def coefficients(rank, call):
        return np.array([rank + 1.0, call + 1.0], np.float32), np.float32(rank - 2.0 * call)

    def step(a, b):
        grads_and_vars = opt._compute_gradients(
            lambda: tf.reduce_sum(a * shared) + b * local[0], var_list=[shared, local])
        opt.apply_gradients(grads_and_vars)
        return grads_and_vars[0][0]

    run = step if mode == "eager" else tf.function(step)
    want_shared, want_local, sums = np.zeros(2), np.zeros(1), [np.zeros(2, np.float32), [np.float32(0.0)] * n]
    for call in range(7):
        got_grad = run(*coefficients(me, call))
        sums[0] = sums[0] + np.mean([coefficients(r, call)[0] for r in range(n)], axis=0)
        sums[1] = [s + coefficients(r, call)[1] for r, s in enumerate(sums[1])]
        if (call + 1) % passes == 0:
            scale = 1.0 / passes if average else 1.0
            want_shared -= sums[0] * scale
            want_local -= sums[1][me] / n * scale
            np.testing.assert_allclose(got_grad.numpy(), sums[0] * scale, rtol=1e-6)
            sums = [np.zeros(2, np.float32), [np.float32(0.0)] * n]
        np.testing.assert_allclose(shared.numpy(), want_shared, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(local.numpy(), want_local, rtol=1e-6, atol=1e-6)
        assert int(opt.iterations.numpy()) == call + 1
        assert int(opt._agg_helper.counter.numpy()) == (call + 1) % passes


def test_partial_distributed_optimizer_and_compute_gradients():
    """PartialDistributedOptimizer(local_layers=) with a legacy optimizer: _compute_gradients returns
    the shared layers' gradients averaged, the local layer's this rank's own divided by the size."""
    n, me = hvd.size(), hvd.rank()
    keras.utils.set_random_seed(21)
    local = keras.layers.Dense(2, name="local")
    model = keras.Sequential([keras.Input((3,)), local, keras.layers.Dense(1, name="shared")])
    opt = hvdk.PartialDistributedOptimizer(keras.optimizers.legacy.Adam(lr=0.01), local_layers=[local])

    def grads(r):
        xr, yr = batch(r, rows=4, seed=4)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(xr) - yr) ** 2)
        return tape, loss
    tape, loss = grads(me)
    got = [g.numpy() for g, _ in opt._compute_gradients(loss, model.trainable_variables, tape=tape)]
    everyone = []
    for r in range(n):
        t, l = grads(r)
        everyone.append([g.numpy() for g in t.gradient(l, model.trainable_variables)])
    for i in range(4):
        want = everyone[me][i] / n if i < 2 else np.mean([g[i] for g in everyone], axis=0)
        np.testing.assert_allclose(got[i], want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_warmup_momentum_correction_equals_horovods_update(kind):
    """Horovod multiplies SGD's momentum by new_lr / old_lr for each batch whose rate the callback set:
    the legacy optimizer's momentum variable directly (Horovod's own code), tf_keras's current SGD
    through its velocities; both give Horovod's update."""
    n, me = hvd.size(), hvd.rank()
    x, y = batch(me, rows=8)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")])
    model.compile(optimizer=hvdk.DistributedOptimizer(OPTIMIZERS[kind](0.3, momentum=0.9)), loss="mse")
    warm = hvdk.callbacks.LearningRateWarmupCallback(initial_lr=0.3, warmup_epochs=2, steps_per_epoch=2)
    model.fit(x, y, batch_size=4, epochs=3, shuffle=False, verbose=0, callbacks=[warm])
    w, v, lr_before = np.zeros((3, 1)), np.zeros((3, 1)), 0.3
    for e in range(3):
        for b in range(2):
            lr = 0.3 / n * ((e + b / 2 + 1 / 2) * (n - 1) / 2 + 1) if e < 2 else lr_before
            momentum = 0.9 * lr / lr_before
            g = np.mean([2 * batch(r, rows=8)[0][4 * b:4 * b + 4].T
                         @ (batch(r, rows=8)[0][4 * b:4 * b + 4] @ w - batch(r, rows=8)[1][4 * b:4 * b + 4]) / 4
                         for r in range(n)], axis=0)
            v = momentum * v - lr * g
            w, lr_before = w + v, lr
    np.testing.assert_allclose(model.layers[0].kernel.numpy(), w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(model.optimizer.momentum if kind == "current" else model.optimizer.momentum.numpy()),
                               0.9, rtol=1e-6)  # restored after each corrected batch
    np.testing.assert_allclose(float(model.optimizer.lr.numpy()), 0.3, rtol=1e-6)


def test_broadcast_callback_keeps_local_variables():
    n, me = hvd.size(), hvd.rank()
    root = n - 1
    init = keras.initializers.Constant(float(me))
    model = keras.Sequential([keras.Input((3,)),
                              keras.layers.Dense(3, kernel_initializer=init, bias_initializer=init, trainable=False),
                              keras.layers.Dense(2, kernel_initializer=init, bias_initializer=init)])
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.legacy.SGD(0.0)), loss="mse")
    local = model.layers[0].variables
    x, y = batch(me, rows=4)
    model.fit(x, y, batch_size=4, epochs=1, verbose=0,
              callbacks=[hvdk.callbacks.BroadcastGlobalVariablesCallback(root, local_variables=local)])
    for v in model.variables:
        want = float(me) if any(v is lv for lv in local) else float(root)
        np.testing.assert_array_equal(v.numpy(), np.full(v.shape, want, np.float32))
    with pytest.raises(ValueError, match="local_variables"):
        hvdk.callbacks.BroadcastGlobalVariablesCallback(0, local_variables=[np.zeros(2)])


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_load_model_keeps_state_and_distributes(tmp_path_factory, kind):
    n, me = hvd.size(), hvd.rank()
    path = os.path.join(str(tmp_path_factory.mktemp(f"rank{me}")), "model.h5")
    model = make_model()
    model.compile(optimizer=OPTIMIZERS[kind](0.1, momentum=0.9), loss="mse")
    x, y = batch(0, rows=4)
    model.fit(x, y, batch_size=4, epochs=1, verbose=0)
    model.save(path)
    loaded = hvdk.load_model(path)
    assert flavor.keras2_optimizer_kind(loaded.optimizer) == kind
    assert int(loaded.optimizer.iterations.numpy()) == 1
    xm, ym = batch(me, rows=4, seed=9)
    start = weights(loaded)
    loaded.fit(xm, ym, batch_size=4, epochs=1, verbose=0)
    assert not np.allclose(weights(loaded), start)
    assert hvd.allgather_object(weights(loaded).tolist()) == [weights(loaded).tolist()] * n  # averaged update


def test_elastic_keras_state_sync_commit_restore():
    n, me = hvd.size(), hvd.rank()
    model = make_model(seed=50 + me)  # different weights on every rank
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    state = hvdk.elastic.KerasState(model, batch=10 + me, epoch=me)
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
    state.epoch = 5
    state.commit()
    state.restore()
    np.testing.assert_array_equal(weights(model), synced * 2)
    assert state.epoch == 5

    calls = []

    @hvdk.elastic.run
    def train(s, value):
        calls.append((s.batch, value))
        return value + 1

    assert train(state, 1) == 2 and calls == [(10, 1)]


def _bn_rows(rank, count, shape, seed=0):
    rng = np.random.default_rng([seed, rank])
    return (rng.standard_normal((count,) + shape) * (rank + 1) + rank).astype(np.float32)


@pytest.mark.parametrize("mode", ["eager", "function"])
@pytest.mark.parametrize("shape, uneven", [((2, 3), False), ((2, 3), True), ((2, 2, 3), False)],
                         ids=["3d", "3d-uneven", "4d"])  # 4d: where Keras 2 would pick its fused kernel
def test_sync_batch_normalization_is_the_concatenated_batch(mode, shape, uneven):
    """hvd.SyncBatchNormalization is a tf_keras layer (it goes into tf.keras models): its training
    outputs and moving statistics are tf_keras BatchNormalization's on the batch concatenated over
    the ranks; inference uses the moving statistics."""
    n, me = hvd.size(), hvd.rank()
    assert issubclass(hvd.SyncBatchNormalization, keras.layers.BatchNormalization)
    assert hvdk.SyncBatchNormalization is hvd.SyncBatchNormalization
    counts = [(r % 3) + 2 if uneven else 4 for r in range(n)]
    xs = [_bn_rows(r, counts[r], shape) for r in range(n)]
    sync = hvd.SyncBatchNormalization(momentum=0.5)
    ref = keras.layers.BatchNormalization(momentum=0.5, fused=False)  # fused: an unbiased moving variance
    call = tf.function(lambda layer, x: layer(x, training=True)) if mode == "function" else \
        (lambda layer, x: layer(x, training=True))
    assert_batch_norm_is_global(sync, ref, xs, me, lambda layer, x: call(layer, tf.constant(x)))


def test_sync_batch_normalization_fit_equals_the_global_batch():
    """Horovod's recipe with tf_keras: a model with hvd.SyncBatchNormalization, DistributedOptimizer,
    fit on each rank's shard equals one process's BatchNormalization model on the global batch."""
    n, me, steps = hvd.size(), hvd.rank(), 3
    x, y = dataset(n, steps)

    def build(layer):
        keras.utils.set_random_seed(4)
        return keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), layer, keras.layers.Dense(1)])

    model = build(hvd.SyncBatchNormalization())
    model.compile(optimizer=hvdk.DistributedOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    shard = np.concatenate([np.arange(s * 4 * n + me * 4, s * 4 * n + me * 4 + 4) for s in range(steps)])
    model.fit(x[shard], y[shard], batch_size=4, epochs=1, shuffle=False, verbose=0)
    reference = build(keras.layers.BatchNormalization())
    reference.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    reference.fit(x, y, batch_size=4 * n, epochs=1, shuffle=False, verbose=0)
    np.testing.assert_allclose(weights(model), weights(reference), rtol=1e-4, atol=1e-5)


def test_sync_batch_normalization_arguments():
    with pytest.raises(ValueError, match="does not support fused=True"):
        hvd.SyncBatchNormalization(fused=True)
    layer = hvd.SyncBatchNormalization(axis=1)
    assert layer.name.startswith("sync_batch_normalization") and layer.fused is False
    config = layer.get_config()
    assert keras.layers.deserialize({"class_name": "mpidist.horovod>SyncBatchNormalization",
                                     "config": config}).axis == layer.axis


def test_tf1_style_program_in_a_v1_graph_equals_numpy():
    """A TensorFlow 1-style tf_keras program (the callbacks of Horovod's keras_mnist_advanced.py) in a
    v1 graph: ``keras.optimizers.legacy.SGD`` with momentum wrapped in ``hvd.DistributedOptimizer``,
    ``BroadcastGlobalVariablesCallback(0)``, ``MetricAverageCallback``, ``LearningRateWarmupCallback``;
    every rank starts from its own weights and trains on its own rows. The final weights equal NumPy's:
    each step the gradients averaged over the ranks, after the first batch rank 0's weights (and
    velocity) on every rank (Horovod's callback broadcasts then), the learning rate of Horovod's warmup
    with its momentum correction. (The program called ``tf.compat.v1.disable_eager_execution()`` in a
    job of its own; here its graph is the block's, so the rest of the job stays eager.)"""
    me, n = hvd.rank(), hvd.size()
    batch_size, steps, epochs, lr, momentum = 8, 3, 2, 0.1, 0.5
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(n, steps * batch_size, 4)).astype(np.float32)
    ys = rng.normal(size=(n, steps * batch_size, 1)).astype(np.float32)
    w0 = [np.random.default_rng(10 + r).normal(size=(4, 1)).astype(np.float32) for r in range(n)]
    b0 = [np.full([1], 0.1 * r, np.float32) for r in range(n)]
    with tf.Graph().as_default():
        assert not tf.compat.v1.executing_eagerly_outside_functions()  # tf_keras's v1 training loop
        model = keras.Sequential([keras.layers.Dense(1, input_shape=(4,),
                                                     kernel_initializer=keras.initializers.Constant(w0[me]),
                                                     bias_initializer=keras.initializers.Constant(b0[me]))])
        model.compile(hvdk.DistributedOptimizer(keras.optimizers.legacy.SGD(lr, momentum=momentum)), "mse")
        history = model.fit(xs[me], ys[me], batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0,
                            callbacks=[hvdk.callbacks.BroadcastGlobalVariablesCallback(0),
                                       hvdk.callbacks.MetricAverageCallback(),
                                       hvdk.callbacks.LearningRateWarmupCallback(initial_lr=lr, warmup_epochs=1)])
        w, b = model.get_weights()

    def warmup_lr(step: int) -> float:  # Horovod's warmup over epoch 0, then lr
        if step >= steps:
            return lr
        return lr / n * ((step + 1) / steps * (n - 1) / 1 + 1)

    ws = [x.astype(np.float64) for x in w0]
    bs = [x.astype(np.float64) for x in b0]
    vw = [np.zeros_like(x) for x in ws]  # legacy SGD: v = momentum * v - lr * g; w += v
    vb = [np.zeros_like(x) for x in bs]
    old_lr = lr
    for step in range(epochs * steps):
        rows = slice((step % steps) * batch_size, (step % steps + 1) * batch_size)
        step_lr = warmup_lr(step)
        # Horovod's momentum correction: momentum * new / old for the batch where the rate changes
        mom = momentum * step_lr / old_lr if step < steps else momentum
        old_lr = step_lr
        residuals = [xs[r][rows] @ ws[r] + bs[r] - ys[r][rows] for r in range(n)]
        gw = np.mean([2.0 / batch_size * xs[r][rows].T @ residuals[r] for r in range(n)], axis=0)
        gb = np.mean([2.0 / batch_size * residuals[r].sum(axis=0) for r in range(n)], axis=0)
        vw = [mom * v - step_lr * gw for v in vw]
        vb = [mom * v - step_lr * gb for v in vb]
        ws = [x + v for x, v in zip(ws, vw)]
        bs = [x + v for x, v in zip(bs, vb)]
        if step == 0:  # BroadcastGlobalVariablesCallback: rank 0's weights and velocity after the first batch
            ws, bs, vw, vb = [ws[0]] * n, [bs[0]] * n, [vw[0]] * n, [vb[0]] * n
    assert np.isclose(history.history["lr"][-1], lr), history.history
    np.testing.assert_allclose(w, ws[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(b, bs[0], rtol=1e-4, atol=1e-5)
