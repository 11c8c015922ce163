"""mpidist's tf.distribute.Strategy (mpidist.on_tensorflow.X.on_engine) on one replica per rank.

Every check compares with NumPy over all ranks' inputs, which each rank computes itself from
(seed, rank). Runs at any -n; reads rank and size at run time.
"""
from __future__ import annotations

import os
import re

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from late_rank import arrive_late, expiring  # noqa: E402
from spying import SpyEngine  # noqa: E402

import mpidist  # noqa: E402
import mpidist.on_tensorflow  # noqa: E402
import mpidist.tensorflow  # noqa: E402
from mpidist.cross_device.options import CommunicationOptions  # noqa: E402
from mpidist.cross_device.reduce_op import ReduceOp  # noqa: E402
from mpidist.tensorflow import XlaCollectiveError, _tf_private  # noqa: E402

pytestmark = [pytest.mark.mpi, pytest.mark.two_nodes]
MODES = ["eager", "function"]


def rows(rank: int, size: int) -> int:
    """Uneven per-rank batch sizes; rank 1 has none when there are several ranks."""
    return [3, 0, 2, 5][rank % 4] if size > 1 else 3


def data(rank: int, shape, seed: int = 0) -> np.ndarray:
    return np.random.default_rng([seed, rank]).integers(-4, 5, size=shape).astype(np.float64)


def function(fn):
    return tf.function(fn, autograph=False)  # the library's behaviour, without AutoGraph's conversion cost


def call(mode: str, fn, *args):
    return function(fn)(*args) if mode == "function" else fn(*args)


def test_genuine_strategy(strategy, eng):
    rank, size = eng.rank, eng.size
    assert isinstance(strategy, tf.distribute.Strategy)
    assert not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
    assert strategy.num_replicas_in_sync == size
    assert tf.distribute.get_strategy() is not strategy
    with strategy.scope():
        assert tf.distribute.get_strategy() is strategy and tf.distribute.has_strategy()
        assert tf.distribute.in_cross_replica_context()

    def replica_fn():
        ctx = tf.distribute.get_replica_context()
        assert ctx.strategy is strategy and ctx.num_replicas_in_sync == size
        assert tf.distribute.get_strategy() is strategy
        return ctx.replica_id_in_sync_group

    for mode in MODES:
        result = call(mode, lambda: strategy.run(replica_fn))
        assert int(result) == rank
        local = strategy.experimental_local_results(result)
        assert isinstance(local, tuple) and len(local) == 1
    assert strategy.extended.should_checkpoint == (rank == 0)
    assert strategy.extended.should_save_summary == (rank == 0)
    assert len(strategy.extended.worker_devices) == 1


def test_variables_start_equal(strategy, eng, comm):
    keras = pytest.importorskip("keras")
    with strategy.scope():
        v = tf.Variable(tf.random.normal([5]) + eng.rank)
        layer = keras.layers.Dense(4)
        layer.build((None, 3))
        step = tf.Variable(eng.rank, trainable=False)  # integer: rank 0's value too, as TF's MWMS
    assert strategy.extended.variable_created_in_scope(v)
    for array in [v.numpy(), layer.kernel.numpy()]:
        everyone = comm.allgather(array)
        assert all(np.array_equal(a, everyone[0]) for a in everyone)
    assert int(step.numpy()) == 0


OPS = [("sum", "sum"), ("MEAN", "mean"), (tf.distribute.ReduceOp.SUM, "sum"), (tf.distribute.ReduceOp.MEAN, "mean"),
       (ReduceOp.MAX, "max"), ("min", "min"), ("Prod", "prod")]
NP = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min, "prod": np.prod}


def nest_for(rank: int):
    return {"v": data(rank, (3,)).astype(np.float32),
            "pair": (data(rank, ()).astype(np.float32), data(rank, (2, 2), seed=1))}


@pytest.mark.parametrize("mode", MODES)
def test_reduce_nest_every_op_spelling(strategy, eng, mode):
    shapes = []

    def fn(value):
        out = [strategy.reduce(op, value, axis=None) for op, _ in OPS]
        shapes.extend(tuple(t.shape) for t in tf.nest.flatten(out))
        return out

    mine = tf.nest.map_structure(tf.constant, nest_for(eng.rank))
    results = call(mode, fn, mine)
    assert shapes == [tuple(t.shape) for t in tf.nest.flatten(mine)] * len(OPS)  # static, also in tf.function
    everyone = [tf.nest.flatten(nest_for(r)) for r in range(eng.size)]
    for (op, name), result in zip(OPS, results):
        assert tf.nest.map_structure(lambda _: 0, result) == tf.nest.map_structure(lambda _: 0, nest_for(0))
        for got, *inputs in zip(tf.nest.flatten(result), *everyone):
            expected = NP[name](np.stack(inputs), axis=0)
            assert got.dtype == tf.as_dtype(inputs[0].dtype)
            np.testing.assert_allclose(got.numpy(), expected, rtol=1e-6, err_msg=f"op {op!r}")


AXES = [0, (0, 1), [0, 2]]
AXIS_OPS = ["sum", "mean", "min", "max"]


@pytest.mark.parametrize("mode", MODES)
def test_reduce_along_axis_with_uneven_batches(strategy, eng, mode):
    mine = tf.constant(data(eng.rank, (rows(eng.rank, eng.size), 2, 3)))
    results = call(mode, lambda x: [strategy.reduce(op, x, axis=axis) for op in AXIS_OPS for axis in AXES], mine)
    everything = np.concatenate([data(r, (rows(r, eng.size), 2, 3)) for r in range(eng.size)])
    combos = [(op, axis) for op in AXIS_OPS for axis in AXES]
    for (op, axis), result in zip(combos, results):
        expected = NP[op](everything, axis=tuple(axis) if isinstance(axis, (list, tuple)) else axis)
        np.testing.assert_allclose(result.numpy(), expected, rtol=1e-12, err_msg=f"{op} along {axis}")


def test_reduce_the_calls_keras_makes(strategy, eng):
    scalars = [float(r + 1) for r in range(eng.size)]
    mean = strategy.reduce("MEAN", tf.constant(scalars[eng.rank]), axis=0)  # Keras's multi-worker path
    assert mean.shape == () and mean.numpy() == pytest.approx(np.mean(scalars))
    pair = strategy.reduce("MEAN", (tf.constant(scalars[eng.rank]), tf.ones([2]) * eng.rank), axis=None)
    assert isinstance(pair, tuple)
    assert pair[0].numpy() == pytest.approx(np.mean(scalars))
    np.testing.assert_allclose(pair[1].numpy(), [np.mean(range(eng.size))] * 2)


@pytest.mark.parametrize("mode", MODES)
def test_gather_uneven(strategy, eng, mode):
    def fn(x, y):
        out = strategy.gather({"x": x, "twice": x * 2}, axis=0), strategy.gather(y, axis=1)
        assert out[1].shape.as_list()[0] == 2 and out[1].shape.as_list()[2] == 3
        return out

    n = rows(eng.rank, eng.size)
    (both, along1) = call(mode, fn, tf.constant(data(eng.rank, (n, 4))), tf.constant(data(eng.rank, (2, n, 3), 1)))
    everything = np.concatenate([data(r, (rows(r, eng.size), 4)) for r in range(eng.size)])
    np.testing.assert_array_equal(both["x"].numpy(), everything)
    np.testing.assert_array_equal(both["twice"].numpy(), 2 * everything)
    np.testing.assert_array_equal(along1.numpy(), np.concatenate(
        [data(r, (2, rows(r, eng.size), 3), 1) for r in range(eng.size)], axis=1))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", ["dimension", "rank"])
def test_gather_shape_mismatch_says_what_tensorflow_says(strategy, eng, mode, case):
    """Shapes that differ beyond `axis`: an error on every rank with mpidist's rank-by-rank report
    and TensorFlow's phrase (what TensorFlow's own strategy tests look for)."""
    if eng.size == 1:
        pytest.skip("needs ranks whose shapes differ")
    if case == "dimension":  # [1, 1], [1, 2], ...: dimension 1 differs, gathered along 0
        value, pattern = tf.ones((1, eng.rank + 1)), r"Dimension 1 in both shapes must be equal, but are 1 and 2"
    else:  # [1], [1, 2], ...: ranks differ
        value, pattern = tf.ones(list(range(1, eng.rank + 2))), r"Shape must be rank \d but is rank \d"

    def gather_fn(x):
        return strategy.gather(x, axis=0)

    def all_gather_fn(x):
        return strategy.run(lambda v: tf.distribute.get_replica_context().all_gather(v, axis=0), args=(x,))

    for fn in (gather_fn, all_gather_fn):
        with pytest.raises((tf.errors.InvalidArgumentError, ValueError)) as info:
            call(mode, fn, value)
        text = str(info.value)
        assert "Shape mismatch" in text and re.search(pattern, text), text
        assert "rank 0: allgather(leaves=" in text, text  # mpidist's report, rank by rank


def test_all_reduce_is_one_engine_call_with_merged_options(eng):
    spy = SpyEngine(eng)
    strategy = mpidist.on_tensorflow.MultiWorkerMirroredStrategy.on_engine(spy, CommunicationOptions(timeout_seconds=60))
    leaves = [tf.constant(data(eng.rank, (i % 3 + 1,), seed=i).astype(np.float32)) for i in range(12)]
    cases = [(None, {"timeout_seconds": 60.0}),
             (tf.distribute.experimental.CommunicationOptions(bytes_per_pack=256),
              {"bytes_per_pack": 256, "timeout_seconds": 60.0}),
             (CommunicationOptions(bytes_per_pack=1024, timeout_seconds=5), {"bytes_per_pack": 1024,
                                                                              "timeout_seconds": 5.0})]
    for options, expected in cases:
        @function
        def step(values):
            return strategy.run(lambda v: tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.SUM, {"a": v[:6], "b": tuple(v[6:])}, options=options), args=(values,))

        spy.calls.clear()
        result = step(leaves)
        assert spy.calls == [("allreduce", expected)]
        got = tf.nest.flatten(result)
        for i, g in enumerate(got):
            np.testing.assert_array_equal(g.numpy(), sum(data(r, (i % 3 + 1,), seed=i) for r in range(eng.size)))


def test_cross_replica_collectives_and_update(strategy, eng):
    size, rank = eng.size, eng.rank
    with strategy.scope():
        var = tf.Variable([1.0, 2.0])

    def merge_fn(s, value):
        summed = s.extended.reduce_to(ReduceOp.SUM, value, destinations=value)
        batch = s.extended.batch_reduce_to("MEAN", [(value, value), (value * 2, value)])
        s.extended.update(var, lambda v, d: v.assign_add(tf.tile(d, [2])), args=(summed,))
        return summed, batch

    @function
    def step(x):
        return strategy.run(lambda v: tf.distribute.get_replica_context().merge_call(merge_fn, args=(v,)), args=(x,))

    summed, batch = step(tf.constant([float(rank + 1)]))
    total = sum(range(1, size + 1))
    assert summed.numpy().tolist() == [total]
    assert batch[0].numpy().tolist() == [total / size] and batch[1].numpy().tolist() == [2 * total / size]
    np.testing.assert_array_equal(var.numpy(), [1 + total, 2 + total])
    assert strategy.extended.broadcast_to(tf.constant(rank), destinations="/cpu:0").numpy() == 0
    values = strategy.experimental_distribute_values_from_function(lambda ctx: ctx.replica_id_in_sync_group * 10)
    assert values == 10 * rank


def test_gradients_through_collectives(strategy, eng):
    size, rank = eng.size, eng.rank

    def fn(x):
        ctx = tf.distribute.get_replica_context()
        with tf.GradientTape(persistent=True) as tape:
            tape.watch(x)
            total = tf.reduce_sum(ctx.all_reduce("sum", x * x))
            gathered = tf.reduce_sum(ctx.all_gather(x, axis=0) * 3.0)
        return tape.gradient(total, x), tape.gradient(gathered, x)

    x = tf.constant([float(rank + 1), 2.0])
    g_reduce, g_gather = function(lambda v: strategy.run(fn, args=(v,)))(x)
    np.testing.assert_allclose(g_reduce.numpy(), size * 2 * x.numpy())  # all-sum of the upstream ones
    np.testing.assert_allclose(g_gather.numpy(), [3.0 * size] * 2)


def test_sparse_all_reduce_gathers_indexed_slices(strategy, eng):
    def fn():
        ctx = tf.distribute.get_replica_context()
        s = tf.IndexedSlices(tf.ones([1, 2]) * (eng.rank + 1), tf.constant([eng.rank]), tf.constant([8, 2]))
        return ctx.all_reduce("sum", [s, tf.constant(1.0)])

    sparse, dense = function(lambda: strategy.run(fn))()
    assert isinstance(sparse, tf.IndexedSlices)
    expected = np.zeros((8, 2))
    for r in range(eng.size):
        expected[r] += r + 1
    np.testing.assert_array_equal(tf.convert_to_tensor(sparse).numpy(), expected)
    assert dense.numpy() == eng.size


def test_sync_on_read_metric_is_global(strategy, eng):
    keras = pytest.importorskip("keras")
    import importlib
    for module, name in _tf_private.REQUIRED + _tf_private.OPTIONAL:  # the private symbols, all still there
        assert getattr(importlib.import_module(module), name, None) is not None, f"{module}.{name}"
    with pytest.raises(ImportError, match=f"this TensorFlow \\({tf.__version__}\\) has no tensorflow.python.nothing.X"):
        _tf_private._require("tensorflow.python.nothing", "X")  # the guard names the symbol and the version
    with strategy.scope():
        metric = keras.metrics.Mean()
    assert all(_tf_private.is_sync_on_read(v.value) for v in metric.variables)

    @function
    def update(x):
        def fn(v):
            metric.update_state(v)
            return metric.result()  # inside the replica: this rank's own value
        return strategy.run(fn, args=(x,))

    mine = data(eng.rank, (rows(eng.rank, eng.size) + 1,))
    local = update(tf.constant(mine))
    assert local.numpy() == pytest.approx(mine.mean())
    everything = np.concatenate([data(r, (rows(r, eng.size) + 1,)) for r in range(eng.size)])
    assert metric.result().numpy() == pytest.approx(everything.mean())  # cross-replica: global
    metric.reset_state()
    assert metric.result().numpy() == 0


def test_cross_replica_assign_of_sync_on_read_needs_no_collective(eng):
    keras = pytest.importorskip("keras")
    spy = SpyEngine(eng)
    strategy = mpidist.on_tensorflow.MultiWorkerMirroredStrategy.on_engine(spy, CommunicationOptions())
    with strategy.scope():
        metric = keras.metrics.Mean()
        total = tf.Variable(0.0, synchronization=tf.VariableSynchronization.ON_READ,
                            aggregation=tf.VariableAggregation.SUM)
    function(lambda v: strategy.run(metric.update_state, args=(v,)))(tf.constant([1.0 + eng.rank]))
    spy.calls.clear()
    metric.reset_state()  # Keras does this at every epoch start: no collective
    assert float(total.assign(6.0)) == pytest.approx(6.0)
    assert spy.calls == []
    assert float(total._values[0]) == pytest.approx(6.0 / eng.size)  # each rank's share of the global value
    assert float(total.read_value()) == pytest.approx(6.0) and float(metric.result()) == 0.0


def test_sync_on_read_variable_without_aggregation(strategy, eng):
    """ON_READ with aggregation NONE is created, as TensorFlow creates it (Keras's
    test_variable_synchronization): replica-context updates are this rank's, a cross-replica read
    is TensorFlow's ValueError."""
    keras = pytest.importorskip("keras")
    with strategy.scope():
        v = tf.Variable([1.0, 2.0], synchronization=tf.VariableSynchronization.ON_READ,
                        aggregation=tf.VariableAggregation.NONE)
        k = keras.Variable(np.ones((2, 2)), dtype="float32", synchronization="on_read")
    assert v.synchronization == tf.VariableSynchronization.ON_READ and v.aggregation == tf.VariableAggregation.NONE
    assert k.synchronization == "on_read" and k.value.synchronization == tf.VariableSynchronization.ON_READ
    local = strategy.run(lambda: v.assign_add([float(eng.rank), 0.0]))
    np.testing.assert_array_equal(strategy.experimental_local_results(local)[0].numpy(), [1.0 + eng.rank, 2.0])
    with pytest.raises(ValueError, match="NONE"):
        v.read_value()


def test_int_and_float_of_a_mirrored_variable(strategy):
    with strategy.scope():
        counter = tf.Variable(3.0)
    assert int(counter) == 3 and float(counter) == 3.0  # TensorFlow's MirroredVariable raises TypeError


def test_xla_is_a_clear_error(strategy):
    step = tf.function(lambda x: strategy.run(
        lambda v: tf.distribute.get_replica_context().all_reduce("sum", v), args=(x,)), jit_compile=True)
    with pytest.raises(XlaCollectiveError, match="jit_compile=True.*XLA"):
        step(tf.ones([2]))


def test_errors_name_the_function_and_argument(strategy, eng):
    with pytest.raises(TypeError, match="MultiWorkerMirroredStrategy.reduce: `axis` must be an int, a list/tuple of ints, or None, "
                                        "got 'x'"):
        strategy.reduce("sum", tf.ones([2]), axis="x")
    with pytest.raises(ValueError, match="MultiWorkerMirroredStrategy.reduce: `reduce_op` must be one of"):
        strategy.reduce("median", tf.ones([2]), axis=None)
    with pytest.raises(ValueError, match="MultiWorkerMirroredStrategy.reduce: `axis` 3 is out of range for leaf 0"):
        strategy.reduce("sum", tf.ones([2]), axis=3)
    with pytest.raises(RuntimeError, match="MultiWorkerMirroredStrategy.reduce: must be called in cross-replica context"):
        strategy.run(lambda: strategy.reduce("sum", tf.ones([1]), axis=None))
    if eng.size > 1:
        with pytest.raises(ValueError, match="OneDeviceStrategy.on_engine: `engine` must span one rank"):
            mpidist.on_tensorflow.OneDeviceStrategy.on_engine(eng, CommunicationOptions())


@pytest.mark.node_layout  # MirroredStrategy: this node's ranks
def test_other_kinds(eng, comm):
    from mpi4py import MPI
    one = mpidist.on_tensorflow.OneDeviceStrategy.on_engine(mpidist.Engine(MPI.COMM_SELF), CommunicationOptions(), devices="/cpu:0")
    assert one.num_replicas_in_sync == 1 and one.extended.should_checkpoint
    assert one.reduce("sum", tf.constant(eng.rank + 1.0), axis=None).numpy() == eng.rank + 1
    local_engine = mpidist.Engine(eng.topology.local)
    mirrored = mpidist.on_tensorflow.MirroredStrategy.on_engine(local_engine, CommunicationOptions())
    assert mirrored.num_replicas_in_sync == eng.topology.local_size
    assert mirrored.reduce("sum", tf.constant(1.0), axis=None).numpy() == eng.topology.local_size
    central = mpidist.on_tensorflow.CentralStorageStrategy.on_engine(eng, CommunicationOptions())
    with central.scope():
        var = tf.Variable([0.0, 0.0])
    central.extended.update(var, lambda v: v.assign_add([eng.rank + 1.0, 1.0]))
    np.testing.assert_array_equal(var.numpy(), [1.0, 1.0])  # the chief's update, broadcast
    local_engine.close()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("mode", MODES)
def test_timeout_reaches_the_engine(comm, mode):
    """The late rank arrives when every other rank has seen its deadline pass (a message says so),
    however long tracing the tf.function takes there."""
    engine = mpidist.Engine(comm)
    late = engine.size - 1
    strategy = mpidist.on_tensorflow.MultiWorkerMirroredStrategy.on_engine(engine,
                             CommunicationOptions(timeout_seconds=30 if engine.rank == late else 0.5))
    step = (lambda x: strategy.reduce("sum", x, axis=None))
    step = tf.function(step) if mode == "function" else step
    with mpidist.rc.override(check_agreement=False, algorithm="flat"):
        if engine.rank == late:
            arrive_late(comm, late)
            step(tf.ones([4]))  # completes: the others' abandoned requests are still posted
        else:
            # eagerly the error is mpidist's DeadlineExceededError, also a tf.errors.DeadlineExceededError;
            # from a tf.function a genuine tf.errors.DeadlineExceededError (mpidist's message in the log)
            match = "not finished within timeout_seconds=0.5" if mode == "eager" else "deadline_exceeded"
            with expiring(comm, late):
                with pytest.raises(tf.errors.DeadlineExceededError, match=match):
                    step(tf.ones([4]))
                with pytest.raises((mpidist.errors.CommunicatorBrokenError, tf.errors.UnknownError),
                                   match="refuses collectives"):
                    step(tf.ones([4]))
    comm.Barrier()


def test_tensorflow_cluster_resolvers_must_describe_the_communicator(comm, monkeypatch):
    """TF_CONFIG, Slurm and ClusterSpec resolvers are accepted when their cluster is the communicator,
    else a ValueError on every rank says how they differ; the ranks stay in step either way."""
    rank, size = comm.Get_rank(), comm.Get_size()
    resolvers = tf.distribute.cluster_resolver
    workers = [f"host{r}:1" for r in range(size)]

    def simple(jobs, task_type, task_id):
        return resolvers.SimpleClusterResolver(tf.train.ClusterSpec(jobs), task_type=task_type, task_id=task_id)

    right = simple({"worker": workers}, "worker", rank)
    chief_first = simple({"chief": workers[:1], "worker": workers[1:]}, "chief" if rank == 0 else "worker",
                         0 if rank == 0 else rank - 1)
    monkeypatch.delenv("TF_CONFIG", raising=False)
    for accepted in (right, chief_first, resolvers.TFConfigClusterResolver()):  # the last describes no cluster
        strategy = mpidist.MultiWorkerMirroredStrategy(cluster_resolver=accepted)
        assert strategy.num_replicas_in_sync == size and strategy.cluster_resolver is accepted
        strategy.close()
    where = "MultiWorkerMirroredStrategy: `cluster_resolver` (SimpleClusterResolver) disagrees with the MPI " \
            f"communicator of {size} rank(s): "
    with pytest.raises(ValueError, match=re.escape(where + f"it describes {size + 1} chief/worker task(s).")):
        mpidist.MultiWorkerMirroredStrategy(cluster_resolver=simple({"worker": workers + ["extra:1"]}, "worker", rank))
    if size > 1:
        swapped = simple({"worker": workers}, "worker", (rank + 1) % size)
        with pytest.raises(ValueError, match=re.escape(where + "rank 0 is task worker:1 there (replica 1); rank 1 "
                                                               "is task worker:")):
            mpidist.experimental.MultiWorkerMirroredStrategy(cluster_resolver=swapped)

    class Failing:  # a resolver that cannot answer on the last rank only (a Slurm variable missing there)
        task_type, task_id = "worker", rank

        def cluster_spec(self):
            if rank == size - 1:
                raise RuntimeError("no SLURM_JOB_NODELIST")
            return tf.train.ClusterSpec({"worker": workers})

    with pytest.raises(ValueError, match=re.escape(f"`cluster_resolver` (Failing) cannot say its cluster on rank "
                                                   f"{size - 1}: RuntimeError: no SLURM_JOB_NODELIST")):
        mpidist.MultiWorkerMirroredStrategy(cluster_resolver=Failing())
    strategy = mpidist.MultiWorkerMirroredStrategy()  # in step after the errors
    total = strategy.reduce("SUM", tf.constant(float(rank)), axis=None)
    assert float(total) == size * (size - 1) / 2
    strategy.close()
