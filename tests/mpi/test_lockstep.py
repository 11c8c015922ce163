"""LockstepMax (mpidist/collectives/lockstep.py): a notice raised on any rank, at any step, is learned
by every rank at the same step, one step after the step it was posted at; NumPy only."""
from __future__ import annotations

import time

import numpy as np
import pytest
from mpi4py import MPI

from mpidist.collectives.lockstep import LockstepMax
from reference import same_everywhere

pytestmark = pytest.mark.mpi


def first_notice(comm, raise_at: dict[int, int], steps: int = 12, skew: float = 0.0, width: int = 1,
                 persistent: bool = True):
    """Run ``steps`` steps: rank r posts rank + 1 from step ``raise_at[r]`` on (0 before). Returns
    (the step at which this rank first collected a non-zero value, that value)."""
    vote = LockstepMax(comm, width=width, persistent=persistent)
    if not persistent:
        assert not vote.persistent
    rank = comm.Get_rank()
    found = (None, None)
    for step in range(steps):
        got = vote.collect()
        if found[0] is None and any(got):
            found = (step, got)
        if skew:  # ranks reach the step at different times (rank r later by r * skew)
            time.sleep(skew * rank)
        mine = rank + 1 if step >= raise_at.get(rank, steps) else 0
        vote.post(*([mine] * width))
        comm.Allreduce(MPI.IN_PLACE, np.zeros(4), op=MPI.SUM)  # the step's own collective
    assert vote.finish(timeout=30)
    vote.close()
    return found


@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "iallreduce"])
@pytest.mark.parametrize("skew", [0.0, 0.003])
def test_a_notice_on_the_last_rank_is_seen_everywhere_one_step_later(comm, skew, persistent):
    size = comm.Get_size()
    step, value = first_notice(comm, {size - 1: 3}, skew=skew, persistent=persistent)
    assert same_everywhere(comm, (step, value)) == (4, (size,))


def test_the_earliest_notice_wins_and_names_the_highest_rank_that_had_it(comm):
    size = comm.Get_size()
    raise_at = {0: 5, size - 1: 2} if size > 1 else {0: 2}
    raise_at.update({r: 2 for r in range(1, size - 1)})  # the middle ranks too, at the same step
    step, value = first_notice(comm, raise_at, width=2)
    assert same_everywhere(comm, (step, value)) == (3, (size, size))


def test_no_notice_no_value(comm):
    assert same_everywhere(comm, first_notice(comm, {})) == (None, None)


def test_a_notice_at_the_first_step_and_at_the_last(comm):
    size = comm.Get_size()
    assert same_everywhere(comm, first_notice(comm, {0: 0})) == (1, (1,))
    # posted at the last step: nobody collects it; finish() completes it on every rank
    assert same_everywhere(comm, first_notice(comm, {size - 1: 11})) == (None, None)


def test_collect_without_post_and_misuse(comm):
    vote = LockstepMax(comm, width=2)
    assert vote.collect() == (0, 0) and not vote.pending
    with pytest.raises(ValueError, match=r"post\(\) takes 2 value\(s\), got 1"):
        vote.post(1)
    vote.post(0, comm.Get_rank())
    assert vote.pending
    with pytest.raises(RuntimeError, match="post\\(\\) called twice without collect\\(\\)"):
        vote.post(0, 0)
    assert same_everywhere(comm, vote.collect()) == (0, comm.Get_size() - 1)
    assert vote.posted == 1 and vote.finish()
    with pytest.raises(ValueError, match="`width` must be an int >= 1, got 0"):
        LockstepMax(comm, width=0)
    with pytest.raises(TypeError, match="`comm` must be an mpi4py intracommunicator, got str"):
        LockstepMax("world")  # type: ignore[arg-type]
    vote.close()
    vote.close()  # a second close does nothing
    assert vote.comm == MPI.COMM_NULL
