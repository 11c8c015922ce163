"""timeout_seconds: a late rank gives DeadlineExceededError on the ranks that waited, then refusal.

The late rank here does arrive (after the deadline) at a collective of one MPI step (agreement
off, flat algorithm), so the abandoned request completes and the job goes on; a late rank in a
collective of several steps would wait in the step the others never issue. tests/launch covers
ranks that never arrive and the job's exit.
"""
from __future__ import annotations

import time

import numpy as np
import pytest

import mpidist
from mpidist.errors import CommunicatorBrokenError, DeadlineExceededError
from late_rank import arrive_late, expiring

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.two_nodes]


@pytest.mark.parametrize("collective", ["allreduce", "allreduce after plain repeats", "broadcast", "barrier"])
def test_late_rank(comm, rc_settings, collective):
    engine = mpidist.Engine(comm)
    rc_settings(check_agreement=False, algorithm="flat")
    late = engine.size - 1
    x = np.ones(4)
    if collective == "allreduce after plain repeats":  # the cached fast path must not swallow a deadline
        for _ in range(3):
            engine.allreduce(x)
        collective = "allreduce"
    run = {"allreduce": lambda **kw: engine.allreduce(x, **kw),
           "broadcast": lambda **kw: engine.broadcast(x, root=late, **kw),  # non-roots wait for the root
           "barrier": lambda **kw: engine.barrier(**kw)}[collective]
    if engine.rank == late:
        arrive_late(comm, late)  # only once every other rank's deadline has passed
        run(timeout_seconds=30)  # completes: the others' abandoned requests are still posted
    else:
        start = time.monotonic()
        with expiring(comm, late):
            with pytest.raises(DeadlineExceededError, match=f"{collective}: not finished within timeout_seconds=0.5"):
                run(timeout_seconds=0.5)
            assert time.monotonic() - start >= 0.5
            with pytest.raises(CommunicatorBrokenError, match="refuses collectives because"):
                engine.allreduce(x)
    comm.Barrier()
    # recovery: a fresh communicator makes the broken engine usable again, on every rank
    fresh = comm.Dup()
    engine.replace_comm(fresh, free_old=False)
    assert engine.broken is None
    assert engine.allreduce(x, timeout_seconds=30).tolist() == [engine.size] * 4
    engine.close()
    fresh.Free()


def test_zero_timeout_means_no_deadline_even_over_rc(comm):
    """0 is "no timeout" (TensorFlow's meaning) in every layer, and wins over rc.timeout_seconds."""
    engine = mpidist.Engine(comm)
    x = np.ones(2)
    with mpidist.rc.override(timeout_seconds=30):
        assert engine.allreduce(x, timeout_seconds=0)[0] == engine.size
        options = mpidist.experimental.CommunicationOptions(timeout_seconds=0).call_options()
        assert engine.allreduce(x, options=options)[0] == engine.size
        # rank 0 says "no deadline", the others inherit rc's 30 s: the agreement sees the difference
        with pytest.raises(mpidist.errors.CollectiveMismatchError, match="rank 0: allreduce.*no deadline"):
            engine.allreduce(x, timeout_seconds=0 if engine.rank == 0 else None)


def test_default_timeout_from_rc(comm):
    engine = mpidist.Engine(comm)
    with mpidist.rc.override(timeout_seconds=30):
        assert engine.allreduce(np.ones(2))[0] == engine.size  # finishes well within the deadline


def test_deadline_on_some_ranks_only_is_a_mismatch_not_a_hang(comm):
    engine = mpidist.Engine(comm)
    timeout = 30 if engine.rank == 0 else None
    with pytest.raises(mpidist.errors.CollectiveMismatchError, match="rank 0: allreduce.*with a deadline"):
        engine.allreduce(np.ones(2), timeout_seconds=timeout)
    assert engine.allreduce(np.ones(2), timeout_seconds=30)[0] == engine.size


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("kind", ["reduce", "broadcast_to", "dataset"])
def test_strategy_paths_honour_rc_timeout_seconds(comm, kind):
    """rc.timeout_seconds reaches the strategy paths that can block, the dataset's step agreement too:
    the ranks that waited raise DeadlineExceededError after the deadline, the late rank's call completes
    (for broadcast_to the late rank is the root, whom every other rank waits for). strategy.gather
    takes two MPI steps (sizes, then the data): a late rank would wait in the second, which the others
    never issue, so its deadline is tested with a rank that never arrives, in a job of its own
    (tests/launch/test_deadline_jobs.py)."""
    late = 0 if kind == "broadcast_to" else comm.Get_size() - 1
    with mpidist.rc.override(framework="numpy"):
        strategy = mpidist.MultiWorkerMirroredStrategy()  # its own engine: the deadline breaks it
    run = {"reduce": lambda: strategy.reduce("SUM", np.ones(3), axis=0),
           "broadcast_to": lambda: strategy.extended.broadcast_to(np.ones(2), destinations=None),
           "dataset": lambda: next(iter(strategy.experimental_distribute_dataset([np.ones((4, 2))] * 3)))}[kind]
    timeout = 30 if comm.Get_rank() == late else 0.5
    with mpidist.rc.override(framework="numpy", check_agreement=False, algorithm="flat", timeout_seconds=timeout):
        if comm.Get_rank() == late:
            arrive_late(comm, late)
            run()  # completes: the others' abandoned requests are still posted
        else:
            start = time.monotonic()
            with expiring(comm, late):
                with pytest.raises(DeadlineExceededError, match="not finished within timeout_seconds=0.5"):
                    run()
                assert time.monotonic() - start >= 0.5
    comm.Barrier()
    strategy.close()
