"""Distributed input under mpidist's tf.distribute.Strategy: every rank takes its own slice of
every global batch (disjoint, complete, the same number of steps on every rank), and
``distribute_datasets_from_function`` gets the InputContext of its rank."""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest

tf = pytest.importorskip("tensorflow")

import mpidist  # noqa: E402

pytestmark = pytest.mark.mpi


def test_distribute_dataset_slices_every_global_batch(strategy, eng, comm):
    n, global_batch = 37, 8
    ds = tf.data.Dataset.range(n).map(lambda i: {"i": i, "x": tf.cast(i, tf.float32)}).batch(global_batch)
    dist = strategy.experimental_distribute_dataset(ds)
    assert isinstance(dist, tf.distribute.DistributedDataset)
    mine = [b["i"].numpy().tolist() for b in dist]
    everyone = comm.allgather(mine)
    assert len({len(steps) for steps in everyone}) == 1  # every rank the same number of steps
    for step in range(len(mine)):
        batch = sum((everyone[r][step] for r in range(eng.size)), [])
        assert batch == list(range(step * global_batch, min(n, (step + 1) * global_batch)))
    # tuples keep their structure; a tf.function can loop over the distributed dataset
    pairs = strategy.experimental_distribute_dataset(tf.data.Dataset.range(16).map(lambda i: (i, -i)).batch(4))

    @tf.function  # with AutoGraph: a Python for loop over a DistributedDataset
    def total():
        result = tf.constant(0, tf.int64)
        for first, _ in pairs:
            result += tf.reduce_sum(first)
        return result

    assert strategy.reduce("sum", total(), axis=None).numpy() == sum(range(16))
    singles = strategy.experimental_distribute_dataset(tf.data.Dataset.range(8).map(lambda i: (i,)).batch(4))
    first = next(iter(singles))
    assert isinstance(first, tuple) and len(first) == 1
    with pytest.raises(ValueError, match="experimental_distribute_dataset: `dataset` must yield batches"):
        strategy.experimental_distribute_dataset(tf.data.Dataset.range(4))


def test_distribute_datasets_from_function(strategy, eng):
    def dataset_fn(ctx):
        assert (ctx.input_pipeline_id, ctx.num_input_pipelines) == (eng.rank, eng.size)
        per_replica = ctx.get_per_replica_batch_size(4 * eng.size)
        return tf.data.Dataset.range(32).shard(ctx.num_input_pipelines, ctx.input_pipeline_id).batch(per_replica)

    dist = strategy.distribute_datasets_from_function(dataset_fn)
    seen = sum((b.numpy().tolist() for b in dist), [])
    assert seen == list(range(eng.rank, 32, eng.size))
    if eng.size > 1:
        with pytest.raises(ValueError, match="every rank must take the same number of steps"):
            strategy.distribute_datasets_from_function(lambda ctx: tf.data.Dataset.range(eng.rank + 1).batch(1))
