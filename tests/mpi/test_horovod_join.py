"""hvd.join: ranks that ran out of data stand in (with zeros) for the allreduces of the others until
every rank has joined; join returns the last rank that joined. Compared with NumPy references over
every rank's known inputs."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import mpidist.horovod.tensorflow as hvd
from horovod_support import MODES, data, run


@pytest.fixture(scope="module", autouse=True)
def initialized():
    hvd.init()


@pytest.mark.parametrize("mode", MODES)
def test_joined_rank_contributes_the_identity(mode):
    n, me = hvd.size(), hvd.rank()
    first = n - 1  # joins at once; the others reduce, then join
    xs = [data(r, (3, 2)) for r in range(n)]
    ints = [data(r, (4,), np.int32, seed=1) for r in range(n)]
    if me == first:
        last = int(run(mode, lambda x: hvd.join() + 0 * x, np.int32(0)))
    else:
        def fn(x, i):
            return (hvd.allreduce(x, op=hvd.Average), hvd.allreduce(x, op=hvd.Sum),
                    hvd.grouped_allreduce([x, i], op=hvd.Sum), hvd.allreduce(x, op=hvd.Min),
                    hvd.allreduce(i, op=hvd.Max), hvd.allreduce(x, op=hvd.Product), hvd.join())
        avg, total, (g_x, g_i), low, high, prod, last = run(mode, fn, xs[me], ints[me])
        active = [r for r in range(n) if r != first]
        np.testing.assert_allclose(avg, np.sum([xs[r] for r in active], axis=0) / n, rtol=1e-6)  # divided by size
        np.testing.assert_allclose(total, np.sum([xs[r] for r in active], axis=0))
        np.testing.assert_allclose(g_x, total)
        np.testing.assert_array_equal(g_i, np.sum([ints[r] for r in active], axis=0))
        np.testing.assert_allclose(low, np.min([xs[r] for r in active], axis=0))
        np.testing.assert_array_equal(high, np.max([ints[r] for r in active], axis=0))
        np.testing.assert_allclose(prod, np.prod([xs[r] for r in active], axis=0))
        last = int(last)
    everyone = hvd.allgather_object(last)
    assert everyone == [everyone[0]] * n
    assert everyone[0] == (0 if n == 1 else n - 2)  # the highest of the ranks that joined last


@pytest.mark.parametrize("op", ["Min", "Sum", "Average"])
def test_a_rank_joining_during_repeated_calls_leaves_their_results_exact(op):
    """Repeated calls speculate their agreement (the data moves before the check); a rank that joins
    then stands by in that check, matches the speculated data step (with zeros: its result, wrong
    for Min, is dropped) and the call runs again with the op's identity from the joined rank. While
    every rank is active, join support exchanges nothing (tests/mpi/test_fusion_calls.py counts)."""
    n, me = hvd.size(), hvd.rank()
    hop = getattr(hvd, op)
    xs = [data(r, (5, 3), seed=2) + 10 for r in range(n)]  # all positive: a drained zero would show in Min
    x = tf.constant(xs[me])
    joiner = n - 1
    active = [r for r in range(n) if r != joiner] or [0]
    fold = {"Min": np.min, "Sum": np.sum, "Average": np.sum}[op]
    for step in range(4):  # steps 0-1 everyone (the repeat speculates), then the joiner stands by
        if me == joiner and step == 2 and n > 1:
            last = int(hvd.join())
            break
        got = hvd.allreduce(x, op=hop).numpy()
        ranks = list(range(n)) if step < 2 or n == 1 else active
        want = fold([xs[r] for r in ranks], axis=0) / (n if op == "Average" else 1)
        np.testing.assert_allclose(got, want, rtol=1e-6)
    else:
        last = int(hvd.join())
    assert last == (0 if n == 1 else n - 2)
    np.testing.assert_allclose(hvd.allreduce(tf.ones([1]), op=hvd.Sum).numpy(), [n])  # all active again


def test_join_returns_the_last_rank_that_joined():
    n, me = hvd.size(), hvd.rank()
    for _ in range(n - 1 - me):  # rank r reduces n-1-r times first, so rank 0 joins last
        hvd.allreduce(tf.ones([2]))
    assert int(hvd.join()) == 0
    assert int(hvd.join()) == n - 1  # all at once: the highest rank; join may be called again


def _grads(rank, step, w):
    rng = np.random.default_rng([step, rank])
    x = rng.standard_normal((4, 3)).astype(np.float32)
    y = rng.standard_normal((4, 1)).astype(np.float32)
    return x, y, 2 * x.T @ (x @ w - y) / len(x)


def test_without_the_agreement_check_join_exchanges_its_word_before_every_collective():
    """No agreement exchange to stand by in (``rc.check_agreement`` off): the control word goes
    before every Horovod collective (joins.py), with the same results."""
    import mpidist
    n, me = hvd.size(), hvd.rank()
    xs = [data(r, (3,), seed=3) for r in range(n)]
    with mpidist.rc.override(check_agreement=False):
        for step in range(n - 1 - me):  # rank r reduces n-1-r times, so rank 0 joins last
            got = hvd.allreduce(tf.constant(xs[me]), op=hvd.Sum).numpy()
            np.testing.assert_allclose(got, np.sum([xs[r] for r in range(n) if n - 1 - r > step], axis=0))
        assert int(hvd.join()) == 0
    np.testing.assert_allclose(hvd.allreduce(tf.ones([1]), op=hvd.Sum).numpy(), [n])


def test_uneven_training_loop_equals_reference():
    """Horovod's pattern: every rank trains on its own number of batches, then joins."""
    n, me = hvd.size(), hvd.rank()
    steps = [1 + r % 3 for r in range(n)]
    w0 = np.linspace(-1, 1, 3, dtype=np.float32).reshape(3, 1)
    w = tf.Variable(w0)
    opt = tf.keras.optimizers.SGD(0.1)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((tf.matmul(x, w) - y) ** 2)
        grads = hvd.DistributedGradientTape(tape).gradient(loss, [w])
        opt.apply_gradients(zip(grads, [w]))

    for s in range(steps[me]):
        x, y, _ = _grads(me, s, w.numpy())
        step(tf.constant(x), tf.constant(y))
    last = int(hvd.join())
    hvd.broadcast_variables([w], root_rank=last)  # as Horovod's docs advise: ranks that joined early lag
    ref = w0.copy()
    for s in range(max(steps)):
        ref = ref - 0.1 * np.sum([_grads(r, s, ref)[2] for r in range(n) if s < steps[r]], axis=0) / n
    np.testing.assert_allclose(w.numpy(), ref, rtol=1e-5, atol=1e-6)
    assert last == max(r for r in range(n) if steps[r] == max(steps))
    np.testing.assert_allclose(hvd.allreduce(tf.ones([1]), op=hvd.Sum).numpy(), [n])  # all active again


@pytest.mark.parametrize("what", ["allgather", "broadcast", "alltoall", "reducescatter", "barrier",
                                  "broadcast_object", "sparse_allreduce"])
def test_other_collectives_are_refused_on_every_rank(what):
    n, me = hvd.size(), hvd.rank()
    if n == 1:
        pytest.skip("needs a rank that joined and one that did not")
    calls = {"allgather": lambda: hvd.allgather(tf.ones([1, 2])),
             "broadcast": lambda: hvd.broadcast(tf.ones([2]), 0),
             "alltoall": lambda: hvd.alltoall(tf.ones([n])),
             "reducescatter": lambda: hvd.reducescatter(tf.ones([n])),
             "barrier": lambda: hvd.barrier(),
             "broadcast_object": lambda: hvd.broadcast_object("x"),
             "sparse_allreduce": lambda: hvd.allreduce(tf.IndexedSlices(tf.ones([1, 2]), tf.constant([0]),
                                                                        tf.constant([3, 2])))}
    kind = "allgather" if what == "sparse_allreduce" else what
    direct = what == "broadcast_object" and me != 0  # not a TensorFlow op: the engine's own error type
    with pytest.raises(ValueError if direct else tf.errors.FailedPreconditionError,
                       match=f"hvd.{kind}: not supported while a rank has joined"):
        if me == 0:
            hvd.join()
        else:
            calls[what]()
    np.testing.assert_allclose(hvd.allreduce(tf.ones([1]), op=hvd.Sum).numpy(), [n])  # usable afterwards


def test_different_collectives_while_a_rank_has_joined_fail_on_every_rank():
    n, me = hvd.size(), hvd.rank()
    if n < 3:
        pytest.skip("needs a rank that joined and two that did not")
    with pytest.raises(tf.errors.FailedPreconditionError, match="while a rank had joined"):
        if me == n - 1:
            hvd.join()
        elif me == 0:
            hvd.allreduce(tf.ones([2]))
        else:
            hvd.allgather(tf.ones([1, 2]))
    np.testing.assert_allclose(hvd.allreduce(tf.ones([1]), op=hvd.Sum).numpy(), [n])  # usable afterwards
