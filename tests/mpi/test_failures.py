"""An error on any rank is an error on every rank, and the next collective works.

A call that fails on one rank before its data moves (a bad op or root, a value that cannot be
converted, a layer's own check reported through Engine.fail / Engine.guard) must raise on every
rank for that same collective, whichever collective the others are in and whether they speculated,
and the ranks must stay in step: ten good collectives afterwards equal the NumPy reference. No test
here may hang: each bounds its wait.
"""
from __future__ import annotations

import time

import numpy as np
import pytest
from reference import make, reduce_all

import mpidist
from mpidist.errors import CollectiveFailedError, CollectiveMismatchError


class LayerError(ValueError):
    """A layer's own check (a ValueError, so peers raise a ValueError too)."""


def ten_good_ones(engine, comm, seed=0):
    """Ten collectives of several kinds, each equal to its NumPy reference on every rank."""
    size, rank = engine.size, engine.rank
    for i in range(10):
        shape = (7 + i,)
        x = make(rank, np.float32, shape, seed=seed + i)
        inputs = [make(r, np.float32, shape, seed=seed + i) for r in range(size)]
        kind = i % 5
        if kind == 0:
            assert np.array_equal(engine.allreduce(x), reduce_all(inputs, "sum"))
        elif kind == 1:
            assert np.array_equal(engine.broadcast(x, root=size - 1), inputs[size - 1])
        elif kind == 2:
            assert np.array_equal(engine.allgather(x), np.concatenate(inputs))
        elif kind == 3:
            full = reduce_all([np.tile(a, size) for a in inputs], "sum")
            assert np.array_equal(engine.reduce_scatter(np.tile(x, size)), np.array_split(full, size)[rank])
        else:
            got = engine.allreduce([x, x * 2], "max")
            want = reduce_all(inputs, "max")
            assert np.array_equal(got[0], want) and np.array_equal(got[1], want * 2)
    assert engine.broken is None


def bounded(fn):
    start = time.monotonic()
    try:
        return fn()
    finally:
        assert time.monotonic() - start < 60  # never a hang (a failed exchange is one allreduce)


def fails_everywhere(comm, failing, call, own_type, *patterns, peer_type=None):
    """``call()`` raises on every rank: ``own_type`` on the failing ranks, CollectiveFailedError
    (also a ``peer_type``, default ``own_type``) naming the lowest failing rank elsewhere."""
    rank = comm.Get_rank()
    with pytest.raises(Exception) as info:
        bounded(call)
    error = info.value
    if rank in failing:
        assert isinstance(error, own_type) and not isinstance(error, CollectiveFailedError), repr(error)
    else:
        assert isinstance(error, CollectiveFailedError), repr(error)
        assert isinstance(error, peer_type or own_type), repr(error)
        assert error.rank == min(failing) and [r for r, _, _ in error.failures] == sorted(failing)
        assert f"rank {min(failing)} failed before the collective" in str(error)
        for pattern in patterns:
            assert pattern in str(error), str(error)
    return error


# -- every rank fails, then ten good ones ------------------------------------------------------------

@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("call", ["bad op", "bad root", "string array", "scalar scatter", "layer"])
def test_an_error_on_every_rank_then_ten_good_ones(engine, comm, call):
    x = np.ones(4, np.float32)
    calls = {"bad op": (ValueError, lambda: engine.allreduce(x, "median")),
             "bad root": (ValueError, lambda: engine.broadcast(x, root=engine.size)),
             "string array": (TypeError, lambda: engine.allgather(np.array(["a", "b"]))),
             "scalar scatter": (ValueError, lambda: engine.reduce_scatter(np.float32(1))),
             "layer": (LayerError, lambda: engine.fail("alltoall", LayerError("alltoall: bad splits")))}
    own_type, fn = calls[call]
    error = fails_everywhere(comm, set(range(engine.size)), fn, own_type)
    assert not isinstance(error, CollectiveFailedError)  # every rank failed: each raises its own
    ten_good_ones(engine, comm)


# -- one rank fails before MPI, the others are inside the collective --------------------------------

def _one_rank_cases(engine):
    x = np.ones(6, np.float32)
    return {  # name: (failing call, good call of the other ranks, the failing call's error type)
        "allreduce op": (lambda: engine.allreduce(x, "median"), lambda: engine.allreduce(x), ValueError),
        "allreduce value": (lambda: engine.allreduce([x, "x"]), lambda: engine.allreduce([x, x]), TypeError),
        "broadcast root": (lambda: engine.broadcast(x, root=-1), lambda: engine.broadcast(x), ValueError),
        "allgather value": (lambda: engine.allgather(np.array(["s"])), lambda: engine.allgather(x), TypeError),
        "reduce_scatter": (lambda: engine.reduce_scatter(np.float32(2)), lambda: engine.reduce_scatter(x), ValueError),
        "reduce": (lambda: engine.reduce(x, root=engine.size), lambda: engine.reduce(x), ValueError),
        "barrier": (lambda: engine.barrier(timeout_seconds=-1), lambda: engine.barrier(), ValueError),
        "options": (lambda: engine.allreduce(x, num_packs=-1), lambda: engine.allreduce(x), ValueError),
    }


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("case", ["allreduce op", "allreduce value", "broadcast root", "allgather value",
                                  "reduce_scatter", "reduce", "barrier", "options"])
@pytest.mark.parametrize("who", ["first", "last"])
def test_an_error_on_one_rank_before_mpi_is_an_error_on_every_rank(engine, comm, case, who):
    failing = {0 if who == "first" else engine.size - 1}
    bad, good, own_type = _one_rank_cases(engine)[case]
    fails_everywhere(comm, failing, bad if engine.rank in failing else good, own_type, own_type.__name__)
    ten_good_ones(engine, comm)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("path", ["fast", "list", "deadline", "iallreduce"])
def test_an_error_while_the_others_speculate(engine, comm, rc_settings, path):
    """The others repeat the previous allreduce (speculating: their data calls are already posted
    when the failing rank's exchange arrives): the failing rank drains them, all raise, all go on."""
    x = np.ones(3000, np.float32)
    if path == "iallreduce":
        rc_settings(iallreduce_threshold=0)
    calls = {"fast": lambda: engine.allreduce(x), "iallreduce": lambda: engine.allreduce(x),
             "list": lambda: engine.allreduce([x, x[:5]]),
             "deadline": lambda: engine.allreduce(x, timeout_seconds=60)}
    for _ in range(3):  # the steady state
        calls[path]()
    failing = {engine.size - 1}
    bad = lambda: engine.allreduce(x, "median")
    fails_everywhere(comm, failing, bad if engine.rank in failing else calls[path], ValueError, "median")
    ten_good_ones(engine, comm)
    for _ in range(3):  # and speculating again afterwards, still right
        got = calls[path]()
        got = got[0] if isinstance(got, list) else got
        assert np.array_equal(got, np.full(3000, engine.size, np.float32))


@pytest.mark.mpi(min_size=2)
def test_several_ranks_fail_with_different_errors(engine, comm):
    """Each failing rank raises its own; the others name the lowest failing rank, of its type."""
    x = np.ones(2, np.float32)
    failing = {0, engine.size - 1}
    if engine.rank == 0:
        bad = lambda: engine.allreduce(x, "median")
    else:
        bad = lambda: engine.allreduce(object())
    with pytest.raises((ValueError, TypeError)) as info:
        bounded(bad if engine.rank in failing else (lambda: engine.allreduce(x)))
    error = info.value
    if engine.rank in failing:
        assert not isinstance(error, CollectiveFailedError)
    else:
        assert isinstance(error, CollectiveFailedError) and isinstance(error, ValueError)
        assert [r for r, _, _ in error.failures] == sorted(failing) and error.failures[1][1] == "TypeError"
    ten_good_ones(engine, comm)


# -- a layer above the engine reports its own checks --------------------------------------------------

@pytest.mark.mpi(min_size=2)
def test_a_layer_check_through_guard_is_an_error_on_every_rank(engine, comm):
    """A layer's collective: a check, then its engine call. The check fails on one rank only."""
    def layer_allgather(rows):
        with engine.guard("my_allgather"):
            if rows.shape[0] > 3:
                raise LayerError(f"my_allgather: at most 3 rows, got {rows.shape[0]}")
            return engine.allgather(rows)

    rows = np.ones((5 if engine.rank == 1 else 2, 2), np.float32)
    fails_everywhere(comm, {1}, lambda: layer_allgather(rows), LayerError, "LayerError: my_allgather: at most 3 rows",
                     peer_type=ValueError)  # LayerError is not a built-in: its nearest built-in base
    # an error raised by the engine itself passes the guard unchanged (already on every rank)
    mismatched = np.ones((2, 3 if engine.rank == 0 else 2), np.float32)
    with pytest.raises(CollectiveMismatchError):
        bounded(lambda: layer_allgather(mismatched))
    got = layer_allgather(np.full((2, 2), engine.rank, np.float32))
    assert np.array_equal(got, np.repeat(np.arange(engine.size, dtype=np.float32), 4).reshape(-1, 2))
    ten_good_ones(engine, comm)


@pytest.mark.mpi(min_size=2)
def test_an_error_after_the_collective_is_not_reported_again(engine, comm):
    """The guard passes an error raised after the engine call (the data moved on every rank: the
    ranks are in step) without another exchange, so the next collectives still match."""
    def layer(value):
        with engine.guard("my_allreduce"):
            out = engine.allreduce(value)
            if engine.rank == 0:
                raise LayerError("my_allreduce: the result did not convert")
            return out

    if engine.rank == 0:
        with pytest.raises(LayerError):
            bounded(lambda: layer(np.ones(3)))
    else:
        assert layer(np.ones(3))[0] == engine.size
    ten_good_ones(engine, comm)


@pytest.mark.mpi(min_size=2)
def test_a_failure_meets_another_collective_in_a_strategy(comm):
    """Through a strategy: one rank's reduce fails (a string value), the other ranks' reduce raises
    too, and the strategy's next reductions are right."""
    with mpidist.rc.override(framework="numpy"):
        strategy = mpidist.MultiWorkerMirroredStrategy()
    try:
        x = np.arange(4, dtype=np.float64)
        value = "four" if comm.Get_rank() == 0 else x
        with pytest.raises(TypeError):
            bounded(lambda: strategy.reduce("sum", value, axis=None))
        for _ in range(3):
            assert np.array_equal(strategy.reduce("sum", x, axis=None), x * comm.Get_size())
    finally:
        strategy.close()


@pytest.mark.mpi(min_size=1)
def test_without_agreement_a_failure_is_only_local(engine, rc_settings):
    """With rc.check_agreement off there is no exchange to meet: the error is raised here only."""
    rc_settings(check_agreement=False)
    with pytest.raises(ValueError):
        engine.allreduce(np.ones(2), "median")
    assert engine.allreduce(np.ones(2))[0] == engine.size
