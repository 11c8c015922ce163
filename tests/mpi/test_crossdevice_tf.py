"""CrossDeviceOps (NcclAllReduce, HierarchicalCopyAllReduce, ReductionToOneDevice, MPIAllReduce) on
TensorFlow values, alone and as a TF strategy's ``cross_device_ops``.

Every result is compared with NumPy over all ranks' inputs, which each rank computes itself from
(seed, rank) (reference.py). Runs at any -n; reads rank and size at run time.
"""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from reference import make, reduce_all  # noqa: E402
from spying import SpyEngine  # noqa: E402
from tensorflow.python.distribute import values as tf_values  # noqa: E402  (TF's PerReplica/Mirrored)

import mpidist  # noqa: E402
import mpidist.on_tensorflow  # noqa: E402
from mpidist.cross_device.options import CommunicationOptions  # noqa: E402
from mpidist.values.distributed import Mirrored, PerReplica  # noqa: E402

pytestmark = [pytest.mark.mpi, pytest.mark.node_layout]

OPS = ["sum", "mean", "min", "max"]
DTYPES = [np.float32, np.int32, np.float64]
KINDS = ["nccl", "hierarchical", "one_device", "mpi"]
FORMS = ["tensor", "variable", "per_replica", "tf_per_replica", "tf_mirrored"]
MODES = ["eager", "function"]


def build(kind: str, size: int):
    """A fresh ops object; ReductionToOneDevice reduces to the LAST rank (not the default 0)."""
    if kind == "nccl":
        return mpidist.NcclAllReduce(num_packs=2)
    if kind == "hierarchical":
        return mpidist.HierarchicalCopyAllReduce(num_packs=1)
    if kind == "one_device":
        return mpidist.ReductionToOneDevice(reduce_to_device=f"/job:worker/task:{size - 1}/device:CPU:0")
    return mpidist.MPIAllReduce(bytes_per_pack=64)


def wrap(form: str, array: np.ndarray):
    tensor = tf.constant(array)
    if form == "variable":
        return tf.Variable(tensor)
    if form == "per_replica":
        return PerReplica(tensor)
    if form == "tf_per_replica":
        return tf_values.PerReplica((tensor,))
    if form == "tf_mirrored":
        return tf_values.Mirrored((tensor,))
    return tensor


def inputs(size: int, dtype, shape, op: str, seed: int = 0) -> list[np.ndarray]:
    return [make(r, dtype, shape, op, seed) for r in range(size)]


def check(result, expected: np.ndarray) -> None:
    assert isinstance(result, tf.Tensor), type(result)
    assert result.dtype.as_numpy_dtype == expected.dtype, (result.dtype, expected.dtype)
    assert tuple(result.shape) == expected.shape, (result.shape, expected.shape)
    np.testing.assert_array_equal(result.numpy(), expected)


def run(mode: str, fn, *args):
    return tf.function(fn)(*args) if mode == "function" else fn(*args)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("mode", MODES)
def test_reduce(comm, kind, op, dtype, mode):
    rank, size = comm.Get_rank(), comm.Get_size()
    every = inputs(size, dtype, (3, 4), op)
    ops = build(kind, size)
    value = tf.constant(every[rank])
    result = run(mode, lambda v: ops.reduce(op.upper(), v, destinations=v), value)
    check(result, reduce_all(every, op))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("form", FORMS)
def test_reduce_forms(comm, kind, form):
    """tf.Variable and distributed values (mpidist's and TensorFlow's) give their component's reduction."""
    rank, size = comm.Get_rank(), comm.Get_size()
    every = inputs(size, np.float32, (5,), "sum", seed=1)
    value = wrap(form, every[rank])
    check(build(kind, size).reduce(tf.distribute.ReduceOp.SUM, value, destinations=None),
          reduce_all(every, "sum"))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", MODES)
def test_reduce_nest_in_scope(comm, strategy, kind, mode):
    """A nest of mixed forms inside a TF strategy's scope, eagerly and in a tf.function."""
    rank, size = comm.Get_rank(), comm.Get_size()
    a, b, c = (inputs(size, dt, shape, "max", seed=s) for dt, shape, s in
               [(np.float32, (2, 3), 2), (np.int32, (), 3), (np.float64, (4,), 4)])
    ops = build(kind, size)
    # Made outside the scope: a variable made inside would start as rank 0's value on every rank.
    nest = {"a": tf.Variable(a[rank]), "bc": (PerReplica(tf.constant(b[rank])), tf.constant(c[rank]))}
    with strategy.scope():
        result = run(mode, lambda: ops.reduce("max", nest))
    assert set(result) == {"a", "bc"} and isinstance(result["bc"], tuple)
    check(result["a"], reduce_all(a, "max"))
    check(result["bc"][0], reduce_all(b, "max"))
    check(result["bc"][1], reduce_all(c, "max"))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", MODES)
def test_batch_reduce(comm, kind, mode):
    rank, size = comm.Get_rank(), comm.Get_size()
    first = inputs(size, np.float32, (6,), "mean", seed=5)
    second = inputs(size, np.int32, (2, 2), "mean", seed=6)
    ops = build(kind, size)

    def fn():
        pairs = [(tf.constant(first[rank]), "/cpu:0"), (PerReplica(tf.constant(second[rank])), None)]
        return ops.batch_reduce(mpidist.ReduceOp.MEAN, pairs)

    result = run(mode, fn)
    assert isinstance(result, list) and len(result) == 2
    check(result[0], reduce_all(first, "mean"))
    check(result[1], reduce_all(second, "mean"))
    assert ops.batch_reduce("sum", []) == []


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", MODES)
def test_broadcast(comm, kind, mode):
    rank, size = comm.Get_rank(), comm.Get_size()
    every = inputs(size, np.float64, (3,), "sum", seed=7)
    ops = build(kind, size)
    result = run(mode, lambda: ops.broadcast(tf.constant(every[rank]), destinations="/cpu:0"))
    check(result, every[0])
    last = run(mode, lambda: ops.broadcast({"x": Mirrored(tf.constant(every[rank]))}, root=size - 1))
    check(last["x"], every[size - 1])


def test_numpy_values_stay_numpy(comm):
    """With TensorFlow imported, NumPy values still take the NumPy path and come back as arrays."""
    rank, size = comm.Get_rank(), comm.Get_size()
    every = inputs(size, np.float64, (4,), "sum", seed=8)
    result = mpidist.NcclAllReduce().reduce("sum", every[rank])
    assert isinstance(result, np.ndarray)
    np.testing.assert_array_equal(result, reduce_all(every, "sum"))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mode", MODES)
def test_strategy_routes_through_cross_device_ops(comm, eng, kind, mode):
    """extended.reduce_to / batch_reduce_to / broadcast_to (and strategy.reduce) run the strategy's
    cross_device_ops on its engine, with the ops' algorithm, packing and root."""
    rank, size = comm.Get_rank(), comm.Get_size()
    spy = SpyEngine(eng)
    ops = build(kind, size)
    strategy = mpidist.on_tensorflow.MultiWorkerMirroredStrategy.on_engine(spy, CommunicationOptions(),
                                                                           cross_device_ops=ops)
    assert ops.engine is spy
    spy.calls.clear()  # building agreed on the shuffle seed (one broadcast): count the calls below
    x_all = inputs(size, np.float32, (2, 3), "sum", seed=9)
    y_all = inputs(size, np.float32, (4,), "min", seed=10)
    x, y = tf.constant(x_all[rank]), tf.constant(y_all[rank])
    with strategy.scope():
        summed = run(mode, lambda: strategy.extended.reduce_to("SUM", PerReplica(x), destinations=x))
        batch = run(mode, lambda: strategy.extended.batch_reduce_to("MIN", [(x, x), (y, y)]))
        reduced = run(mode, lambda: strategy.reduce("MEAN", x, axis=None))
        broadcast = run(mode, lambda: strategy.extended.broadcast_to(x, destinations=x))
    check(summed, reduce_all(x_all, "sum"))
    check(batch[0], reduce_all(x_all, "min"))
    check(batch[1], reduce_all(y_all, "min"))
    check(reduced, reduce_all(x_all, "mean"))
    check(broadcast, x_all[0])
    names = [name for name, _ in spy.calls]
    if kind == "one_device":
        roots = [kw.get("root") for name, kw in spy.calls if name == "reduce"]
        assert roots == [size - 1] * 3, spy.calls
        assert "allreduce" not in names, spy.calls
    else:
        allreduces = [kw for name, kw in spy.calls if name == "allreduce"]
        assert len(allreduces) == 3, spy.calls
        for kw in allreduces:
            assert kw.get("algorithm") == ("hierarchical" if kind == "hierarchical" else None), kw
            if kind in ("nccl", "hierarchical"):
                assert kw.get("num_packs") == ops.num_packs, kw
            if kind == "mpi":
                assert kw.get("bytes_per_pack") == 64, kw
    assert names.count("broadcast") == (4 if kind == "one_device" else 1), spy.calls


def test_strategy_without_cross_device_ops_uses_its_engine(comm, eng):
    spy = SpyEngine(eng)
    strategy = mpidist.on_tensorflow.MultiWorkerMirroredStrategy.on_engine(spy, CommunicationOptions())
    spy.calls.clear()  # building agreed on the shuffle seed (one broadcast): count the calls below
    rank, size = comm.Get_rank(), comm.Get_size()
    every = inputs(size, np.float32, (3,), "sum", seed=11)
    check(strategy.extended.reduce_to("sum", tf.constant(every[rank]), None), reduce_all(every, "sum"))
    assert [(n, kw.get("algorithm")) for n, kw in spy.calls] == [("allreduce", None)]


def test_strategy_rejects_foreign_cross_device_ops(eng):
    with pytest.raises(TypeError, match="MultiWorkerMirroredStrategy: `cross_device_ops` must be an mpidist CrossDeviceOps"):
        mpidist.on_tensorflow.MultiWorkerMirroredStrategy.on_engine(eng, CommunicationOptions(), cross_device_ops=object())


@pytest.mark.parametrize("kind", KINDS)
def test_public_mirrored_strategy_with_cross_device_ops(comm, kind):
    """mpidist.MirroredStrategy(cross_device_ops=...) with TensorFlow loaded: a TF strategy over this
    node's ranks whose reduce_to / batch_reduce_to run the given ops, bound to its engine."""
    rank = comm.Get_rank()
    node = mpidist.Topology(comm).local
    node_ranks = node.allgather(rank)
    # ReductionToOneDevice's root names a rank of the strategy's communicator: this node's last one
    ops = build(kind, len(node_ranks))
    strategy = mpidist.MirroredStrategy(cross_device_ops=ops)
    assert isinstance(strategy, tf.distribute.Strategy) and strategy.num_replicas_in_sync == len(node_ranks)
    assert ops.engine is strategy.engine
    every = inputs(comm.Get_size(), np.float32, (2, 2), "sum", seed=12)
    mine = [every[r] for r in node_ranks]
    x = tf.constant(every[rank])
    check(strategy.extended.reduce_to("SUM", x, destinations=x), reduce_all(mine, "sum"))
    batch = strategy.extended.batch_reduce_to("MAX", [(x, x), (PerReplica(x * 2), None)])
    check(batch[0], reduce_all(mine, "max"))
    check(batch[1], reduce_all([m * 2 for m in mine], "max"))
    node.Free()
