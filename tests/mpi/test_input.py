"""Input distribution without TensorFlow: disjoint and complete shards, identical step counts on
every rank with uneven data (no hang), InputContext, iterator protocol, global epoch loss."""
from __future__ import annotations

import numpy as np
import pytest

import mpidist
from mpidist.input import OutOfRangeError

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def strategy():
    with mpidist.rc.override(framework="numpy"):
        return mpidist.MultiWorkerMirroredStrategy()


def examples(n: int) -> dict:
    return {"x": np.arange(n * 3, dtype=np.float32).reshape(n, 3), "id": np.arange(n, dtype=np.int64)}


@pytest.mark.parametrize("remainder", [0, 1, 3])
@pytest.mark.parametrize("shuffle", [False, True])
def test_numpy_dataset_shards_are_disjoint_and_complete(strategy, comm, remainder, shuffle):
    size = comm.Get_size()
    global_batch = 2 * size
    n = global_batch * 3 + remainder  # N*k + r examples
    data = strategy.experimental_make_numpy_dataset(examples(n))
    if shuffle:
        data = data.shuffle(seed=7)
    dist = strategy.experimental_distribute_dataset(data.batch(global_batch))
    seen, steps = [], 0
    for batch in dist:
        assert batch["x"].shape[1:] == (3,) and batch["x"].dtype == np.float32
        np.testing.assert_array_equal(batch["x"][:, 0], batch["id"] * 3)
        seen.extend(batch["id"].tolist())
        steps += 1
    assert comm.allgather(steps) == [steps] * size
    assert steps == -(-n // global_batch)
    everyone = [i for ids in comm.allgather(seen) for i in ids]
    assert sorted(everyone) == list(range(n))  # each example exactly once


def test_plain_iterable_of_global_batches(strategy, comm):
    size, rank = comm.Get_size(), comm.Get_rank()
    batches = [np.arange(b * 10, b * 10 + 2 * size + b) for b in range(3)]  # 2N, 2N+1, 2N+2 rows
    got = [x.tolist() for x in strategy.experimental_distribute_dataset(batches)]
    expected = [np.array_split(b, size)[rank].tolist() for b in batches]
    assert got == expected


def test_uneven_datasets_from_function_finish_together(strategy, comm):
    size, rank = comm.Get_size(), comm.Get_rank()

    def dataset_fn(ctx: mpidist.InputContext):
        assert (ctx.num_input_pipelines, ctx.input_pipeline_id, ctx.num_replicas_in_sync) == (size, rank, size)
        per_replica = ctx.get_per_replica_batch_size(4 * size)
        # pipeline p has p batches: pipeline 0 has none at all
        return [{"v": np.full((per_replica, 2), p, dtype=np.int16)} for p in range(ctx.input_pipeline_id)]

    steps, sizes = 0, []
    for batch in strategy.distribute_datasets_from_function(dataset_fn):
        assert batch["v"].dtype == np.int16 and batch["v"].shape[1:] == (2,)
        sizes.append(batch["v"].shape[0])
        total = strategy.reduce("SUM", batch["v"].sum(), axis=None)  # a collective inside every step
        assert total == sum(4 * 2 * p for r in range(size) for p in [steps] if p < r)
        steps += 1
    assert comm.allgather(steps) == [size - 1] * size
    assert sizes == [4 if s < rank else 0 for s in range(size - 1)]


def test_get_next_and_optional_agree_across_ranks(strategy, comm):
    rank = comm.Get_rank()
    dist = strategy.distribute_datasets_from_function(lambda ctx: [np.ones((1, 2))] * (ctx.input_pipeline_id % 2 + 1))
    it = iter(dist)
    first = it.get_next()
    assert first.shape == (1, 2)
    optional = it.get_next_as_optional()
    any_second = comm.Get_size() > 1
    assert optional.has_value() == any_second
    if any_second:
        assert optional.get_value().shape == ((1, 2) if rank % 2 == 1 else (0, 2))
    with pytest.raises(OutOfRangeError, match="end of sequence"):
        it.get_next()
    assert dist.element_spec.shape == (None, 2)


def test_global_epoch_loss_equals_single_process(strategy, comm):
    """Mean squared value over an epoch with a partial last batch, from per-step reductions."""
    n, global_batch = 37, 8
    data = examples(n)
    dist = strategy.experimental_distribute_dataset(strategy.experimental_make_numpy_dataset(data).batch(global_batch))
    total = 0.0
    for batch in dist:
        total += float(strategy.reduce("SUM", np.sum(batch["x"].astype(np.float64) ** 2), axis=None))
    loss = total / n
    single = float(np.mean(np.sum(data["x"].astype(np.float64) ** 2, axis=1)))
    assert loss == pytest.approx(single, rel=1e-12)
    per_step = [strategy.reduce("MEAN", b["x"], axis=0) for b in dist]  # MEAN with axis: global rows
    np.testing.assert_allclose(per_step[-1], data["x"][32:].mean(axis=0), rtol=1e-6)


def test_input_context_and_errors(strategy):
    ctx = mpidist.InputContext(num_input_pipelines=4, input_pipeline_id=2, num_replicas_in_sync=4)
    assert ctx.get_per_replica_batch_size(64) == 16
    with pytest.raises(ValueError, match="`global_batch_size` 10 is not divisible by num_replicas_in_sync 4"):
        ctx.get_per_replica_batch_size(10)
    with pytest.raises(ValueError, match="call .batch\\(global_batch_size\\) first"):
        strategy.experimental_distribute_dataset(strategy.experimental_make_numpy_dataset(np.ones((4, 2))))
    with pytest.raises(TypeError, match="must be an iterable of global batches, got int"):
        strategy.experimental_distribute_dataset(3)
    with pytest.raises(ValueError, match="InputOptions: `experimental_replication_mode` must be"):
        mpidist.InputOptions(experimental_replication_mode="SOMETIMES")
    assert mpidist.InputOptions(experimental_replication_mode="PER_REPLICA").experimental_replication_mode \
        is mpidist.InputReplicationMode.PER_REPLICA
