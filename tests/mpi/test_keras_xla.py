"""``jit_compile=True`` under mpidist strategies (Keras 3 and TensorFlow custom loops), against
``jit_compile=False`` and one process.

The step is compiled by XLA in two parts, the gradients' all-reduce between them
(mpidist/tensorflow/xla.py). Each test trains the same model with and without XLA under the
strategy and, on the chief, without a strategy on the global batches: the weights must be the
same on every rank and agree within float32 tolerance (XLA fuses and reorders float arithmetic).
That XLA compiled the two parts is checked on the functions themselves (made with
``jit_compile=True``, traced, called: TensorFlow compiles such a function with XLA or fails, it
never falls back) and, where this process's XLA writes its dumps (XLA_FLAGS set below before
XLA's first compilation), on the modules XLA compiled.
"""
from __future__ import annotations

import atexit
import glob
import os
import shutil
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
_DUMPS = tempfile.mkdtemp(prefix="mpidist-xla-dump-")
atexit.register(shutil.rmtree, _DUMPS, True)
if "--xla_dump_to" not in os.environ.get("XLA_FLAGS", ""):  # read once, at XLA's first compilation
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_dump_to={_DUMPS}".strip()

import numpy as np  # noqa: E402
import pytest  # noqa: E402

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import mpidist  # noqa: E402
import mpidist.on_tensorflow  # noqa: E402
import mpidist.tensorflow  # noqa: E402
from mpidist.cross_device.options import CommunicationOptions  # noqa: E402
from mpidist.tensorflow import XlaCollectiveError, xla  # noqa: E402
from mpidist.tensorflow.keras import xla as keras_xla  # noqa: E402

pytestmark = pytest.mark.mpi
GLOBAL_BATCH = 24  # a multiple of every tested size (1, 2, 3, 4): equal blocks, so Keras's loss is the global mean
TOL = 1e-5  # float32: a few ulps of O(1) weights after 8 steps, different summation orders


def data(n: int = 96, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 8)).astype(np.float32)
    y = (x[:, :3].sum(axis=1) > 0).astype(np.int64) + (x[:, 3] > 1).astype(np.int64)
    return x, y


def mlp(embedding: bool = False):
    if embedding:  # inputs read as 8 token ids (x scaled, clipped to 0..31): sparse gradients (IndexedSlices)
        first = [keras.layers.Lambda(lambda t: keras.ops.cast(keras.ops.clip(t * 4 + 16, 0, 31), "int32")),
                 keras.layers.Embedding(32, 4), keras.layers.Flatten()]
    else:
        first = []
    return keras.Sequential([keras.Input((8,))] + first + [keras.layers.Dense(16, activation="relu"),
                                                           keras.layers.Dense(3)])


def optimizer(kind: str):
    if kind == "sgd":
        return keras.optimizers.SGD(0.1, momentum=0.9)
    if kind == "adam_accumulate":  # the update in a cond, every second step
        return keras.optimizers.Adam(0.01, gradient_accumulation_steps=2)
    return keras.optimizers.Adam(0.01)


def loss_fn(reduction="sum_over_batch_size"):
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=reduction)


def on_chief(comm, fn):
    """``fn()`` computed by rank 0 only (the single-process reference), sent to every rank."""
    return comm.bcast(fn() if comm.Get_rank() == 0 else None, root=0)


def assert_same_on_every_rank(comm, weights):
    everyone = comm.allgather([np.asarray(w) for w in weights])
    for other in everyone[1:]:
        for a, b in zip(everyone[0], other):
            np.testing.assert_array_equal(a, b)


def assert_close(weights, reference, tol=TOL):
    for a, b in zip(weights, reference):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=tol, rtol=tol)


def _dumped() -> set[str]:
    return {os.path.basename(p) for p in glob.glob(os.path.join(_DUMPS, "*.before_optimizations.txt"))}


def _dumps_work() -> bool:
    """Whether this process's XLA writes its dumps (not when XLA compiled before XLA_FLAGS was set)."""
    before = _dumped()
    tf.function(lambda v: v * 2.0 + 1.0, jit_compile=True)(tf.constant([float(len(before))]))
    return len(_dumped()) > len(before)


DUMPS_WORK = _dumps_work()


def train_split(model):
    """The SplitStep mpidist made for a Keras 3 model's train step."""
    found = [s for s in keras_xla.split_steps(model) if s.name == "train_step"]
    assert len(found) == 1, [s.name for s in keras_xla.split_steps(model)]
    return found[0]


def assert_compiled(split, before: set[str], update: bool = True):
    """``split`` (an xla.SplitStep) ran its forward/backward pass and (with ``update``) its optimizer
    update as XLA functions: made with jit_compile=True, traced, and (where dumps work) compiled by
    XLA since ``before`` (the dump listing taken before the run)."""
    parts = [split.forward_backward] + (split.update_functions() if update else [])
    assert len(parts) == (2 if update else 1), f"{split.name}: expected {2 if update else 1} compiled parts"
    for function in parts:
        assert function.function_spec.jit_compile is True
        assert function.experimental_get_tracing_count() >= 1
    if DUMPS_WORK:
        new = _dumped() - before
        wanted = [f"{split.name}_forward_backward"] + ([f"{split.name}_update"] if update else [])
        for name in wanted:
            assert any(f"_{name}_" in module for module in new), f"XLA compiled no module for {name}: {sorted(new)}"


@pytest.mark.parametrize("kind, steps_per_execution, embedding", [
    ("adam", 1, False), ("sgd", 2, False), ("adam_accumulate", 1, True)])
def test_fit_jit_compile_equals_no_jit_and_one_process(eng, comm, kind, steps_per_execution, embedding):
    strategy = mpidist.on_tensorflow.MultiWorkerMirroredStrategy.on_engine(eng, CommunicationOptions())
    x, y = data()
    with strategy.scope():
        initial = mlp(embedding)
    weights = initial.get_weights()
    assert_same_on_every_rank(comm, weights)
    results = {}
    for jit in (False, True):
        with strategy.scope():
            model = mlp(embedding)
            model.compile(optimizer=optimizer(kind), loss=loss_fn(), metrics=["accuracy"], jit_compile=jit,
                          steps_per_execution=steps_per_execution)
        model.set_weights(weights)
        before = _dumped()
        history = model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=2, shuffle=False, verbose=0)
        assert model.jit_compile is jit
        if jit:
            assert_compiled(train_split(model), before)
        results[jit] = model.get_weights(), history.history

    def single_process():
        model = mlp(embedding)
        model.compile(optimizer=optimizer(kind), loss=loss_fn(), metrics=["accuracy"], jit_compile=True)
        model.set_weights(weights)
        history = model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=2, shuffle=False, verbose=0)
        return model.get_weights(), history.history

    ref_weights, ref_history = on_chief(comm, single_process)
    for weights_, history in results.values():
        assert_same_on_every_rank(comm, weights_)
        assert_close(weights_, ref_weights)
        for key in ("loss", "accuracy"):  # global epoch metrics, as one process logs them
            np.testing.assert_allclose(history[key], ref_history[key], rtol=TOL)
    assert_close(results[True][0], results[False][0])


def local_rows(eng, x, y, step):
    """This rank's block of global batch ``step`` (the ranks' blocks make the batch, in rank order)."""
    batch = slice(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH)
    blocks = np.array_split(np.arange(GLOBAL_BATCH), eng.size)[eng.rank]
    return x[batch][blocks], y[batch][blocks]


@pytest.mark.parametrize("outer", ["tf.function", "eager"])
def test_custom_loop_jit_compile_equals_no_jit_and_one_process(eng, comm, outer):
    strategy = mpidist.on_tensorflow.MultiWorkerMirroredStrategy.on_engine(eng, CommunicationOptions())
    x, y = data(seed=1)
    steps = len(x) // GLOBAL_BATCH
    with strategy.scope():
        weights = mlp().get_weights()

    def train(jit: bool):
        with strategy.scope():
            model, opt = mlp(), optimizer("adam")
        model.set_weights(weights)
        per_example = loss_fn("none")

        def step_fn(xb, yb):
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(per_example(yb, model(xb, training=True)),
                                                  global_batch_size=GLOBAL_BATCH)
            grads = tape.gradient(loss, model.trainable_variables)
            opt.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        replica_fn = tf.function(step_fn, jit_compile=True) if jit else step_fn

        def run(xb, yb):
            return strategy.reduce("SUM", strategy.run(replica_fn, args=(xb, yb)), axis=None)

        if outer == "tf.function":
            run = tf.function(run)
        before = _dumped()
        losses = [float(run(*local_rows(eng, x, y, s))) for s in range(steps)]
        if jit:
            assert_compiled(xla.split(replica_fn), before)
        return model.get_weights(), losses, int(opt.iterations)

    def single_process():
        model, opt = mlp(), optimizer("adam")
        model.set_weights(weights)
        losses = []
        for s in range(steps):
            xb, yb = x[s * GLOBAL_BATCH:(s + 1) * GLOBAL_BATCH], y[s * GLOBAL_BATCH:(s + 1) * GLOBAL_BATCH]
            with tf.GradientTape() as tape:
                loss = loss_fn()(yb, model(xb, training=True))
            opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            losses.append(float(loss))
        return model.get_weights(), losses

    ref_weights, ref_losses = on_chief(comm, single_process)
    plain, compiled = train(False), train(True)
    for weights_, losses, iterations in (plain, compiled):
        assert iterations == steps
        assert_same_on_every_rank(comm, weights_)
        assert_close(weights_, ref_weights)
        np.testing.assert_allclose(losses, ref_losses, rtol=TOL)
    assert_close(compiled[0], plain[0])


@pytest.fixture
def mixed_float16():
    keras.mixed_precision.set_global_policy("mixed_float16")
    yield
    keras.mixed_precision.set_global_policy("float32")


def test_mixed_float16_dynamic_loss_scale_with_jit_compile(eng, comm, mixed_float16):
    """Dynamic loss scaling: the scale grows every 2 finite steps and halves on the batch whose
    inputs overflow float16 on every rank (a skipped step); scale, step count and weights as one
    process (float16 arithmetic: its tolerance)."""
    strategy = mpidist.on_tensorflow.MultiWorkerMirroredStrategy.on_engine(eng, CommunicationOptions())
    x, y = data(144, seed=2)
    x[GLOBAL_BATCH:2 * GLOBAL_BATCH] = 1e5  # batch 1: inf in float16 on every rank's block
    with strategy.scope():
        weights = mlp().get_weights()

    def fit(jit: bool, scope) -> tuple:
        with scope():
            model = mlp()
            opt = keras.optimizers.LossScaleOptimizer(optimizer("sgd"), initial_scale=2.0 ** 10,
                                                      dynamic_growth_steps=2)
            model.compile(optimizer=opt, loss=loss_fn(), jit_compile=jit)
        model.set_weights(weights)
        before = _dumped()
        model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=1, shuffle=False, verbose=0)
        if jit and scope is strategy.scope:
            assert_compiled(train_split(model), before)
        return model.get_weights(), float(opt.dynamic_scale), int(opt.iterations)

    import contextlib
    ref_weights, ref_scale, ref_iterations = on_chief(comm, lambda: fit(True, contextlib.nullcontext))
    assert ref_iterations == len(x) // GLOBAL_BATCH - 1  # the overflowing batch was skipped
    assert ref_scale == 2.0 ** 10 * 2 ** 2 / 2  # 5 finite steps (2 growths), one halving
    for jit in (False, True):
        weights_, scale, iterations = fit(jit, strategy.scope)
        assert_same_on_every_rank(comm, weights_)
        assert (scale, iterations) == (ref_scale, ref_iterations)
        assert_close(weights_, ref_weights, tol=2e-3)


def test_what_cannot_be_split_is_a_clear_error_on_every_rank(eng, comm):
    strategy = mpidist.on_tensorflow.MultiWorkerMirroredStrategy.on_engine(eng, CommunicationOptions())
    with strategy.scope():
        model, other, opt = mlp(), mlp(), optimizer("sgd")
        opt.build(model.trainable_variables)
    xb, yb = tf.constant(data(4)[0]), tf.constant(data(4)[1])

    def loss_of(net):
        return tf.reduce_mean(loss_fn("none")(yb, net(xb, training=True)))

    def reduces_its_loss(xs):  # a collective in the forward pass
        with tf.GradientTape() as tape:
            loss = tf.distribute.get_replica_context().all_reduce("sum", loss_of(model))
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    def uses_updated_weights(xs):  # a second forward pass through the weights just updated
        with tf.GradientTape() as tape:
            loss = loss_of(model)
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss_of(model) + loss_of(other)

    def outer_step(xs):  # strategy.run inside a function XLA compiles whole
        return strategy.run(lambda v: tf.distribute.get_replica_context().all_reduce("sum", v), args=(xs,))

    cases = [
        (lambda: strategy.run(tf.function(reduces_its_loss, jit_compile=True), args=(xb,)),
         r"all_reduce: cannot run inside `reduces_its_loss`'s forward and backward pass.*jit_compile=False"),
        (lambda: strategy.run(tf.function(uses_updated_weights, jit_compile=True), args=(xb,)),
         r"uses_updated_weights: .*after SGD\.apply.*uses variable `[^`]*kernel`"),
        (lambda: tf.function(outer_step, jit_compile=True)(xb),
         r"cannot run inside `outer_step`, which is being compiled whole by XLA \(jit_compile=True\).*"
         r"strategy\.run\(tf\.function\(step_fn, jit_compile=True\)"),
    ]
    for call, message in cases:
        with pytest.raises(XlaCollectiveError, match=message):
            call()
    # every rank raised at trace time, before any collective: the job is still in step
    total = strategy.reduce("SUM", tf.constant(float(eng.rank + 1)), axis=None)
    assert float(total) == eng.size * (eng.size + 1) / 2


def test_jit_compile_auto_picks_xla_as_keras_does_without_a_strategy(eng, monkeypatch):
    """Keras's "auto" turns XLA on where a GPU is seen (never under a tf.distribute strategy);
    under an mpidist strategy it decides as without one. No GPU here: TensorFlow is made to list one."""
    strategy = mpidist.on_tensorflow.MultiWorkerMirroredStrategy.on_engine(eng, CommunicationOptions())

    def auto_choice(scope) -> bool:
        with scope():
            model = mlp()
            model.compile(optimizer="sgd", loss="mse")  # jit_compile="auto"
        return model.jit_compile

    import contextlib
    real = tf.config.list_physical_devices
    assert auto_choice(strategy.scope) is auto_choice(contextlib.nullcontext) is False  # CPU only
    fake_gpu = tf.config.PhysicalDevice(name="/physical_device:GPU:0", device_type="GPU")
    monkeypatch.setattr(tf.config, "list_physical_devices",
                        lambda kind=None: real(kind) + ([fake_gpu] if kind in (None, "GPU") else []))
    assert auto_choice(contextlib.nullcontext) is True
    assert auto_choice(strategy.scope) is True
    with tf.distribute.OneDeviceStrategy("/cpu:0").scope():  # TensorFlow's own: Keras keeps XLA off
        model = mlp()
        model.compile(optimizer="sgd", loss="mse")
    assert model.jit_compile is False


def test_evaluate_and_predict_with_jit_compile(eng, comm):
    """Steps without an optimizer update compile whole (part 1 alone) and give what jit_compile=False gives."""
    strategy = mpidist.on_tensorflow.MultiWorkerMirroredStrategy.on_engine(eng, CommunicationOptions())
    x, y = data(72, seed=3)
    outputs = {}
    with strategy.scope():
        weights = mlp().get_weights()
    for jit in (False, True):
        with strategy.scope():
            model = mlp()
            model.compile(optimizer="sgd", loss=loss_fn(), metrics=["accuracy"], jit_compile=jit)
        model.set_weights(weights)
        outputs[jit] = (model.evaluate(x, y, batch_size=GLOBAL_BATCH, verbose=0),
                        model.predict(x, batch_size=GLOBAL_BATCH, verbose=0))
    np.testing.assert_allclose(outputs[True][0], outputs[False][0], rtol=TOL)
    np.testing.assert_allclose(outputs[True][1], outputs[False][1], rtol=TOL, atol=TOL)
    assert outputs[True][1].shape == (len(x), 3)
