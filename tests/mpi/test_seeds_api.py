"""Small programs written from the five API documents (TF 2.1-2.4 / 1.15 spellings), run in NumPy
mode (``rc.framework = "numpy"``: NumPy strategies, NumPy values) and in TF mode (a genuine
``tf.distribute.Strategy``, eagerly and inside ``tf.function``). Every result is checked against a
reference each rank computes from every rank's inputs; errors are checked on every rank.

TensorFlow-only semantics (variables, gradients, error types) are in test_seeds_tf.py.
"""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest

import mpidist
from late_rank import arrive_late, expiring
from reference import assert_same
from spying import effective

try:
    import tensorflow as tf
except ImportError:  # NumPy mode still runs
    tf = None

pytestmark = pytest.mark.mpi
MODES = ["numpy", "tf-eager", "tf-function"]


def framework(mode: str) -> str:
    return "numpy" if mode == "numpy" else "tensorflow"


def build(mode: str, cls=None, *args, **kwargs):
    """A strategy of ``mode`` (a TF-mode one needs TensorFlow)."""
    if mode != "numpy" and tf is None:
        pytest.skip("TensorFlow is not installed")
    with mpidist.rc.override(framework=framework(mode)):
        return (cls or mpidist.MultiWorkerMirroredStrategy)(*args, **kwargs)


def call(mode: str, fn, *args):
    """``fn(*args)``: in NumPy mode on NumPy values, in TF mode on tensors (inside a tf.function
    for tf-function). Results come back as NumPy arrays."""
    if mode == "numpy":
        with mpidist.rc.override(framework="numpy"):
            out = fn(*args)
    else:
        tensors = [tf.constant(a) for a in args]
        out = (tf.function(fn) if mode == "tf-function" else fn)(*tensors)
    return [np.asarray(o) for o in out] if isinstance(out, (list, tuple)) else np.asarray(out)


@pytest.fixture(scope="module", params=MODES)
def mode(request):
    return request.param


@pytest.fixture(scope="module")
def strategy(mode):
    return build(mode)


@pytest.fixture
def engine_calls(monkeypatch):
    """Every Engine.allreduce / allgather call's effective keyword arguments (spying.py), in order."""
    calls = []
    for name in ("allreduce", "allgather"):
        original = getattr(mpidist.Engine, name)

        def spy(self, *args, _original=original, _name=name, **kwargs):
            calls.append((_name, effective(kwargs)))
            return _original(self, *args, **kwargs)
        monkeypatch.setattr(mpidist.Engine, name, spy)
    return calls


def grads_of(rank: int) -> list[np.ndarray]:
    rng = np.random.default_rng([7, rank])
    return [rng.integers(-5, 6, size=s).astype(np.float32) for s in [(3, 4), (4,), (2,)]]


# -- CollectiveHints (000/001) ----------------------------------------------------------------------

def test_collective_hints_bytes_per_pack_all_reduce(strategy, mode, comm, engine_calls):
    """hints = CollectiveHints(bytes_per_pack=50 MiB);
    grads = get_replica_context().all_reduce('sum', grads, experimental_hints=hints)"""
    size, rank = comm.Get_size(), comm.Get_rank()
    hints = mpidist.experimental.CollectiveHints(bytes_per_pack=50 * 1024 * 1024)

    def step(*grads):
        return strategy.experimental_run_v2(lambda *g: mpidist.get_replica_context().all_reduce(
            "sum", list(g), experimental_hints=hints), args=grads)

    got = call(mode, step, *grads_of(rank))
    expected = [sum(parts) for parts in zip(*[grads_of(r) for r in range(size)])]
    for g, e in zip(got, expected):
        assert_same(g, e)
    packs = [kw.get("bytes_per_pack") for name, kw in engine_calls if name == "allreduce"]
    assert packs == [50 * 1024 * 1024]  # one engine call for the whole list, with the hint's pack size


def test_collective_hints_timeout_reaches_reduce(strategy, mode, comm, engine_calls):
    """strategy.reduce("sum", v, axis=None, experimental_hints=CollectiveHints(timeout_seconds=120))"""
    size, rank = comm.Get_size(), comm.Get_rank()
    hints = mpidist.experimental.CollectiveHints(timeout_seconds=120)

    def step(x):
        v = strategy.experimental_run_v2(lambda a: a * 2, args=(x,))
        return strategy.reduce("sum", v, axis=None, experimental_hints=hints)

    got = call(mode, step, np.full(3, rank + 1.0, np.float32))
    assert_same(got, np.full(3, size * (size + 1), np.float32))
    assert [kw.get("timeout_seconds") for _, kw in engine_calls] == [120]


def test_options_override_hints(strategy, mode, comm, engine_calls):
    """``options=`` (CommunicationOptions, the newer spelling) over ``experimental_hints=``."""
    hints = mpidist.experimental.CollectiveHints(bytes_per_pack=4096, timeout_seconds=100)
    options = mpidist.experimental.CommunicationOptions(bytes_per_pack=1024)

    def step(x):
        return strategy.run(lambda a: mpidist.get_replica_context().all_reduce(
            "mean", a, options=options, experimental_hints=hints), args=(x,))

    got = call(mode, step, np.ones(2, np.float32))
    assert_same(got, np.ones(2, np.float32))
    assert [(kw.get("bytes_per_pack"), kw.get("timeout_seconds")) for _, kw in engine_calls] == [(1024, 100)]


@pytest.mark.skipif(tf is None, reason="TensorFlow is not installed")
def test_tensorflow_collective_hints_object(comm, engine_calls):
    """TensorFlow's own tf.distribute.experimental.CollectiveHints object is accepted too."""
    strategy = build("tf-eager")
    hints = tf.distribute.experimental.CollectiveHints(bytes_per_pack=2048, timeout_seconds=90)
    got = strategy.run(lambda: tf.distribute.get_replica_context().all_reduce(
        "sum", tf.ones([2]), experimental_hints=hints))
    assert_same(np.asarray(got), np.full(2, comm.Get_size(), np.float32))
    assert [(kw.get("bytes_per_pack"), kw.get("timeout_seconds")) for _, kw in engine_calls] == [(2048, 90)]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("how", MODES)
def test_collective_hints_timeout_fires(comm, how):
    """try: strategy.reduce("sum", v, axis=None, experimental_hints=hints)
    except tf.errors.DeadlineExceededError: do_something()

    The late rank arrives when every other rank has seen its deadline pass (a message says so),
    however long tracing the tf.function takes there."""
    strategy = build(how)  # its own engine: the deadline breaks it
    late = comm.Get_size() - 1
    hints = mpidist.experimental.CollectiveHints(timeout_seconds=30 if comm.Get_rank() == late else 0.5)
    caught = (mpidist.errors.DeadlineExceededError,) + ((tf.errors.DeadlineExceededError,) if tf else ())

    def step(x):
        return strategy.reduce("sum", x, axis=None, experimental_hints=hints)

    with mpidist.rc.override(check_agreement=False, algorithm="flat"):
        if comm.Get_rank() == late:
            arrive_late(comm, late)
            # completes: the others' abandoned requests are still posted
            assert_same(call(how, step, np.ones(4, np.float32)), np.full(4, comm.Get_size(), np.float32))
        else:
            with expiring(comm, late):
                try:
                    call(how, step, np.ones(4, np.float32))
                    outcome = "no error"
                except caught as error:
                    outcome = "deadline"
                    if how != "numpy":  # the real TensorFlow type, eagerly and from a tf.function
                        assert isinstance(error, tf.errors.DeadlineExceededError)
                        assert error.error_code == tf.errors.DEADLINE_EXCEEDED
                assert outcome == "deadline"
    comm.Barrier()


# -- MultiWorkerMirroredStrategy (004) ----------------------------------------------------------------

@pytest.mark.parametrize("communication", ["AUTO", "RING"])
def test_experimental_mwms_communication(mode, comm, communication):
    """tf.distribute.experimental.MultiWorkerMirroredStrategy(communication=CollectiveCommunication.X)"""
    enum = mpidist.experimental.CollectiveCommunication
    strategy = build(mode, mpidist.experimental.MultiWorkerMirroredStrategy, communication=getattr(enum, communication))
    assert strategy.num_replicas_in_sync == comm.Get_size()
    assert_same(call(mode, lambda x: strategy.reduce("sum", x, axis=None), np.ones(2, np.float32)),
                np.full(2, comm.Get_size(), np.float32))
    if tf is not None and mode != "numpy":  # TensorFlow's own enum member too
        build(mode, mpidist.experimental.MultiWorkerMirroredStrategy,
              communication=getattr(tf.distribute.experimental.CollectiveCommunication, communication))


def test_experimental_mwms_nccl_without_gpu(mode):
    """communication=NCCL where NCCL cannot run: the same clear error on every rank, both modes."""
    if mpidist.collectives.gpu.nccl_reason() is None:
        pytest.skip("NCCL is available here")
    with pytest.raises(mpidist.errors.GpuUnavailableError, match="NCCL is not available"):
        build(mode, mpidist.experimental.MultiWorkerMirroredStrategy,
              communication=mpidist.experimental.CollectiveCommunication.NCCL)


def test_attributes_and_local_results(strategy, mode, comm):
    """extended, num_replicas_in_sync, experimental_local_results, scope, cluster_resolver."""
    assert strategy.num_replicas_in_sync == comm.Get_size()
    assert strategy.extended is not None
    with strategy.scope():
        assert mpidist.get_strategy() is strategy and mpidist.has_strategy()
        assert mpidist.in_cross_replica_context()
    result = strategy.experimental_run_v2(lambda: mpidist.get_replica_context().replica_id_in_sync_group)
    local = strategy.experimental_local_results(result)
    assert isinstance(local, tuple) and len(local) == 1 and int(np.asarray(local[0])) == comm.Get_rank()
    resolver = strategy.cluster_resolver
    assert isinstance(resolver, mpidist.cluster_resolver.MPIClusterResolver)
    assert resolver.task_type == "worker" and resolver.task_id == comm.Get_rank()


def test_cluster_resolver_given_is_returned(mode, comm):
    resolver = mpidist.cluster_resolver.MPIClusterResolver()
    assert build(mode, mpidist.MultiWorkerMirroredStrategy, cluster_resolver=resolver).cluster_resolver is resolver
    assert build(mode, mpidist.experimental.MultiWorkerMirroredStrategy,
                 cluster_resolver=resolver).cluster_resolver is resolver
    # TensorFlow's MirroredStrategy and OneDeviceStrategy have none
    assert build(mode, mpidist.MirroredStrategy).cluster_resolver is None
    assert build(mode, mpidist.OneDeviceStrategy, "/cpu:0").cluster_resolver is None


def test_reduce_along_batch_axis(strategy, mode, comm):
    """Global batch 8 over the replicas: reduce(SUM, axis=None) adds per replica; axis=0 gives the
    scalar 0+1+...+7; MEAN with axis=0 divides by the global count (an uneven last batch too)."""
    size, rank = comm.Get_size(), comm.Get_rank()
    batch = np.array_split(np.arange(8, dtype=np.float32), size)[rank]

    def step(x):
        v = strategy.experimental_run_v2(lambda a: a, args=(x,))
        return [strategy.reduce("SUM", v, axis=0), strategy.reduce(mpidist.ReduceOp.MEAN, v, axis=0)]

    total, mean = call(mode, step, batch)
    assert_same(total, np.float32(28))
    assert_same(mean, np.float32(3.5))


def test_make_numpy_dataset_distribute_and_run(strategy, mode, comm):
    """numpy_input = np.ones([10]); dataset = strategy.experimental_make_numpy_dataset(numpy_input);
    dist_dataset = strategy.experimental_distribute_dataset(dataset); for x in dist_dataset:
    strategy.experimental_run_v2(train_step, args=(x,))"""
    size = comm.Get_size()
    numpy_input = np.arange(10, dtype=np.float32)
    with mpidist.rc.override(framework=framework(mode)):
        dataset = strategy.experimental_make_numpy_dataset(numpy_input).batch(2 * size)
        dist_dataset = strategy.experimental_distribute_dataset(dataset)
        totals = []
        for x in dist_dataset:
            per_replica = strategy.experimental_run_v2(lambda b: b * 2, args=(x,))
            totals.append(float(np.asarray(strategy.reduce("SUM", per_replica, axis=0))))
    expected = [float(2 * b.sum()) for b in np.array_split(numpy_input, range(2 * size, 10, 2 * size))]
    assert totals == expected


def test_distribute_datasets_from_function(strategy, mode, comm):
    """def dataset_fn(input_context): batch_size = input_context.get_per_replica_batch_size(global_batch_size)
    ...; inputs = strategy.experimental_distribute_datasets_from_function(dataset_fn)"""
    size, rank = comm.Get_size(), comm.Get_rank()
    global_batch_size = 2 * size
    seen = []

    def dataset_fn(input_context):
        batch_size = input_context.get_per_replica_batch_size(global_batch_size)
        seen.append((input_context.num_input_pipelines, input_context.input_pipeline_id, batch_size))
        if mode == "numpy":
            examples = np.arange(4 * size, dtype=np.float32)[input_context.input_pipeline_id::size]
            return [examples[i:i + batch_size] for i in range(0, len(examples), batch_size)]
        d = tf.data.Dataset.range(4 * size).map(lambda x: tf.cast(x, tf.float32))
        return d.shard(input_context.num_input_pipelines, input_context.input_pipeline_id).batch(batch_size)

    with mpidist.rc.override(framework=framework(mode)):
        inputs = strategy.experimental_distribute_datasets_from_function(dataset_fn)
        sums = []
        for batch in inputs:
            replica_results = strategy.experimental_run_v2(lambda b: b + 0, args=(batch,))
            sums.append(float(np.asarray(strategy.reduce("SUM", replica_results, axis=0))))
    assert seen == [(size, rank, 2)]
    everything = np.arange(4 * size, dtype=np.float32)
    shards = [everything[r::size] for r in range(size)]
    assert sums == [float(sum(s[i:i + 2].sum() for s in shards)) for i in (0, 2)]


# -- tf.compat.v1.distribute (003) and NcclAllReduce (002) ----------------------------------------------

def test_module_functions_and_contexts(strategy, mode, comm):
    """get_strategy, has_strategy, get_replica_context, in_cross_replica_context,
    experimental_set_strategy, get_loss_reduction; ReplicaContext.merge_call."""
    with mpidist.rc.override(framework=framework(mode)):
        assert not mpidist.has_strategy()
        mpidist.experimental_set_strategy(strategy)
        try:
            assert mpidist.get_strategy() is strategy and mpidist.in_cross_replica_context()
        finally:
            mpidist.experimental_set_strategy(None)
        assert not mpidist.has_strategy()

        def replica_fn():
            ctx = mpidist.get_replica_context()
            assert not mpidist.in_cross_replica_context()
            merged = ctx.merge_call(lambda s, x: s.extended.reduce_to("SUM", x, None), args=(np.float32(2),))
            return ctx.replica_id_in_sync_group, ctx.num_replicas_in_sync, merged

        rid, n, merged = strategy.run(replica_fn)
    assert int(np.asarray(rid)) == comm.Get_rank() and n == comm.Get_size()
    assert_same(np.asarray(merged), np.float32(2 * comm.Get_size()))
    assert mpidist.get_loss_reduction() == mpidist.ReduceOp.MEAN


@pytest.mark.node_layout  # replicas: this node's ranks
def test_mirrored_strategy_with_nccl_all_reduce_extended(mode, comm):
    """strategy = MirroredStrategy(cross_device_ops=NcclAllReduce()); reduce_to / batch_reduce_to /
    broadcast_to through extended (the replicas: this node's ranks)."""
    strategy = build(mode, mpidist.MirroredStrategy, cross_device_ops=mpidist.NcclAllReduce(num_packs=1))
    node = mpidist.Topology(comm)
    peers = node.node_ranks[node.node_index]
    rank = comm.Get_rank()
    with mpidist.rc.override(framework=framework(mode)):
        ext = strategy.extended
        device = ext.worker_devices[0]  # a device string as destination
        one = ext.reduce_to("SUM", np.float32(rank), device)
        both = ext.batch_reduce_to("MAX", [(np.float32(rank), device), (np.ones(2, np.float32), device)])
        first = ext.broadcast_to(np.float32(rank), device)
    assert_same(np.asarray(one), np.float32(sum(peers)))
    assert_same(np.asarray(both[0]), np.float32(max(peers)))
    assert_same(np.asarray(both[1]), np.ones(2, np.float32))
    assert_same(np.asarray(first), np.float32(peers[0]))
    node.free()


def test_nccl_all_reduce_negative_num_packs():
    with pytest.raises(ValueError, match="num_packs"):
        mpidist.NcclAllReduce(num_packs=-1)


def test_input_names():
    """InputContext, InputReplicationMode, ReduceOp, CrossDeviceOps family: the names exist with the
    documents' constructor arguments."""
    ctx = mpidist.InputContext(num_input_pipelines=2, input_pipeline_id=1, num_replicas_in_sync=4)
    assert (ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.get_per_replica_batch_size(8)) == (2, 1, 2)
    assert mpidist.InputReplicationMode.PER_WORKER is not None
    assert {"SUM", "MEAN"} <= set(mpidist.ReduceOp.__members__)
    for ops in (mpidist.HierarchicalCopyAllReduce(num_packs=1), mpidist.ReductionToOneDevice(),
                mpidist.NcclAllReduce(num_packs=0)):
        assert isinstance(ops, mpidist.CrossDeviceOps)
