"""``strategy.run``'s arguments (one process): distributed values become this rank's components
wherever they are in ``args`` and ``kwargs``, and an argument that is a flat list of host arrays
(a gradient list, ``args=(grads,)``) is handed over without a walk over its leaves (issue 33's
per-tensor cost: the argument tuple around it made it a nest of nests, flattened every call)."""
from __future__ import annotations

import numpy as np
import pytest

import mpidist
from mpidist.collectives import nest
from mpidist.values import PerReplica


@pytest.fixture(scope="module")
def strategy():
    with mpidist.rc.override(framework="numpy"):
        s = mpidist.MultiWorkerMirroredStrategy()
    yield s
    s.extended.engine.close()


def test_distributed_values_in_args_and_kwargs_become_local(strategy):
    a, b = np.arange(3.0), np.ones(2)
    got = strategy.run(lambda x, pair, scale=None, extra=None: (x, pair, scale, extra),
                       args=(PerReplica(a), [PerReplica(b), 2]), kwargs={"scale": PerReplica(3.0), "extra": {"k": [a]}})
    x, pair, scale, extra = got
    assert x is a and pair[0] is b and pair[1] == 2 and scale == 3.0 and extra["k"][0] is a
    assert strategy.run(lambda: 7) == 7 and strategy.run(lambda *xs: xs, args=[1, 2]) == (1, 2)


def test_a_flat_list_of_arrays_is_not_walked_leaf_by_leaf(strategy, monkeypatch):
    grads = [np.full(4, i, np.float32) for i in range(100)]

    def replica(gs, more=None):
        assert gs is grads and more is grads
        return mpidist.get_replica_context().all_reduce("sum", gs)
    strategy.run(replica, args=(grads,), kwargs={"more": grads})  # the engine's first call: general path
    walked = []
    original = nest.flatten
    monkeypatch.setattr(nest, "flatten", lambda value: walked.append(value) or original(value))
    out = strategy.run(replica, args=(grads,), kwargs={"more": grads})
    assert walked == []  # neither run's arguments nor the engine's cached call walk the list
    for i, r in enumerate(out):
        np.testing.assert_array_equal(r, grads[i] * strategy.num_replicas_in_sync)
