"""The tf.distribute API on NumPy (framework="numpy"): strategies, contexts, reductions, cross-device
ops and the seeds' examples, checked against values computed from all ranks' inputs."""
from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
from reference import assert_same

import mpidist
from mpidist.errors import CollectiveMismatchError

pytestmark = [pytest.mark.mpi, pytest.mark.node_layout, pytest.mark.two_nodes]


@pytest.fixture(autouse=True)
def numpy_framework():
    with mpidist.rc.override(framework="numpy"):
        yield


@pytest.fixture(scope="module")
def strategy():
    with mpidist.rc.override(framework="numpy"):
        return mpidist.MultiWorkerMirroredStrategy()


def batch(rank: int, rows: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng([seed, rank]).integers(-5, 6, size=(rows, 3)).astype(np.float64)


def test_run_gives_each_rank_its_replica_context(strategy, comm):
    assert strategy.num_replicas_in_sync == comm.Get_size()

    def step(x):
        ctx = mpidist.get_replica_context()
        assert mpidist.get_strategy() is strategy and not mpidist.in_cross_replica_context()
        return ctx.replica_id_in_sync_group, ctx.num_replicas_in_sync, x * 2

    rid, n, y = strategy.run(step, args=(mpidist.values.PerReplica(np.float64(comm.Get_rank())),))
    assert (rid, n, y) == (comm.Get_rank(), comm.Get_size(), 2.0 * comm.Get_rank())
    assert strategy.experimental_run_v2(lambda x: x + 1, args=(1,)) == 2
    assert strategy.experimental_local_results(mpidist.values.PerReplica(5)) == (5,)


@pytest.mark.parametrize("op", ["SUM", "MEAN", "MAX", "MIN"])
def test_reduce_without_axis(strategy, comm, op):
    size, rank = comm.Get_size(), comm.Get_rank()
    per_replica = strategy.run(lambda: batch(rank, 2))
    stack = np.stack([batch(r, 2) for r in range(size)])
    expected = {"SUM": stack.sum(0), "MEAN": stack.mean(0), "MAX": stack.max(0), "MIN": stack.min(0)}[op]
    assert_same(strategy.reduce(op, per_replica, axis=None), expected)
    assert_same(strategy.reduce(getattr(mpidist.ReduceOp, op), per_replica, axis=None), expected)


def test_seed_reduce_replica_ids(strategy, comm):
    """The seed example: reduce SUM of each replica's id."""
    def step_fn():
        return np.int64(mpidist.get_replica_context().replica_id_in_sync_group)
    per_replica_result = strategy.run(step_fn)
    total = strategy.reduce("SUM", per_replica_result, axis=None)
    assert total == sum(range(comm.Get_size()))


@pytest.mark.parametrize("op", ["SUM", "MEAN", "MAX"])
def test_reduce_along_axis_with_uneven_last_batch(strategy, comm, op):
    """Per-replica batches of different sizes (one rank may have none): MEAN weighs every row."""
    size, rank = comm.Get_size(), comm.Get_rank()
    rows = [(2 * r + 1) % 3 for r in range(size)]  # 1, 0, 2, 1 ...
    if sum(rows) == 0:
        rows[0] = 1
    value = {"x": batch(rank, rows[rank], 1), "n": np.arange(rows[rank], dtype=np.float32)}
    got = strategy.reduce(op, value, axis=0)
    everything = {k: np.concatenate([{"x": batch(r, rows[r], 1),
                                      "n": np.arange(rows[r], dtype=np.float32)}[k] for r in range(size)])
                  for k in ("x", "n")}
    fn = {"SUM": np.sum, "MEAN": np.mean, "MAX": np.max}[op]
    for k in ("x", "n"):
        np.testing.assert_allclose(got[k], fn(everything[k], axis=0), rtol=1e-6)
        assert got[k].dtype == everything[k].dtype


def reference_along(op: str, values: list[np.ndarray], axes: tuple[int, ...]) -> np.ndarray:
    """Every rank's value reduced along ``axes`` and across ranks, as one process would: rows of
    every rank concatenated when axis 0 is reduced, else the ranks stacked as a new leading axis."""
    fn = {"SUM": np.sum, "MEAN": np.mean, "MAX": np.max, "MIN": np.min}[op]
    if 0 in axes:
        return fn(np.concatenate(values), axis=axes)
    return fn(np.stack(values), axis=(0,) + tuple(a + 1 for a in axes))


@pytest.mark.parametrize("axis", [(0, 2), [1, 2], (2, -3), (1,), -1])
@pytest.mark.parametrize("op", ["SUM", "MEAN", "MAX", "MIN"])
def test_reduce_along_several_axes(strategy, comm, op, axis):
    """A tuple (or list) of axes, as the TensorFlow strategies take: MEAN over every element along them."""
    size, rank = comm.Get_size(), comm.Get_rank()
    rows = [1 + r % 3 if 0 in {a % 3 for a in np.atleast_1d(axis)} else 2 for r in range(size)]
    make = lambda r: np.random.default_rng([7, r]).normal(size=(rows[r], 3, 4))
    got = strategy.reduce(op, {"v": make(rank)}, axis=axis)["v"]
    axes = tuple(sorted(a % 3 for a in np.atleast_1d(axis)))
    np.testing.assert_allclose(got, reference_along(op, [make(r) for r in range(size)], axes), rtol=1e-12)


@pytest.mark.parametrize("axis", [0, -1, (0,), [-1]])
@pytest.mark.parametrize("op", ["SUM", "MEAN", "MAX"])
def test_reduce_scalar_along_axis_0_counts_one_element(strategy, comm, op, axis):
    """Keras's multi-worker path calls reduce("MEAN", scalar, axis=0): each rank's scalar is one row."""
    size, rank = comm.Get_size(), comm.Get_rank()
    got = strategy.reduce(op, [np.float64(rank + 0.5), 3.0], axis=axis)
    everything = np.array([r + 0.5 for r in range(size)])
    fn = {"SUM": np.sum, "MEAN": np.mean, "MAX": np.max}[op]
    np.testing.assert_allclose(got[0], fn(everything))
    np.testing.assert_allclose(got[1], {"SUM": 3.0 * size, "MEAN": 3.0, "MAX": 3.0}[op])


def test_reduce_axis_errors_name_the_axis(strategy):
    with pytest.raises(ValueError, match=r"`axis` 1 is out of range for a scalar value"):
        strategy.reduce("SUM", np.float64(1.0), axis=1)
    with pytest.raises(ValueError, match=r"`axis` \(0, -2\) names the same axis twice"):
        strategy.reduce("SUM", np.ones((2, 2)), axis=(0, -2))
    with pytest.raises(ValueError, match=r"`axis` \(0, 2\) is out of range for a value of rank 2"):
        strategy.reduce("SUM", np.ones((2, 2)), axis=(0, 2))
    with pytest.raises(TypeError, match=r"`axis` must be an int, a list/tuple of ints, or None, got \(\)"):
        strategy.reduce("SUM", np.ones((2, 2)), axis=())


def test_gather_ragged_along_axis(strategy, comm):
    size, rank = comm.Get_size(), comm.Get_rank()
    got = strategy.gather(np.full((2, rank + 1), rank, dtype=np.int32), axis=1)
    assert_same(got, np.concatenate([np.full((2, r + 1), r, dtype=np.int32) for r in range(size)], axis=1))
    in_replica = strategy.run(lambda: mpidist.get_replica_context().all_gather(np.array([rank]), axis=0))
    assert_same(in_replica, np.arange(size))


def test_seed_collective_hints_and_options(strategy, comm):
    """Seed: CollectiveHints with bytes_per_pack/timeout_seconds, as hints and as options."""
    size = comm.Get_size()
    hints = mpidist.experimental.CollectiveHints(bytes_per_pack=32, timeout_seconds=120)
    grads = [np.full(7, comm.Get_rank() + 1.0) for _ in range(5)]
    total = strategy.reduce("sum", grads, axis=None, experimental_hints=hints)
    for g in total:
        assert_same(g, np.full(7, size * (size + 1) / 2))
    options = mpidist.experimental.CommunicationOptions(
        bytes_per_pack=50 * 1024 * 1024, timeout_seconds=120.0,
        implementation=mpidist.experimental.CommunicationImplementation.RING)
    reduced = strategy.run(lambda: mpidist.get_replica_context().all_reduce("sum", grads, options=options))
    assert_same(reduced[0], np.full(7, size * (size + 1) / 2))


@pytest.mark.mpi(min_size=2)
def test_timeout_option_reaches_the_engine(strategy, comm):
    options = mpidist.experimental.CommunicationOptions(timeout_seconds=60 if comm.Get_rank() == 0 else None)
    with pytest.raises(CollectiveMismatchError, match="rank 0: allreduce.*with a deadline"):
        strategy.run(lambda: mpidist.get_replica_context().all_reduce("sum", np.ones(2), options=options))


def test_seed_nccl_all_reduce_in_mirrored_strategy(comm):
    """Seed: MirroredStrategy(cross_device_ops=NcclAllReduce()): replicas are this node's ranks."""
    mirrored = mpidist.MirroredStrategy(cross_device_ops=mpidist.NcclAllReduce(num_packs=2))
    node = mpidist.Topology(comm)
    assert mirrored.num_replicas_in_sync == node.local_size
    peers = node.node_ranks[node.node_index]
    got = mirrored.reduce("SUM", [np.array([comm.Get_rank()]), np.ones(3)], axis=None)
    assert_same(got[0], np.array([sum(peers)]))
    assert_same(got[1], np.full(3, float(len(peers))))
    node.free()


@pytest.mark.parametrize("ops", [mpidist.MPIAllReduce(), mpidist.NcclAllReduce(), mpidist.NcclAllReduce(0),
                                 mpidist.HierarchicalCopyAllReduce(num_packs=3), mpidist.ReductionToOneDevice()],
                         ids=repr)
def test_cross_device_ops(comm, ops):
    size, rank = comm.Get_size(), comm.Get_rank()
    value = mpidist.values.PerReplica(np.full(4, rank + 1.0))
    assert_same(ops.reduce("SUM", value, destinations=None), np.full(4, size * (size + 1) / 2))
    assert_same(ops.reduce(mpidist.ReduceOp.MEAN, value, destinations=None), np.full(4, (size + 1) / 2))
    batch_out = ops.batch_reduce("MAX", [(value, None), (mpidist.values.PerReplica(np.int32(rank)), None)])
    assert_same(batch_out[0], np.full(4, float(size)))
    assert batch_out[1] == size - 1
    assert_same(ops.broadcast(np.full(2, rank), destinations=None), np.zeros(2, dtype=np.full(2, 0).dtype))


def test_cross_device_ops_validation():
    for cls in (mpidist.NcclAllReduce, mpidist.HierarchicalCopyAllReduce):
        with pytest.raises(ValueError, match=f"{cls.__name__}: `num_packs` must be an integer >= 0, got -1"):
            cls(num_packs=-1)
    with pytest.raises(ValueError, match="CommunicationOptions: `bytes_per_pack` must be an integer >= 0 or None, got -5"):
        mpidist.experimental.CommunicationOptions(bytes_per_pack=-5)
    with pytest.raises(ValueError, match="MultiWorkerMirroredStrategy.reduce: `reduce_op` must be one of"):
        mpidist.MultiWorkerMirroredStrategy().reduce("avg-ish", np.ones(1), axis=None)


def test_nccl_implementation_without_nccl_is_a_clear_error():
    try:
        import cupy
        if cupy.cuda.is_available():
            pytest.skip("a GPU with cupy is present: NCCL may be available")
    except Exception:
        pass
    with pytest.raises(mpidist.errors.GpuUnavailableError,
                       match="MultiWorkerMirroredStrategy: NCCL is not available: "):
        mpidist.experimental.MultiWorkerMirroredStrategy(
            communication=mpidist.experimental.CommunicationImplementation.NCCL)


def test_contexts_and_module_functions(strategy, comm):
    assert not mpidist.has_strategy()
    assert mpidist.get_replica_context() is not None  # default replica context
    with strategy.scope():
        assert mpidist.get_strategy() is strategy and mpidist.has_strategy()
        assert mpidist.in_cross_replica_context() and mpidist.get_replica_context() is None

        def step():
            ctx = mpidist.get_replica_context()
            return ctx.merge_call(lambda s, x: (s is strategy, mpidist.in_cross_replica_context(), x), args=(3,))
        assert strategy.run(step) == (True, True, 3)
    assert mpidist.get_loss_reduction() is mpidist.ReduceOp.MEAN
    mpidist.experimental_set_strategy(strategy)
    try:
        assert mpidist.get_strategy() is strategy
    finally:
        mpidist.experimental_set_strategy(None)
    assert not mpidist.has_strategy()


def test_extended(strategy, comm):
    size, rank = comm.Get_size(), comm.Get_rank()
    ext = strategy.extended
    assert ext.should_checkpoint == ext.should_save_summary == (rank == 0)
    assert_same(ext.reduce_to("SUM", np.ones(2), destinations=None), np.full(2, float(size)))
    out = ext.batch_reduce_to("MEAN", [(np.full(2, float(rank)), None), (np.ones(1), None)])
    assert_same(out[0], np.full(2, (size - 1) / 2))
    assert_same(out[1], np.ones(1))
    assert_same(ext.broadcast_to(np.array([rank]), destinations=None), np.array([0]))
    var = np.zeros(2)
    assert ext.update(var, lambda v, d: np.add(v, d, out=v), args=(1.0,)) is var and (var == 1).all()


def test_central_storage_updates_on_the_chief(comm):
    central = mpidist.experimental.CentralStorageStrategy()
    rank, size = comm.Get_rank(), comm.Get_size()
    assert_same(central.reduce("SUM", np.array([rank]), axis=None), np.array([size * (size - 1) // 2]))
    out = central.extended.update(np.array([10.0]), lambda v: v + rank + 1)
    assert_same(out, np.array([11.0]))  # rank 0's update, everywhere


def test_one_device_strategy_does_not_communicate(comm):
    one = mpidist.OneDeviceStrategy("/cpu:0")
    assert one.num_replicas_in_sync == 1
    assert one.reduce("SUM", np.array([comm.Get_rank()]), axis=None)[0] == comm.Get_rank()


def test_values_from_function(strategy, comm):
    value = strategy.experimental_distribute_values_from_function(
        lambda ctx: (ctx.replica_id_in_sync_group, ctx.num_replicas_in_sync))
    assert strategy.experimental_local_results(value) == ((comm.Get_rank(), comm.Get_size()),)


def test_experimental_signature_and_cluster_resolver(comm):
    resolver = mpidist.cluster_resolver.MPIClusterResolver(comm)
    spec = resolver.cluster_spec()
    assert resolver.task_type == "worker" and resolver.task_id == comm.Get_rank()
    workers = spec["worker"] if isinstance(spec, dict) else spec.as_dict()["worker"]
    assert len(workers) == comm.Get_size() and resolver.master().startswith("grpc://")
    assert resolver.tf_config()["task"] == {"type": "worker", "index": comm.Get_rank()}
    s = mpidist.experimental.MultiWorkerMirroredStrategy(
        mpidist.experimental.CollectiveCommunication.RING, cluster_resolver=resolver)
    assert s.num_replicas_in_sync == comm.Get_size() and s.cluster_resolver is resolver
    sub = comm.Split(comm.Get_rank() % 2, comm.Get_rank())
    on_sub = mpidist.MultiWorkerMirroredStrategy(comm=sub)
    assert on_sub.reduce("SUM", np.array([comm.Get_rank()]), axis=None)[0] == \
        sum(r for r in range(comm.Get_size()) if r % 2 == comm.Get_rank() % 2)


# -- one class per kind in both modes; close() ----------------------------------------------------------

KINDS = [("MultiWorkerMirroredStrategy", lambda m: m.MultiWorkerMirroredStrategy),
         ("MirroredStrategy", lambda m: m.MirroredStrategy),
         ("OneDeviceStrategy", lambda m: m.OneDeviceStrategy),
         ("experimental.CentralStorageStrategy", lambda m: m.experimental.CentralStorageStrategy),
         ("experimental.MultiWorkerMirroredStrategy", lambda m: m.experimental.MultiWorkerMirroredStrategy)]


@pytest.mark.parametrize("name, cls_of", KINDS, ids=[k[0] for k in KINDS])
def test_each_strategy_is_an_instance_of_its_class_alone(comm, name, cls_of):
    """NumPy mode: mpidist.X() is of type X (a plain class), an mpidist.Strategy, of no other kind's
    class; its replicas are what X promises."""
    cls = cls_of(mpidist)
    with cls() as s:
        assert type(s) is cls and isinstance(s, mpidist.Strategy)
        # an experimental MultiWorkerMirroredStrategy is also a MultiWorkerMirroredStrategy (as in TensorFlow)
        others = [c(mpidist) for n, c in KINDS if n != name and not (
            name == "experimental.MultiWorkerMirroredStrategy" and n == "MultiWorkerMirroredStrategy")]
        assert not any(isinstance(s, other) for other in others), (type(s), others)
        expected = {"OneDeviceStrategy": 1, "MirroredStrategy": s.engine.topology.size}.get(name, comm.Get_size())
        assert s.num_replicas_in_sync == expected
        assert_same(s.reduce("SUM", np.ones(2), axis=None), np.full(2, float(expected)))


def test_copies_share_the_engine_and_pickling_is_refused_on_every_rank(comm):
    """deepcopy: a strategy of the same class on the same communicators, as TensorFlow copies its own;
    pickling the strategy is a TypeError naming it (it holds communicators), pickling its class works."""
    with mpidist.MultiWorkerMirroredStrategy() as s:
        twin = copy.deepcopy(s)
        assert type(twin) is type(s) and twin is not s and twin.engine is s.engine
        total = twin.reduce("SUM", np.full(2, float(comm.Get_rank())), axis=None)
        assert_same(total, np.full(2, float(sum(range(comm.Get_size())))))
        with pytest.raises(TypeError, match="MultiWorkerMirroredStrategy: a strategy holds MPI communicators"):
            pickle.dumps(s)
        assert pickle.loads(pickle.dumps(type(s))) is mpidist.MultiWorkerMirroredStrategy
    assert twin.closed  # closing the original freed the engine they share


def test_a_subclass_of_a_public_class_is_a_plain_subclass(comm):
    class Tagged(mpidist.MultiWorkerMirroredStrategy):
        tag = "mine"

    with Tagged() as s:
        assert type(s) is Tagged and isinstance(s, mpidist.MultiWorkerMirroredStrategy) and s.tag == "mine"
        assert_same(s.reduce("MAX", np.full(2, float(comm.Get_rank())), axis=None), np.full(2, comm.Get_size() - 1.0))


def test_close_frees_the_communicators_and_collectives_then_raise(comm):
    s = mpidist.MultiWorkerMirroredStrategy()
    assert s.engine.topology.comm is not None and s.engine.broken is None
    s.close()
    assert s.closed and s.engine.topology.comm is None and s.engine.topology.local is None
    calls = {"reduce": lambda: s.reduce("SUM", np.ones(2), axis=None),
             "reduce along an axis": lambda: s.reduce("SUM", np.ones((2, 2)), axis=0),
             "gather": lambda: s.gather(np.ones((1, 2)), axis=0),
             "all_reduce in run": lambda: s.run(lambda: mpidist.get_replica_context().all_reduce("SUM", 1.0)),
             "extended.reduce_to": lambda: s.extended.reduce_to("SUM", np.ones(2)),
             "extended.broadcast_to": lambda: s.extended.broadcast_to(np.ones(2)),
             "experimental_distribute_dataset": lambda: s.experimental_distribute_dataset([np.ones((4, 2))])}
    for what, call in calls.items():
        with pytest.raises(RuntimeError, match=r"the strategy was closed \(strategy.close\(\), or the end of its "
                                               r"`with` block\), which freed its communicators"):
            call()
    s.close()  # a second close does nothing
    assert s.closed


def test_with_block_closes_on_every_kind(comm):
    for cls in (mpidist.MirroredStrategy, mpidist.experimental.CentralStorageStrategy, mpidist.OneDeviceStrategy):
        with cls() as s:
            assert s.scope  # usable inside
            assert_same(s.reduce("SUM", np.ones(1), axis=None), np.full(1, float(s.num_replicas_in_sync)))
        assert s.closed and s.engine.topology.comm is None
        with pytest.raises(RuntimeError, match="the strategy was closed"):
            s.reduce("SUM", np.ones(1), axis=None)


def test_default_strategy_close_does_nothing(comm):
    default = mpidist.get_strategy()
    default.close()
    assert not default.closed and default.reduce("SUM", np.ones(1), axis=None).tolist() == [1.0]
