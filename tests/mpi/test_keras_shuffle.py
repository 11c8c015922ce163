"""Shuffling without a seed under an mpidist strategy: in every epoch the ranks see disjoint parts
of ONE global permutation (together exactly the data set, each row once), and the permutation
changes from epoch to epoch."""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

pytestmark = pytest.mark.mpi


@pytest.fixture(autouse=True)
def no_global_seed():
    """These tests are about programs that set no global seed; another test file may have set one
    (keras.utils.set_random_seed), after which TensorFlow's own seeds agree and mpidist stays out."""
    tf.random.set_seed(None)
    yield
ROWS, GLOBAL_BATCH, EPOCHS = 70, 16, 3  # a short last batch of 6


class Recorder(keras.Sequential):
    """Records the row ids (feature 0) of every batch this rank trains on."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen = []

    def train_step(self, data):
        self.seen.append(data[0][:, 0].numpy().astype(np.int64))
        return super().train_step(data)


def global_orders(comm, model):
    """Per epoch, the global order of rows: each step's rank blocks joined in rank order."""
    steps = len(model.seen) // EPOCHS
    everyone = comm.allgather([np.asarray(s) for s in model.seen])
    assert all(len(s) == len(model.seen) for s in everyone)
    orders = []
    for epoch in range(EPOCHS):
        order = [row for step in range(epoch * steps, (epoch + 1) * steps) for rank in everyone for row in rank[step]]
        orders.append(order)
    return orders


def check(orders):
    for order in orders:
        assert sorted(order) == list(range(ROWS)), order  # every row exactly once: disjoint, complete
    assert len({tuple(o) for o in orders}) == EPOCHS, orders  # a new permutation every epoch
    assert orders[0] != list(range(ROWS))


def fit(strategy, x_or_dataset, **kwargs):
    with strategy.scope():
        model = Recorder([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse", run_eagerly=True)
    model.fit(x_or_dataset, epochs=EPOCHS, verbose=0, **kwargs)
    return model


def data():
    x = np.stack([np.arange(ROWS), np.ones(ROWS)], axis=1).astype(np.float32)
    return x, np.zeros((ROWS, 1), np.float32)


def test_fit_shuffle_true_on_arrays(strategy, comm):
    x, y = data()
    model = fit(strategy, x, y=y, batch_size=GLOBAL_BATCH, shuffle=True)
    check(global_orders(comm, model))


def test_dataset_shuffle_without_seed(strategy, comm):
    x, y = data()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(ROWS).batch(GLOBAL_BATCH)
    model = fit(strategy, dataset)
    check(global_orders(comm, model))


def test_node_local_strategy_built_later_keeps_the_global_agreement(strategy, comm):
    """A MirroredStrategy (this node's ranks) built after the fixture's strategy agrees only within
    its node; shuffles under the wider strategy must still agree over all of its ranks."""
    import mpidist
    with mpidist.rc.override(framework="tensorflow"):
        with mpidist.MirroredStrategy() as node_local:
            assert node_local.num_replicas_in_sync <= strategy.num_replicas_in_sync
    x, y = data()
    model = fit(strategy, x, y=y, batch_size=GLOBAL_BATCH, shuffle=True)
    check(global_orders(comm, model))
