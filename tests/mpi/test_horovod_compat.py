"""Horovod names and spellings that Horovod programs use besides the collectives: hvd.util,
hvd._executing_eagerly, hvd.elastic's states, Keras 2's Variable.ref() and BatchNormalization(fused=)
on Keras 3, PartialDistributedGradientTape.get_local_and_global_gradients, and Horovod's CPU
scaling arithmetic (float16 scaled in float32, integers in float64). References: NumPy, or the
same computation without Horovod on one process."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import mpidist.horovod.tensorflow as hvd
from horovod_support import MODES, data, run
from reference import assert_float32_close


@pytest.fixture(scope="module", autouse=True)
def initialized():
    hvd.init()


def test_util_and_executing_eagerly():
    assert hvd.util._executing_eagerly() is True and hvd._executing_eagerly() is True
    with tf.Graph().as_default():
        assert hvd.util._executing_eagerly() is False and hvd._executing_eagerly() is False


def test_elastic_tensorflow_state_sync_commit_restore():
    """sync gives every rank rank 0's variables and attributes and saves them; restore goes back to
    the last save; commit saves."""
    me = hvd.rank()
    variables = [tf.Variable(np.full((2, 2), me + 1.0)), tf.Variable(np.full(2, me + 1.0))]
    state = hvd.elastic.TensorFlowState(variables, batch=20 + me, epoch=10 + me)
    state.sync()
    assert all(np.array_equal(v.numpy(), np.ones(v.shape)) for v in variables)
    assert (state.batch, state.epoch) == (20, 10)
    for v in variables:
        v.assign(np.full(v.shape, 7.0))
    state.batch = 21
    state.restore()
    assert all(np.array_equal(v.numpy(), np.ones(v.shape)) for v in variables) and state.batch == 20
    for v in variables:
        v.assign(np.full(v.shape, 7.0))
    state.batch = 21
    state.commit()
    for v in variables:
        v.assign(np.full(v.shape, 9.0))
    state.restore()
    assert all(np.array_equal(v.numpy(), np.full(v.shape, 7.0)) for v in variables) and state.batch == 21
    ran = []
    hvd.elastic.run(lambda s, k: ran.append((s.epoch, k)))(state, "x")
    assert ran == [(10, "x")]  # run syncs first: rank 0's epoch everywhere


def test_function_traced_in_a_v1_graph_then_eagerly():
    """A tf.function traced inside a v1 graph, then the same program eagerly (Horovod's test files
    run every test in a graph, then eagerly, in one process): each context orders its collectives
    on a resource of its own, so the second trace does not reach into the finished graph."""
    n, me = hvd.size(), hvd.rank()
    x = data(me, (3,))
    want = sum(data(r, (3,)) for r in range(n))
    summed = tf.function(lambda t: hvd.allreduce(t, op=hvd.Sum))
    with tf.Graph().as_default():
        out = summed(tf.constant(x))
        with tf.compat.v1.Session() as sess:
            np.testing.assert_array_equal(sess.run(out), want)
    np.testing.assert_array_equal(tf.function(lambda t: hvd.allreduce(t, op=hvd.Sum))(tf.constant(x)).numpy(), want)
    np.testing.assert_array_equal(summed(tf.constant(x)).numpy(), want)


def test_keras_variables_fetched_by_a_v1_session():
    with tf.Graph().as_default():
        v = tf.keras.Variable(np.arange(3.0, dtype=np.float32))
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            np.testing.assert_array_equal(sess.run(v), np.arange(3.0))
            sess.run(v.value.assign(np.full(3, 5.0, np.float32)))  # the fetch reads the current value
            np.testing.assert_array_equal(sess.run(v), np.full(3, 5.0))


def test_keras_variables_have_ref_and_batch_norm_takes_fused():
    model = tf.keras.Sequential([tf.keras.layers.Dense(2), tf.keras.layers.BatchNormalization(fused=False)])
    model.build((None, 3))
    refs = {v.ref(): i for i, v in enumerate(model.trainable_weights)}
    assert len(refs) == len(model.trainable_weights)
    for i, v in enumerate(model.trainable_weights):
        assert refs[v.ref()] == i and v.ref().deref() is v
    x = data(0, (4, 3))
    plain = tf.keras.layers.BatchNormalization()
    assert_float32_close(tf.keras.layers.BatchNormalization(fused=True)(x, training=True),  # another kernel
                         plain(x, training=True))


def test_partial_tape_local_and_global_gradients():
    """The local layer's gradient stays on the rank (divided by the size), the other is averaged."""
    n, me = hvd.size(), hvd.rank()
    local, shared = tf.keras.layers.Dense(2), tf.keras.layers.Dense(1)
    x = tf.constant(data(me, (3, 4)))
    local.build((None, 4))
    shared.build((None, 2))
    for layer in (local, shared):  # the same initial weights on every rank, different data
        for v in layer.trainable_weights:
            v.assign(tf.reshape(tf.range(tf.size(v), dtype=v.dtype) / 10.0, v.shape))

    def grads(rank):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(shared(local(tf.constant(data(rank, (3, 4))))))
        return tape, loss
    tape, loss = grads(me)
    weights = local.trainable_weights + shared.trainable_weights
    tape = hvd.PartialDistributedGradientTape(tape, local_layers=[local])
    local_pairs, global_pairs = tape.get_local_and_global_gradients(loss, weights)
    assert [v.ref() for v, _ in local_pairs] == [v.ref() for v in local.trainable_weights]
    assert [v.ref() for v, _ in global_pairs] == [v.ref() for v in shared.trainable_weights]
    everyone = []
    for r in range(n):  # each rank's own gradients, computed here without Horovod
        t, l = grads(r)
        everyone.append([g.numpy() for g in t.gradient(l, weights)])
    for i, (_, g) in enumerate(local_pairs):
        np.testing.assert_allclose(g, everyone[me][i] / n, rtol=1e-5)
    for i, (_, g) in enumerate(global_pairs, start=len(local_pairs)):
        np.testing.assert_allclose(g, np.mean([e[i] for e in everyone], axis=0), rtol=1e-5)


@pytest.mark.parametrize("mode", MODES)
def test_scaling_arithmetic_is_horovod_s(mode):
    """float16 is scaled in float32 and cast back, integers in float64 (so Horovod's tests' exact
    expectations hold); each factor applied once, before or after the sum."""
    n, me = hvd.size(), hvd.rank()
    factor = 0.1915194503788923
    x16 = (data(me, (17,)) * 13.7).astype(np.float16)
    xi = data(me, (17,), dtype=np.int32) * 25
    pre16, post16, prei, posti = run(mode, lambda a, b: (
        hvd.allreduce(a, op=hvd.Sum, prescale_factor=factor), hvd.allreduce(a, op=hvd.Sum, postscale_factor=factor),
        hvd.allreduce(b, op=hvd.Sum, prescale_factor=factor), hvd.allreduce(b, op=hvd.Sum, postscale_factor=factor)),
        x16, xi)
    all16 = [(data(r, (17,)) * 13.7).astype(np.float16) for r in range(n)]
    alli = [data(r, (17,), dtype=np.int32) * 25 for r in range(n)]
    scaled16 = [(a.astype(np.float32) * np.float32(factor)).astype(np.float16) for a in all16]
    np.testing.assert_allclose(pre16, np.sum(scaled16, axis=0, dtype=np.float32).astype(np.float16), rtol=2e-3)
    total16 = np.sum(all16, axis=0, dtype=np.float32).astype(np.float16)
    np.testing.assert_array_equal(post16, (total16.astype(np.float32) * np.float32(factor)).astype(np.float16))
    np.testing.assert_array_equal(prei, np.sum([(a * factor).astype(np.int32) for a in alli], axis=0))
    np.testing.assert_array_equal(posti, (np.sum(alli, axis=0) * factor).astype(np.int32))
