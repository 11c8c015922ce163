"""Asynchronous collectives (collectives/progress.py) and gradient buckets (mpidist/overlap.py)
against the blocking engine and NumPy references over all ranks' inputs."""
from __future__ import annotations

import threading

import numpy as np
import pytest
from reference import DTYPES, assert_same, make, reduce_all

import mpidist
from mpidist.collectives import progress
from mpidist.errors import CollectiveMismatchError, CommunicatorBrokenError
from mpidist.overlap import GradientBuckets

pytestmark = pytest.mark.mpi


def _nest(rank, op, seed=0):
    return {"w": make(rank, np.float32, (33, 5), op, seed), "b": [make(rank, np.int64, (7,), op, seed + 1),
                                                                  make(rank, np.float16, (), op, seed + 2)]}


def _check_nest(result, size, op, seed=0):
    expected = [_nest(r, op, seed) for r in range(size)]
    assert_same(result["w"], reduce_all([e["w"] for e in expected], op))
    for k in range(2):
        assert_same(result["b"][k], reduce_all([e["b"][k] for e in expected], op))


@pytest.mark.parametrize("op", ["sum", "mean", "max", "prod"])
def test_async_equals_blocking_and_reference(eng, op):
    value = _nest(eng.rank, op)
    pending = eng.allreduce_async(value, op)
    result = pending.wait()
    assert pending.done()
    _check_nest(result, eng.size, op)
    blocking = eng.allreduce(value, op)
    for a, b in zip([result["w"]] + result["b"], [blocking["w"]] + blocking["b"]):
        assert a.tobytes() == b.tobytes()


@pytest.mark.node_layout  # algorithm=hierarchical
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_every_dtype_one_array_and_options(eng, dtype):
    op = "sum"
    inputs = [make(r, dtype, (1000,), op) for r in range(eng.size)]
    plain = eng.allreduce_async(inputs[eng.rank], op)
    packed = eng.allreduce_async([inputs[eng.rank], inputs[eng.rank][:3]], op, bytes_per_pack=64,
                                 algorithm="hierarchical", timeout_seconds=60)
    expected = reduce_all(inputs, op)
    assert_same(plain.wait(), expected)
    got = packed.wait()
    assert_same(got[0], expected)
    assert_same(got[1], expected[:3])


def test_many_in_flight_mixed_with_blocking_keep_program_order(eng):
    """Twenty collectives of different shapes in flight, blocking ones between them: any rank
    running them in another order would fail the agreement (a mismatch); a blocking collective
    returns only after every earlier asynchronous one is done."""
    size, rank = eng.size, eng.rank
    started = []
    for k in range(20):
        started.append((k, eng.allreduce_async(make(rank, np.float64, (k + 1, 3), seed=k))))
        if k % 5 == 4:
            blocking = eng.allreduce(make(rank, np.int32, (k,), seed=100 + k))
            assert all(p.done() for _, p in started)
            assert_same(blocking, reduce_all([make(r, np.int32, (k,), seed=100 + k) for r in range(size)], "sum"))
            got = eng.broadcast(np.full(2, rank, np.int16), root=size - 1)
            assert_same(got, np.full(2, size - 1, np.int16))
            started.append((-1, eng.allreduce_async(np.full(4, rank + 1, np.int8), "max")))
    for k, p in started:
        if k < 0:
            assert_same(p.wait(), np.full(4, size, np.int8))
        else:
            inputs = [make(r, np.float64, (k + 1, 3), seed=k) for r in range(size)]
            assert_same(p.wait(), reduce_all(inputs, "sum"))
    gathered = eng.allgather(np.arange(rank + 1))
    assert_same(gathered, np.concatenate([np.arange(r + 1) for r in range(size)]))


def test_a_mismatch_raises_on_every_rank_at_wait_and_the_queue_goes_on(eng, comm):
    if eng.size < 2:
        pytest.skip("a mismatch needs two ranks")
    before = eng.allreduce_async(np.ones(2))
    bad = eng.allreduce_async(np.ones(3 if eng.rank == 0 else 4))
    after = eng.allreduce_async(np.ones(5))
    assert_same(before.wait(), np.full(2, float(eng.size)))
    with pytest.raises(CollectiveMismatchError, match="allreduce"):
        bad.wait()
    with pytest.raises(CollectiveMismatchError):  # the same error again, not a hang
        bad.wait()
    assert_same(after.wait(), np.full(5, float(eng.size)))
    assert eng.broken is None


def test_bad_arguments_raise_at_the_call(eng):
    with pytest.raises(ValueError, match="allreduce_async"):
        eng.allreduce_async(np.ones(2), "median")
    with pytest.raises(ValueError, match="allreduce_async: `bytes_per_pack` must be an integer >= 0, got -1"):
        eng.allreduce_async(np.ones(2), bytes_per_pack=-1)
    with pytest.raises(TypeError, match="allreduce_async: `options` must be a CallOptions or None"):
        eng.allreduce_async(np.ones(2), options=3)
    pending = eng.allreduce_async(np.ones(2))
    with pytest.raises(ValueError, match=r"Pending.wait: `timeout` must be None or a number >= 0, got -1"):
        pending.wait(timeout=-1)
    assert_same(pending.wait(timeout=600), np.full(2, float(eng.size)))


def test_an_error_of_a_leaf_raises_at_wait(eng):
    pending = eng.allreduce_async({"a": np.ones(2, np.complex64)}, "max")
    with pytest.raises(TypeError, match="allreduce: leaf 0 of `value` has dtype complex64"):
        pending.wait()


def test_wait_with_a_timeout_while_the_worker_is_busy(eng):
    """The worker is held by a local item (no MPI) until the test lets it go: a wait with timeout
    0 sees the collective not done, without timing assumptions."""
    release = threading.Event()
    held = progress.worker(eng.pipeline).submit(release.wait, "a held item")
    pending = eng.allreduce_async(np.ones(3))
    with pytest.raises(TimeoutError, match="Pending.wait: allreduce has not finished after 0 s"):
        pending.wait(timeout=0)
    assert not pending.done() and "running" in repr(pending)
    release.set()
    assert held.wait() is True
    assert_same(pending.wait(), np.full(3, float(eng.size)))


def test_close_runs_what_is_queued_then_refuses(comm):
    engine = mpidist.Engine(comm)
    rank, size = engine.rank, engine.size
    started = [engine.allreduce_async(make(rank, np.float32, (k + 2,), seed=k)) for k in range(6)]
    worker = engine.pipeline.progress
    engine.close()
    assert not worker.alive
    for k, p in enumerate(started):
        assert_same(p.wait(), reduce_all([make(r, np.float32, (k + 2,), seed=k) for r in range(size)], "sum"))
    with pytest.raises(CommunicatorBrokenError, match="allreduce_async"):
        engine.allreduce_async(np.ones(1))


def test_replace_comm_finishes_pending_work_on_the_old_communicator(comm):
    engine = mpidist.Engine(comm)
    rank, size = engine.rank, engine.size
    started = [engine.allreduce_async(np.full(k + 1, rank + 1.0)) for k in range(5)]
    old = engine.pipeline
    engine.replace_comm(comm)
    assert not old.progress.alive and old.broken is not None
    for k, p in enumerate(started):
        assert_same(p.wait(), np.full(k + 1, size * (size + 1) / 2))
    assert_same(engine.allreduce_async(np.full(2, rank + 1.0)).wait(), np.full(2, size * (size + 1) / 2))
    assert engine.pipeline.progress.alive
    engine.close()


def test_without_thread_multiple_it_runs_at_the_call(eng, monkeypatch):
    monkeypatch.setattr(progress, "threads_supported", lambda: False)
    pending = eng.allreduce_async(np.full(3, eng.rank + 1.0), "mean")
    assert pending.done()
    assert_same(pending.wait(), np.full(3, (eng.size + 1) / 2))


# -- gradient buckets --------------------------------------------------------------------------------

SHAPES = [(40, 30), (30,), (30, 20), (20,), (20, 10), (10,), (1000,), (3,)]


def _grads(rank, step, dtype=np.float32):
    """Integer-valued gradients: exact sums whatever the order MPI adds them in."""
    return [make(rank, dtype, s, seed=step * 100 + i) for i, s in enumerate(SHAPES)]


@pytest.mark.parametrize("op", ["sum", "mean"])
def test_buckets_equal_one_allreduce_bit_for_bit(eng, op):
    like = [np.zeros(s, np.float32) for s in SHAPES]
    buckets = GradientBuckets(like, op, engine=eng, options=mpidist.experimental.CommunicationOptions(
        bytes_per_pack=2000))
    assert buckets.bucket_bytes == 2000 and len(buckets.plan) > 2
    assert buckets.plan == mpidist.collectives.packing.backprop_buckets(
        [a.nbytes for a in like], 2000)
    for step in range(3):
        grads = _grads(eng.rank, step)
        for i in reversed(range(len(grads))):
            buckets.add(i, grads[i])
        got = buckets.result()
        whole = eng.allreduce(grads, op)
        for i, (g, w) in enumerate(zip(got, whole)):
            assert g.tobytes() == w.tobytes(), i
            assert_same(g, reduce_all([_grads(r, step)[i] for r in range(eng.size)], op))


def test_buckets_through_the_current_strategy_any_order(comm):
    with mpidist.rc.override(framework="numpy"), mpidist.MultiWorkerMirroredStrategy() as strategy:
        rank, size = strategy.extended.rank, strategy.num_replicas_in_sync
        like = [np.zeros(s, np.float64) for s in SHAPES]

        def step(order, k):
            buckets = GradientBuckets(like, mpidist.ReduceOp.MEAN)
            assert buckets.bucket_bytes == mpidist.collectives.packing.FUSION_BYTES and len(buckets.plan) == 1  # default
            grads = _grads(rank, k, np.float64)
            for i in order:
                buckets.add(i, grads[i])
            return buckets.result(), grads

        for k, order in enumerate([reversed(range(len(SHAPES))), range(len(SHAPES))]):
            got, grads = strategy.run(step, args=(list(order), k))
            reduced = strategy.reduce("mean", grads, axis=None)
            for g, w, i in zip(got, reduced, range(len(SHAPES))):
                assert g.tobytes() == w.tobytes()
                assert_same(g, reduce_all([_grads(r, k, np.float64)[i] for r in range(size)], "mean"))


def test_buckets_start_in_plan_order_whatever_order_gradients_come(eng, rc_settings):
    rc_settings(bytes_per_pack=1500)  # rc's bucket size when the options give none
    like = [np.zeros(s, np.float32) for s in SHAPES]
    buckets = GradientBuckets(like, "sum", engine=eng)
    assert buckets.bucket_bytes == 1500 and len(buckets.plan) >= 3
    grads = _grads(eng.rank, 7)
    for i in range(len(grads)):  # forward order: the first bucket (the last variables) completes last
        buckets.add(i, grads[i])
    got = buckets.result()
    for i, g in enumerate(got):
        assert_same(g, reduce_all([_grads(r, 7)[i] for r in range(eng.size)], "sum"))


def test_bucket_errors(eng):
    like = [np.zeros((2, 3), np.float32), np.zeros(4, np.float64)]
    with pytest.raises(ValueError, match="GradientBuckets: `like` must be a non-empty list or tuple"):
        GradientBuckets([], engine=eng)
    with pytest.raises(TypeError, match=r"GradientBuckets: `like\[1\]` must be an array"):
        GradientBuckets([like[0], 3.0], engine=eng)
    with pytest.raises(ValueError, match="GradientBuckets"):
        GradientBuckets(like, "median", engine=eng)
    with pytest.raises(TypeError, match="GradientBuckets: `engine` must be an mpidist.Engine, got str"):
        GradientBuckets(like, engine="e")
    with pytest.raises(ValueError, match="GradientBuckets: give `strategy` or `engine`, not both"):
        GradientBuckets(like, strategy=object(), engine=eng)
    with pytest.raises(TypeError, match="GradientBuckets: `strategy` must be an mpidist strategy in NumPy mode"):
        GradientBuckets(like, strategy=object())
    buckets = GradientBuckets(like, engine=eng)
    with pytest.raises(ValueError, match=r"GradientBuckets.add: `index` must be in \[0, 2\) \(one per variable "
                                         r"of `like`\), got 2"):
        buckets.add(2, like[0])
    with pytest.raises(TypeError, match="GradientBuckets.add: `index` must be an int, got str"):
        buckets.add("0", like[0])
    with pytest.raises(ValueError, match=r"GradientBuckets.add: `grad` of variable 1 must have shape \(4,\) and "
                                         r"dtype float64 \(as `like\[1\]`\), got \(4,\) float32"):
        buckets.add(1, np.zeros(4, np.float32))
    with pytest.raises(TypeError, match="GradientBuckets.add: `grad` must be an array, got list"):
        buckets.add(1, [0, 0, 0, 0])
    buckets.add(1, np.ones(4))
    with pytest.raises(ValueError, match="GradientBuckets.add: the gradient of variable 1 was already added"):
        buckets.add(1, np.ones(4))
    with pytest.raises(ValueError, match=r"GradientBuckets.result: 1 of the 2 gradients were not added in this "
                                         r"step \(variables 0\)"):
        buckets.result()
    # the step was ended: a full one works (all buckets complete, so every rank ran the same collectives)
    buckets.add(-1, np.ones(4))
    buckets.add(0, np.ones((2, 3), np.float32))
    got = buckets.result()
    assert_same(got[0], np.full((2, 3), eng.size, np.float32))
    assert_same(got[1], np.full(4, float(eng.size)))


def test_buckets_on_a_closed_strategy_raise():
    with mpidist.rc.override(framework="numpy"):
        strategy = mpidist.MultiWorkerMirroredStrategy()
    strategy.close()
    with pytest.raises(RuntimeError, match="GradientBuckets: the strategy was closed"):
        GradientBuckets([np.zeros(2)], strategy=strategy)
