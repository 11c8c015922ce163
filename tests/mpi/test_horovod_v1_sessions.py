"""Horovod collectives in ``tf.compat.v1`` graphs run by a Session: a run does the collectives its
fetches need and no others, in one order on every rank (mpidist/horovod/tensorflow/sessions.py);
TF1-style programs (placeholders, ``make_callable``, ``MonitoredTrainingSession`` with
``BroadcastGlobalVariablesHook`` and a ``tf.compat.v1.train`` optimizer) equal NumPy references.
Errors raise on every rank, and the next run works."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import mpidist.horovod.tensorflow as hvd
from horovod_support import data


@pytest.fixture(scope="module", autouse=True)
def initialized():
    hvd.init()


def _all(shape: tuple, seed: int) -> list[np.ndarray]:
    return [data(r, shape, seed=seed) for r in range(hvd.size())]


def test_fetching_a_later_collective_needs_nothing_of_an_earlier_one():
    """``b`` was built after ``a`` (fed by a placeholder): running ``b`` alone needs no feed, and
    running both gives both sums."""
    me = hvd.rank()
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [3])
        a = hvd.allreduce(x, op=hvd.Sum)
        b = hvd.allreduce(tf.constant(data(me, (2,), seed=1)), op=hvd.Sum)
        with tf.compat.v1.Session() as sess:
            np.testing.assert_array_equal(sess.run(b), sum(_all((2,), 1)))
            np.testing.assert_array_equal(sess.run(a, {x: data(me, (3,), seed=2)}), sum(_all((3,), 2)))
            got_a, got_b = sess.run([a, b], {x: data(me, (3,), seed=3)})
            np.testing.assert_array_equal(got_a, sum(_all((3,), 3)))
            np.testing.assert_array_equal(got_b, sum(_all((2,), 1)))


def test_plans_follow_what_each_run_fetches_and_feeds():
    """Plans are kept by a run's own fetches and fed keys: one list object holding another
    collective, the same fetch with an intermediate result fed (its collective cut) and without,
    and a collective built after earlier runs each run what they need now (a stale plan raises,
    "did not plan", or waits for a collective that never runs)."""
    me = hvd.rank()
    with tf.Graph().as_default():
        a = hvd.allreduce(tf.constant(data(me, (2,), seed=7)), op=hvd.Sum)
        b = hvd.allreduce(tf.constant(data(me, (3,), seed=8)), op=hvd.Sum)
        c = hvd.allreduce(a * 2.0, op=hvd.Sum)
        fetches = [a]
        with tf.compat.v1.Session() as sess:
            np.testing.assert_array_equal(sess.run(fetches)[0], sum(_all((2,), 7)))
            fetches[0] = b
            np.testing.assert_array_equal(sess.run(fetches)[0], sum(_all((3,), 8)))
            for _ in range(2):
                fed = np.array([1.0, 2.0], np.float32)
                np.testing.assert_array_equal(sess.run(c, {a: fed}), 2.0 * hvd.size() * fed)
                np.testing.assert_array_equal(sess.run(c), 2.0 * hvd.size() * sum(_all((2,), 7)))
            d = hvd.allreduce(c + b[:2], op=hvd.Sum)
            fetches[0] = d
            want = hvd.size() * (2.0 * hvd.size() * sum(_all((2,), 7)) + sum(_all((3,), 8))[:2])
            np.testing.assert_allclose(sess.run(fetches)[0], want, rtol=1e-6)


def test_a_run_does_only_the_collectives_it_fetches():
    """The input of an earlier collective counts its runs: runs of later collectives leave it alone
    (nothing before them runs again), and each later one is root 0's value."""
    with tf.Graph().as_default():
        counter = tf.Variable(0.0)
        first = hvd.allreduce(tf.reshape(counter.assign_add(1.0), [1]), op=hvd.Sum)
        later = [hvd.broadcast(tf.constant([float(hvd.rank() + i)]), 0) for i in range(5)]
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            assert sess.run(first).tolist() == [float(hvd.size())]
            for i, op in enumerate(later):
                assert sess.run(op).tolist() == [float(i)]
            assert sess.run(counter) == 1.0


def test_many_independent_collectives_in_one_run_on_one_thread():
    """Sixty broadcasts that depend on nothing, in one run, with one inter-op thread: they all
    complete (a waiting collective holds no thread) and each is root 0's value."""
    me = hvd.rank()
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=1, intra_op_parallelism_threads=1)
    with tf.Graph().as_default():
        variables = [tf.Variable(float(100 * me + i)) for i in range(60)]
        values = [hvd.broadcast(v, 0) for v in variables]
        with tf.compat.v1.Session(config=config) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for _ in range(2):
                assert [float(v) for v in sess.run(values)] == [float(i) for i in range(60)]
            assert [float(sess.run(v)) for v in values[::7]] == [float(i) for i in range(0, 60, 7)]


def test_make_callable_orders_its_collectives():
    me = hvd.rank()
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [4])
        summed = hvd.allreduce(x, op=hvd.Sum)
        gathered = hvd.allgather(tf.reshape(x, [1, 4]))
        with tf.compat.v1.Session() as sess:
            call = sess.make_callable([summed, gathered], feed_list=[x])
            for seed in (4, 5):
                got_sum, got_gathered = call(data(me, (4,), seed=seed))
                np.testing.assert_array_equal(got_sum, sum(_all((4,), seed)))
                np.testing.assert_array_equal(got_gathered, np.stack(_all((4,), seed)))


def test_error_in_a_run_raises_on_every_rank_and_the_next_run_works():
    """Shapes that differ between ranks: FailedPreconditionError on every rank, in a run with a good
    collective beside it; an argument error (alltoall's splits): InvalidArgumentError; then the
    good collective alone, and with the bad ones gone, every rank in step."""
    me = hvd.rank()
    with tf.Graph().as_default():
        good = hvd.allreduce(tf.constant(data(me, (3,), seed=6)), op=hvd.Sum)
        mismatched = hvd.allreduce(tf.ones([me + 1]), op=hvd.Sum)
        splits = tf.compat.v1.placeholder(tf.int32, [hvd.size()])
        bad_splits = hvd.alltoall(tf.ones([hvd.size() + 1]), splits=splits)[0]
        too_many = [hvd.size() + 2] + [0] * (hvd.size() - 1)
        with tf.compat.v1.Session() as sess:
            for _ in range(2):
                if hvd.size() > 1:
                    with pytest.raises(tf.errors.FailedPreconditionError, match="rank 1"):
                        sess.run([good, mismatched])
                with pytest.raises(tf.errors.InvalidArgumentError, match="splits"):
                    sess.run([bad_splits, good], {splits: too_many})
                for _ in range(3):
                    np.testing.assert_array_equal(sess.run(good), sum(_all((3,), 6)))


def test_collective_inside_control_flow_v1_is_refused_when_built():
    tf.compat.v1.disable_control_flow_v2()
    try:
        with tf.Graph().as_default():
            with pytest.raises(NotImplementedError, match="control flow v1"):
                tf.cond(tf.constant(True), lambda: hvd.allreduce(tf.ones([2])), lambda: tf.ones([2]))
    finally:
        tf.compat.v1.enable_control_flow_v2()


def test_monitored_training_session_with_the_broadcast_hook_equals_numpy():
    """Horovod's TF1 recipe: DistributedOptimizer over tf.compat.v1's GradientDescentOptimizer,
    placeholders fed each step, BroadcastGlobalVariablesHook(0) (the broadcast op is built after the
    training op), StopAtStepHook. Every rank starts from rank 0's weights and ends with the weights
    of plain gradient descent on the mean squared error of the global batch (NumPy)."""
    me, n, batch, lr, steps = hvd.rank(), hvd.size(), 4, 0.05, 3
    rng = np.random.default_rng(7)
    xs = rng.normal(size=(steps, n * batch, 3)).astype(np.float32)
    ys = rng.normal(size=(steps, n * batch, 1)).astype(np.float32)
    w0 = np.random.default_rng(100).normal(size=(3, 1)).astype(np.float32)  # rank 0's initial weights
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 3])
        y = tf.compat.v1.placeholder(tf.float32, [None, 1])
        start = np.random.default_rng(100 + me).normal(size=(3, 1)).astype(np.float32)
        w = tf.compat.v1.get_variable("w", initializer=tf.constant(start))
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - y))
        opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(lr))
        train_op = opt.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())
        with tf.control_dependencies([train_op]):
            updated = w.read_value()
        hooks = [hvd.BroadcastGlobalVariablesHook(0), tf.compat.v1.train.StopAtStepHook(last_step=steps)]
        step = 0
        with tf.compat.v1.train.MonitoredTrainingSession(hooks=hooks) as sess:
            np.testing.assert_array_equal(sess.run(w), w0)
            while not sess.should_stop():
                rows = slice(me * batch, (me + 1) * batch)
                final = sess.run(updated, {x: xs[step, rows], y: ys[step, rows]})
                step += 1
    expected = w0.astype(np.float64)
    for s in range(steps):
        grad = 2.0 / (n * batch) * xs[s].T.astype(np.float64) @ (xs[s] @ expected - ys[s])
        expected = expected - lr * grad
    assert step == steps
    np.testing.assert_allclose(final, expected, rtol=1e-5, atol=1e-6)
