"""tf.distribute semantics that programs written for TensorFlow's MultiWorkerMirroredStrategy
observe, with mpidist's TF strategies: variables (MirroredVariable of one component, aggregation
of replica-context updates, initial values, checkpoints), gradients through collectives with both
ways of differentiating, device names and error types. Checked against references computed from
every rank's inputs; errors on every rank.
"""
from __future__ import annotations

import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import mpidist  # noqa: E402

pytestmark = pytest.mark.mpi
MODES = ["eager", "function"]


@pytest.fixture(scope="module")
def strategy():
    with mpidist.rc.override(framework="tensorflow"):
        return mpidist.MultiWorkerMirroredStrategy()


def run_in(mode, fn):
    return tf.function(fn)() if mode == "function" else fn()


# -- item: variables ------------------------------------------------------------------------------

def test_variables_are_one_component_mirrored_variables(strategy, comm):
    with strategy.scope():
        v = tf.Variable([1.0, 2.0])
        s = tf.Variable(0.0, aggregation=tf.VariableAggregation.SUM)
    assert isinstance(v, tf.distribute.DistributedValues)
    assert len(v.values) == 1 and len(strategy.experimental_local_results(v)) == 1
    assert v.synchronization == tf.VariableSynchronization.ON_WRITE
    assert v.aggregation == tf.VariableAggregation.NONE and s.aggregation == tf.VariableAggregation.SUM
    assert strategy.extended.worker_devices == (v.values[0].device,)
    assert strategy.extended.worker_devices[0].startswith("/job:localhost/replica:0/task:0/device:")


def test_worker_devices_are_canonical(strategy):
    with strategy.scope():
        v = tf.Variable(1.0)
    assert strategy.extended.worker_devices == (v.device,) == strategy.extended.parameter_devices
    assert tf.distribute.get_replica_context() is not None  # default context: devices as TF names them


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("aggregation", ["SUM", "MEAN", "ONLY_FIRST_REPLICA"])
def test_replica_context_updates_are_aggregated(strategy, comm, mode, aggregation):
    """a.assign_add(replica_id + 1) / assign_sub / assign in strategy.run, as TF's MWMS: SUM applies
    the sum of the replicas' values, MEAN their mean, ONLY_FIRST_REPLICA replica 0's."""
    size = comm.Get_size()
    with strategy.scope():
        a = tf.Variable(10.0, aggregation=getattr(tf.VariableAggregation, aggregation))
    combine = {"SUM": sum, "MEAN": lambda xs: sum(xs) / len(xs), "ONLY_FIRST_REPLICA": lambda xs: xs[0]}[aggregation]

    def replica_value(offset):
        return tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group + offset, tf.float32)

    expected = 10.0
    for method, offset in [("assign_add", 1), ("assign_sub", 3), ("assign", 5)]:
        run_in(mode, lambda: strategy.run(lambda: getattr(a, method)(replica_value(offset))))
        delta = combine([float(r + offset) for r in range(size)])
        expected = {"assign_add": expected + delta, "assign_sub": expected - delta, "assign": delta}[method]
        everyone = comm.allgather(float(a.numpy()))
        assert everyone == [pytest.approx(expected)] * size, method


def test_cross_replica_assign_and_update(strategy, comm):
    with strategy.scope():
        v = tf.Variable(1.0)
    v.assign(4.0)  # cross-replica: every rank's copy
    strategy.extended.update(v, lambda var, x: var.assign_add(x), args=(tf.constant(2.0),))
    assert comm.allgather(float(v.numpy())) == [6.0] * comm.Get_size()


def test_integer_and_bool_variables_start_equal(strategy, comm):
    rank = comm.Get_rank()
    with strategy.scope():
        i = tf.Variable(rank + 3)
        counter = tf.Variable(rank, trainable=False, dtype=tf.int64)
        flag = tf.Variable(rank % 2 == 1)
    assert (int(i.numpy()), int(counter.numpy()), bool(flag.numpy())) == (3, 0, False)


def test_checkpoint_of_mirrored_variable_restores_into_plain_variable(strategy, comm):
    """A checkpoint written under the strategy is an ordinary checkpoint (as TF's)."""
    rank = comm.Get_rank()
    with strategy.scope():
        v = tf.Variable([1.0, 2.0, 3.0])
    v.assign([4.0, 5.0, 6.0])
    with tempfile.TemporaryDirectory() as directory:
        path = tf.train.Checkpoint(v=v).write(os.path.join(directory, f"rank{rank}"))
        plain = tf.Variable([0.0, 0.0, 0.0])
        tf.train.Checkpoint(v=plain).read(path).assert_consumed()
        np.testing.assert_array_equal(plain.numpy(), [4.0, 5.0, 6.0])
        with strategy.scope():
            again = tf.Variable([0.0, 0.0, 0.0])
        tf.train.Checkpoint(v=again).read(path).assert_consumed()
        np.testing.assert_array_equal(again.numpy(), [4.0, 5.0, 6.0])


# -- item: gradients through collectives ------------------------------------------------------------

@pytest.mark.parametrize("how", ["tape", "tf.gradients"])
@pytest.mark.parametrize("collective", ["all_reduce_sum", "all_reduce_mean", "all_gather"])
def test_gradients_through_collectives(strategy, comm, how, collective):
    """d/dx sum(collective(x * x)): all-sum and all-gather give 2x * N (the all-sum of the ones
    upstream, this rank's slice for all_gather), all-mean 2x."""
    size, rank = comm.Get_size(), comm.Get_rank()
    x0 = np.arange(3, dtype=np.float32) + rank

    def apply(y):
        ctx = tf.distribute.get_replica_context()
        if collective == "all_gather":
            return ctx.all_gather(y, axis=0)
        return ctx.all_reduce("sum" if collective == "all_reduce_sum" else "mean", y)

    @tf.function
    def grad(x):
        if how == "tape":
            with tf.GradientTape() as tape:
                tape.watch(x)
                loss = tf.reduce_sum(strategy.run(lambda v: apply(v * v), args=(x,)))
            return tape.gradient(loss, x)
        loss = tf.reduce_sum(strategy.run(lambda v: apply(v * v), args=(x,)))
        return tf.gradients(loss, x)[0]

    got = grad(tf.constant(x0))
    assert got is not None
    factor = 1.0 if collective == "all_reduce_mean" else float(size)
    np.testing.assert_allclose(got.numpy(), 2 * x0 * factor)


# -- item: error types ------------------------------------------------------------------------------

@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("what", ["gather", "all_gather", "all_reduce"])
def test_mismatch_is_invalid_argument(strategy, comm, mode, what):
    """Shapes or ranks that differ across ranks: CollectiveMismatchError, also a
    tf.errors.InvalidArgumentError (eagerly and from a tf.function), on every rank."""
    rank = comm.Get_rank()
    shape = [2, 3] if rank == 0 else [2, 3, 1] if what != "all_reduce" else [4]

    def step():
        x = tf.ones(shape)
        if what == "gather":
            return strategy.gather(strategy.run(lambda: x), axis=0)
        ctx = lambda: tf.distribute.get_replica_context()  # noqa: E731
        if what == "all_gather":
            return strategy.run(lambda: ctx().all_gather(x, axis=0))
        return strategy.run(lambda: ctx().all_reduce("sum", x))

    with pytest.raises(tf.errors.InvalidArgumentError) as info:
        run_in(mode, step)
    if mode == "eager":
        assert isinstance(info.value, mpidist.errors.CollectiveMismatchError)
    assert "ranks issued different collectives" in str(info.value)


def test_indexed_slices_messages(strategy):
    slices = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([0]), tf.constant([3, 2]))
    with pytest.raises(NotImplementedError, match="gather does not support IndexedSlices"):
        strategy.gather(slices, axis=0)
    with pytest.raises(NotImplementedError, match="all_gather does not support IndexedSlices"):
        strategy.run(lambda: tf.distribute.get_replica_context().all_gather(slices, axis=0))


def test_error_types_are_plain_without_tensorflow_flavour_when_caught_by_mpidist_name(strategy):
    error = mpidist.errors.CollectiveMismatchError("allgather: shapes differ")
    assert isinstance(error, tf.errors.InvalidArgumentError) and isinstance(error, ValueError)
    assert str(error) == error.message == "allgather: shapes differ"
    late = mpidist.errors.DeadlineExceededError("allreduce: late")
    assert isinstance(late, tf.errors.DeadlineExceededError) and late.error_code == tf.errors.DEADLINE_EXCEEDED
