"""Distributed input under mpidist's tf.distribute.Strategy, against single-process references.

Auto-sharding (AUTO, FILE, DATA, OFF, HINT) as TensorFlow does it; uneven data (files of different
sizes, N*k + r elements, dataset_fn shards of different lengths) ending on every rank at the same
step with empty batches on the ranks that ran out; the iterator eagerly, in tf.function and in
Keras; global losses equal to single-process ones. Rank and size are read at run time.
"""
from __future__ import annotations

import logging
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import mpidist  # noqa: E402,F401
from mpidist.tensorflow import _tf_private  # noqa: E402

pytestmark = pytest.mark.mpi
Policy = tf.data.experimental.AutoShardPolicy


def with_policy(dataset, policy: str):
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = getattr(Policy, policy)
    return dataset.with_options(options)


def steps_of(dist, key=None):
    """Every step's per-replica batch as a list (of ``batch[key]`` for dicts), iterated eagerly."""
    return [(b[key] if key else b).numpy().tolist() for b in dist]


def write_files(comm, directory, name, sizes, kind="tfrecord"):
    """Files ``name-FF.kind``; file f holds the records f * 1000 + i, i < sizes[f]. The chief writes."""
    paths = [os.path.join(directory, f"{name}-{f:02d}.{kind}") for f in range(len(sizes))]
    if comm.Get_rank() == 0:
        for f, (path, n) in enumerate(zip(paths, sizes)):
            records = [str(f * 1000 + i) for i in range(n)]
            if kind == "tfrecord":
                with tf.io.TFRecordWriter(path) as writer:
                    for record in records:
                        writer.write(record.encode())
            else:
                with open(path, "w") as out:
                    out.write("\n".join(records) + "\n")
    comm.Barrier()
    return paths


def parse(record):
    return tf.strings.to_number(record, tf.int64)


def warnings_of(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "mpidist" and r.levelno == logging.WARNING]


@pytest.mark.parametrize("policy", ["AUTO", "DATA", "DATA of unknown length"])
def test_data_sharding_disjoint_and_complete(strategy, comm, caplog, policy):
    rank, size = comm.Get_rank(), comm.Get_size()
    n, global_batch = 7 * size + 3, 2 * size + 1  # N*k + r elements; B not a multiple of N (N > 1)
    ds = tf.data.Dataset.range(n)
    if policy.endswith("unknown length"):  # the ranks then agree every step whether any has data
        ds = ds.filter(lambda i: True)
    ds = ds.map(lambda i: {"id": i, "x": tf.fill([2], tf.cast(i, tf.float32))}).batch(global_batch)
    if policy != "AUTO":
        ds = with_policy(ds, "DATA")
    with caplog.at_level(logging.WARNING, logger="mpidist"):
        dist = strategy.experimental_distribute_dataset(ds)
    fallback = [m for m in warnings_of(caplog) if "auto_shard_policy=AUTO applies DATA sharding" in m]
    assert len(fallback) == (policy == "AUTO" and size > 1 and rank == 0)  # chief only, once
    mine = steps_of(dist, "id")
    everyone = comm.allgather(mine)
    reference = [b.tolist() for b in tf.data.Dataset.range(n).batch(global_batch).as_numpy_iterator()]
    assert [len(steps) for steps in everyone] == [len(reference)] * size
    for step, batch in enumerate(reference):  # each global batch: the ranks' blocks, in rank order
        blocks = [everyone[r][step] for r in range(size)]
        assert sum(blocks, []) == batch
        assert [len(b) for b in blocks] == [len(a) for a in np.array_split(batch, size)]

    @tf.function
    def total_in_graph(dataset):
        total, steps = tf.constant(0, tf.int64), tf.constant(0)
        for batch in dataset:  # AutoGraph: DistributedDataset.reduce
            total += tf.reduce_sum(batch["id"])
            steps += 1
        return total, steps

    total, steps = total_in_graph(dist)
    assert (int(total), int(steps)) == (sum(sum(mine, [])), len(reference))


@pytest.mark.parametrize("kind", ["tfrecord", "text"])
def test_file_sharding_gives_whole_files(strategy, comm, shared_dir, kind):
    rank, size = comm.Get_rank(), comm.Get_size()
    sizes = [3 + 2 * f for f in range(size + 1)]  # N + 1 files of different sizes: rank 0 reads two
    paths = write_files(comm, shared_dir, f"whole-{kind}", sizes, kind)
    global_batch = 2 * size
    if kind == "tfrecord":  # AUTO finds the files
        ds = tf.data.TFRecordDataset(paths)
    else:  # FILE, through list_files + interleave
        pattern = os.path.join(shared_dir, f"whole-{kind}-*.{kind}")
        ds = with_policy(tf.data.Dataset.list_files(pattern, shuffle=False).interleave(tf.data.TextLineDataset),
                         "FILE")
    dist = strategy.experimental_distribute_dataset(ds.map(parse).batch(global_batch))
    assert dist.auto_shard_mode == ("FILE" if size > 1 else "single")
    batches = list(dist)
    steps = [b.numpy().tolist() for b in batches]
    everyone = comm.allgather(steps)
    assert len({len(s) for s in everyone}) == 1  # the same number of steps on every rank
    files = range(rank, len(sizes), size)  # rank r: files r, r + N, ... whole, and nothing else
    assert sorted(sum(steps, [])) == sorted(f * 1000 + i for f in files for i in range(sizes[f]))
    every_record = sorted(sum((s for steps_r in everyone for s in steps_r), []))
    assert every_record == sorted(f * 1000 + i for f in range(len(sizes)) for i in range(sizes[f]))
    records = sum(sizes[f] for f in files)  # this rank's batches of B, each cut into N pieces
    real = records // global_batch * size + min(records % global_batch, size)
    assert [bool(s) for s in steps] == [True] * real + [False] * (len(steps) - real)
    assert all(len(s) <= global_batch // size for s in steps)
    if rank > 0:
        assert len(steps) > real  # ranks with one file run out first ...
        for empty in batches[real:]:  # ... and step on with empty batches of the right type
            assert (empty.dtype, tuple(empty.shape)) == (tf.int64, (0,))


def test_fewer_files_than_ranks(strategy, comm, shared_dir, caplog):
    rank, size = comm.Get_rank(), comm.Get_size()
    if size == 1:
        pytest.skip("needs 2 ranks or more")
    sizes = [5 + f for f in range(size - 1)]
    paths = write_files(comm, shared_dir, "few", sizes)
    ds = tf.data.TFRecordDataset(paths).map(parse).batch(4)
    with caplog.at_level(logging.WARNING, logger="mpidist"):
        dist = strategy.experimental_distribute_dataset(ds)  # AUTO: falls back to DATA, says why
    assert dist.auto_shard_mode == "DATA"
    found = [m for m in warnings_of(caplog) if f"it has {size - 1} file(s) but the job has {size} ranks" in m]
    assert len(found) == (rank == 0)
    everyone = comm.allgather(steps_of(dist))
    assert len({len(s) for s in everyone}) == 1
    assert sorted(sum(sum(everyone, []), [])) == sorted(f * 1000 + i for f in range(size - 1) for i in range(sizes[f]))
    expected = (f"`dataset` has {size - 1} file\\(s\\) but the job has {size} ranks; auto_shard_policy=FILE "
                f"needs at least one file per rank")
    with pytest.raises(ValueError, match=expected):  # on every rank: each rank's test asserts it
        strategy.experimental_distribute_dataset(with_policy(ds, "FILE"))
    with pytest.raises(ValueError, match="reads no files, but auto_shard_policy=FILE"):
        strategy.experimental_distribute_dataset(with_policy(tf.data.Dataset.range(8).batch(4), "FILE"))


def test_off_and_hint_policies(strategy, comm):
    rank, size = comm.Get_rank(), comm.Get_size()
    n, global_batch = 3 * 2 * size + 3, 2 * size
    dist = strategy.experimental_distribute_dataset(with_policy(tf.data.Dataset.range(n).batch(global_batch), "OFF"))
    steps = steps_of(dist)
    assert sorted(sum(steps, [])) == list(range(n))  # OFF: every rank sees every element once
    everyone = comm.allgather(steps)
    assert len({len(s) for s in everyone}) == 1
    for k in range(n // global_batch):  # each full global batch takes N steps; at each, the ranks
        for j in range(size):           # hold disjoint pieces that make up that global batch
            pieces = [everyone[r][k * size + j] for r in range(size)]
            assert sorted(sum(pieces, [])) == list(range(k * global_batch, (k + 1) * global_batch))
    hinted = tf.data.Dataset.range(n).shard(tf.data.experimental.SHARD_HINT, tf.data.experimental.SHARD_HINT)
    dist = strategy.experimental_distribute_dataset(with_policy(hinted.batch(3), "HINT"))
    assert sorted(sum(steps_of(dist), [])) == list(range(rank, n, size))  # shard(N, rank) filled in


def test_input_context_and_numpy_dataset(strategy, comm):
    rank, size = comm.Get_rank(), comm.Get_size()
    contexts = []

    def dataset_fn(context):
        contexts.append(context)
        per_replica = context.get_per_replica_batch_size(4 * size)
        return tf.data.Dataset.range(8 * size).shard(context.num_input_pipelines,
                                                     context.input_pipeline_id).batch(per_replica)

    dist = strategy.distribute_datasets_from_function(dataset_fn)
    (context,) = contexts
    assert (context.num_input_pipelines, context.input_pipeline_id, context.num_replicas_in_sync) == (size, rank, size)
    assert context.get_per_replica_batch_size(4 * size) == 4
    if size > 1:
        with pytest.raises(ValueError):
            context.get_per_replica_batch_size(4 * size + 1)
    assert sum(steps_of(dist), []) == list(range(rank, 8 * size, size))
    assert dist.cardinality == 2  # the same on every rank: no per-step agreement needed
    per_replica = tf.distribute.InputOptions(experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA)
    with pytest.raises(NotImplementedError, match="PER_REPLICA"):
        strategy.distribute_datasets_from_function(dataset_fn, per_replica)
    x = np.arange(18, dtype=np.float32).reshape(9, 2)
    examples = strategy.experimental_make_numpy_dataset(x)
    np.testing.assert_array_equal(np.stack(list(examples.as_numpy_iterator())), x)
    rows = comm.allgather(steps_of(strategy.experimental_distribute_dataset(examples.batch(4))))
    assert np.concatenate([np.asarray(rows[r][s]).reshape(-1, 2) for s in range(3) for r in range(size)]).tolist() == x.tolist()
    for cls, method in _tf_private.REQUIRED_METHODS:  # the private methods used, still there
        assert callable(getattr(cls, method, None)), f"{cls.__name__}.{method}"


def uneven_fn(context):
    """Rank r: 3r + 2 examples {"id", "x" (3 floats)} in batches of 2: every rank a different length."""
    r = context.input_pipeline_id
    return tf.data.Dataset.range(3 * r + 2).map(
        lambda i: {"id": 100 * r + i, "x": tf.fill([3], tf.cast(i, tf.float32))}).batch(2)


def test_uneven_from_function_ends_together(strategy, comm):
    rank, size = comm.Get_rank(), comm.Get_size()
    lengths = [-(-(3 * r + 2) // 2) for r in range(size)]  # batches per rank
    expected = max(lengths)
    dist = strategy.distribute_datasets_from_function(uneven_fn)
    assert dist.element_spec["x"].shape.as_list() == [None, 3]
    batches = list(dist)  # eagerly
    assert len(batches) == expected
    assert sum((b["id"].numpy().tolist() for b in batches), []) == [100 * rank + i for i in range(3 * rank + 2)]
    for empty in batches[lengths[rank]:]:
        assert (empty["x"].dtype, tuple(empty["x"].shape), tuple(empty["id"].shape)) == (tf.float32, (0, 3), (0,))
    iterator = iter(dist)
    flags = []
    while not flags or flags[-1]:
        flags.append(bool(iterator.get_next_as_optional().has_value()))
    assert comm.allgather(flags) == [[True] * expected + [False]] * size  # the same answer everywhere
    iterator, taken = iter(dist), 0
    with pytest.raises(tf.errors.OutOfRangeError):
        while True:
            iterator.get_next()
            taken += 1
    assert taken == expected

    @tf.function
    def in_graph(dataset):
        steps, rows = tf.constant(0), tf.constant(0)
        for batch in dataset:
            steps += 1
            rows += tf.shape(batch["x"])[0]
        return steps, rows

    assert [int(t) for t in in_graph(dist)] == [expected, 3 * rank + 2]

    @tf.function
    def next_ids(it):  # the iterator passed in, as Keras does: traced once
        return it.get_next()["id"]

    @tf.function
    def has_next(it):
        return it.get_next_as_optional().has_value()

    iterator, taken = iter(dist), 0
    with pytest.raises(tf.errors.OutOfRangeError):
        while True:
            next_ids(iterator)
            taken += 1
    assert taken == expected
    iterator = iter(dist)
    assert [bool(has_next(iterator)) for _ in range(expected + 2)] == [True] * expected + [False] * 2
    assert (next_ids.experimental_get_tracing_count(), has_next.experimental_get_tracing_count()) == (1, 1)


def _feature_files(comm, directory, size):
    """N + 1 TFRecord files of (x: 4 floats, y: 1 float), file f with 5 + 3f examples."""
    paths = [os.path.join(directory, f"features-{f:02d}.tfrecord") for f in range(size + 1)]
    if comm.Get_rank() == 0:
        rng = np.random.default_rng(7)
        for f, path in enumerate(paths):
            with tf.io.TFRecordWriter(path) as writer:
                for _ in range(5 + 3 * f):
                    row = rng.normal(size=5).astype(np.float32)
                    writer.write(tf.io.serialize_tensor(tf.constant(row)).numpy())
    comm.Barrier()
    return paths


def _features(paths, global_batch):
    def split(record):
        row = tf.ensure_shape(tf.io.parse_tensor(record, tf.float32), [5])
        return row[:4], row[4:] + tf.reduce_sum(row[:4])
    return tf.data.TFRecordDataset(paths).map(split).batch(global_batch)


def test_keras_global_loss_with_uneven_files(strategy, comm, shared_dir):
    keras = pytest.importorskip("keras")
    size = comm.Get_size()
    paths = _feature_files(comm, shared_dir, size)
    global_batch = 4 * size

    def build():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="tanh"), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=["mae"])
        return model

    with strategy.scope():
        model = build()  # one step per call: the agreement inside get_next ends the epoch
    initial = model.get_weights()
    got = model.evaluate(_features(paths, global_batch), verbose=0, return_dict=True)  # FILE: uneven ranks

    def single_process():
        reference = build()
        reference.set_weights(initial)
        return reference.evaluate(_features(paths, global_batch), verbose=0, return_dict=True)

    expected = comm.bcast(single_process() if comm.Get_rank() == 0 else None, root=0)
    assert got.keys() == expected.keys()
    for key in expected:  # the loss over every example of every file, not this rank's
        assert got[key] == pytest.approx(expected[key], rel=1e-5)
    with strategy.scope():  # several steps per call: get_next_as_optional in Keras' while loop
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", steps_per_execution=2)
    history = model.fit(_features(paths, global_batch), epochs=2, verbose=0)  # ranks run out at different steps
    assert np.all(np.isfinite(history.history["loss"]))
    everyone = comm.allgather([w.tolist() for w in model.get_weights()])
    assert all(w == everyone[0] for w in everyone)  # every rank took the same steps, the same updates
    x = np.random.default_rng(5).normal(size=(3 * global_batch + 1, 4)).astype(np.float32)
    y = x.sum(axis=1, keepdims=True)  # NumPy arrays, N*k + 1 rows: the last block is empty on ranks > 0
    got = model.evaluate(x, y, batch_size=global_batch, verbose=0, return_dict=True)
    trained = model.get_weights()

    def single_process_arrays():
        reference = build()
        reference.compile(optimizer="sgd", loss="mse")
        reference.set_weights(trained)
        return reference.evaluate(x, y, batch_size=global_batch, verbose=0, return_dict=True)

    expected = comm.bcast(single_process_arrays() if comm.Get_rank() == 0 else None, root=0)
    assert got["loss"] == pytest.approx(expected["loss"], rel=1e-5)


def test_custom_loop_with_empty_batches_equals_single_process(strategy, comm):
    keras = pytest.importorskip("keras")
    size = comm.Get_size()
    global_batch = 2 * size
    rng = np.random.default_rng(3)
    n = 3 * global_batch + 1  # the last global batch has one row: the other ranks get empty blocks
    x = rng.normal(size=(n, 4)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5, 3.0], np.float32))[:, None]
    dataset = with_policy(tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch), "DATA")

    def train(strategy_or_default, initial=None):
        with strategy_or_default.scope():
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
            optimizer = keras.optimizers.SGD(0.05, momentum=0.5)
        if initial is not None:
            model.set_weights(initial)
        start = model.get_weights()

        def step(features, labels):
            with tf.GradientTape() as tape:
                per_example = tf.square(model(features, training=True) - labels)[:, 0]
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        @tf.function
        def distributed_step(batch):
            return strategy_or_default.reduce("sum", strategy_or_default.run(step, args=batch), axis=None)

        data = strategy_or_default.experimental_distribute_dataset(dataset)
        losses = [sum(float(distributed_step(batch)) for batch in data) for _ in range(2)]
        return start, losses, model.get_weights()

    initial, losses, weights = train(strategy)
    expected = comm.bcast(train(tf.distribute.get_strategy(), initial)[1:] if comm.Get_rank() == 0 else None, root=0)
    np.testing.assert_allclose(losses, expected[0], rtol=1e-5)
    for a, b in zip(weights, expected[1]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
