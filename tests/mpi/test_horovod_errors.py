"""Errors of mpidist.horovod.tensorflow are errors on every rank, of Horovod's types, in every mode
(eagerly, in a tf.function, in a tf.compat.v1 graph), and the job goes on in step afterwards.

- Ranks that issue different collectives (shapes, dtypes, roots, trailing shapes of alltoall):
  tf.errors.FailedPreconditionError on every rank, in graphs too.
- A call that fails on one rank only, before its engine call (an unsupported op, a scalar, bad
  alltoall splits, a root that is not a rank): that rank raises its own error, the others an error
  of the same kind naming it; then ten collectives of every kind equal their NumPy references.
"""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import mpidist.horovod.tensorflow as hvd
from mpidist.errors import CollectiveFailedError
from horovod_support import MODES, data, run


@pytest.fixture(scope="module", autouse=True)
def initialized():
    hvd.init()


def ten_good_ones(mode):
    """Ten Horovod collectives of every kind, each equal to its NumPy reference on every rank."""
    n, me = hvd.size(), hvd.rank()
    for i in range(10):
        xs = [data(r, (2 * n, 3), seed=20 + i) for r in range(n)]
        kind = i % 5
        if kind == 0:
            got = run(mode, lambda x: hvd.allreduce(x, op=hvd.Sum), xs[me])
            np.testing.assert_array_equal(got, np.sum(xs, axis=0))
        elif kind == 1:
            rows = [xs[r][:r % 3 + 1] for r in range(n)]
            np.testing.assert_array_equal(run(mode, hvd.allgather, rows[me]), np.concatenate(rows))
        elif kind == 2:
            np.testing.assert_array_equal(run(mode, lambda x: hvd.broadcast(x, n - 1), xs[me]), xs[n - 1])
        elif kind == 3:
            got = run(mode, hvd.alltoall, xs[me])
            np.testing.assert_array_equal(got, np.concatenate([x[2 * me:2 * me + 2] for x in xs]))
        else:
            got = run(mode, lambda x: hvd.reducescatter(x, op=hvd.Sum), xs[me])
            np.testing.assert_array_equal(got, np.sum(xs, axis=0)[2 * me:2 * me + 2])


# -- mismatches: FailedPreconditionError on every rank, in every mode ----------------------------------

def _mismatches(n, me):
    other = me % 2  # rank 0 differs from rank 1 (and every odd rank)
    return {
        "allreduce shape": (lambda x: hvd.allreduce(x[:2 + other]), np.ones((4, 2), np.float32)),
        "allreduce dtype": (lambda x: hvd.allreduce(tf.cast(x, tf.float64) if other else x), np.ones(3, np.float32)),
        "allgather trailing shape": (lambda x: hvd.allgather(x[:, :1 + other]), np.ones((2, 3), np.float32)),
        "broadcast root": (lambda x: hvd.broadcast(x, root_rank=other), np.ones(3, np.float32)),
        "broadcast dtype": (lambda x: hvd.broadcast(tf.cast(x, tf.int32) if other else x, 0), np.ones(3, np.float32)),
        "alltoall trailing shape": (lambda x: hvd.alltoall(x[:, :1 + other]), np.ones((2 * n, 3), np.float32)),
        "reducescatter shape": (lambda x: hvd.reducescatter(x[:, :1 + other]), np.ones((2 * n, 3), np.float32)),
    }


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(_mismatches(2, 0)))
def test_a_mismatch_is_failed_precondition_on_every_rank_in_every_mode(mode, case):
    fn, x = _mismatches(hvd.size(), hvd.rank())[case]
    with pytest.raises(tf.errors.FailedPreconditionError, match="issued different collectives|same dtype"):
        run(mode, fn, x)
    ten_good_ones(mode)


# -- a failure on one rank before its engine call ------------------------------------------------------

# name: (the failing rank's call, the others' call, the failing rank's error, the others' error in
#        eager mode, the error TensorFlow raises for both inside graphs)
def _one_rank_cases(n):
    x = np.ones((2 * n, 2), np.float32)
    big = [2 * n + 1] + [0] * (n - 1)  # sums to more rows than the tensor has
    return {
        "allreduce Adasum": (lambda t: hvd.allreduce(t, op=hvd.Adasum), lambda t: hvd.allreduce(t), x,
                             NotImplementedError, NotImplementedError, tf.errors.UnimplementedError),
        "allgather scalar": (lambda t: hvd.allgather(t[0, 0]), hvd.allgather, x,
                             ValueError, ValueError, tf.errors.InvalidArgumentError),
        "alltoall splits": (lambda t: hvd.alltoall(t, splits=big)[0], lambda t: hvd.alltoall(t, splits=[2] * n)[0], x,
                            tf.errors.InvalidArgumentError, tf.errors.InvalidArgumentError,
                            tf.errors.InvalidArgumentError),
        "broadcast root": (lambda t: hvd.broadcast(t, root_rank=n), lambda t: hvd.broadcast(t, 0), x,
                           ValueError, ValueError, tf.errors.InvalidArgumentError),
        "reducescatter scalar": (lambda t: hvd.reducescatter(t[0, 0]), hvd.reducescatter, x,
                                 ValueError, ValueError, tf.errors.InvalidArgumentError),
    }


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", sorted(_one_rank_cases(2)))
def test_an_error_on_one_rank_before_the_engine_is_an_error_on_every_rank(mode, case):
    n, me = hvd.size(), hvd.rank()
    failing = n - 1
    bad, good, x, own, peer, in_graph = _one_rank_cases(n)[case]
    with pytest.raises(Exception) as info:
        run(mode, bad if me == failing else good, x)
    error = info.value
    if mode == "eager" or me == failing and not isinstance(error, tf.errors.OpError):
        # eagerly, and a failure while a graph is built (before it runs): the Python error itself
        assert isinstance(error, own if me == failing else peer), repr(error)
        assert isinstance(error, CollectiveFailedError) == (me != failing), repr(error)
    else:
        assert isinstance(error, in_graph), repr(error)
    if me != failing:
        assert f"rank {failing} failed before the collective" in str(error), str(error)
    ten_good_ones(mode)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("mode", MODES)
def test_the_same_error_on_every_rank_is_each_rank_s_own(mode):
    """Every rank fails alike: each raises its own error (there is no other rank to name)."""
    with pytest.raises((ValueError, tf.errors.InvalidArgumentError), match="scalar|dimension"):
        run(mode, hvd.allgather, np.float32(1))
    with pytest.raises(tf.errors.InvalidArgumentError, match="divisible|sum of `splits`"):
        run(mode, hvd.alltoall, np.ones(2 * hvd.size() + 1, np.float32)) if hvd.size() > 1 else \
            run(mode, lambda t: hvd.alltoall(t, splits=[3]), np.ones(2, np.float32))
    ten_good_ones(mode)


@pytest.mark.mpi(min_size=2)
def test_a_failure_in_a_gradient_is_an_error_on_every_rank():
    """An allgather whose backward pass fails on one rank (an upstream gradient of the wrong shape
    there): every rank raises from tape.gradient, and the next steps are right."""
    n, me = hvd.size(), hvd.rank()
    x = tf.constant(data(me, (2, 3)))
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = hvd.allgather(x)
    upstream = tf.ones([2 * n, 3]) if me != n - 1 else tf.ones([2 * n, 4])
    with pytest.raises(Exception) as info:
        tape.gradient(y, x, output_gradients=upstream)
    assert isinstance(info.value, (ValueError, tf.errors.InvalidArgumentError, tf.errors.FailedPreconditionError))
    ten_good_ones("eager")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mode", ["function", "graph"])
def test_after_an_error_in_a_graph_no_rank_starts_the_next_collective(mode):
    """A graph whose first collective mismatches and whose next ones would run after it: every rank
    raises in the first, none starts the next (they wait for the first one's check), so the ranks
    stay in step; repeated, then ten good collectives."""
    me = hvd.rank()

    def step(x):
        bad = hvd.allreduce(x[:1 + me % 2], op=hvd.Sum)  # mismatched shapes
        later = [hvd.allgather(x), hvd.broadcast(x, 0), hvd.allreduce(x, op=hvd.Max)]
        return [bad] + later
    for _ in range(3):
        with pytest.raises(tf.errors.FailedPreconditionError, match="allreduce: ranks issued different"):
            run(mode, lambda x: [tf.reduce_sum(t) for t in step(x)], np.ones(4, np.float32))
    ten_good_ones(mode)
