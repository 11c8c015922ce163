"""mpidist.checkpoint (NumPy state) saved the ways programs save: every rank to one path, every rank
to a path of its own, or the chief alone; one writer per path, restores equal everywhere, errors
of the chief's write raised on every rank that saves its path, never a hang."""
from __future__ import annotations

import os

import numpy as np
import pytest

import mpidist
from mpidist import checkpoint
from reference import same_everywhere

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def strategy():
    with mpidist.rc.override(framework="numpy"):
        return mpidist.MultiWorkerMirroredStrategy()


def state(version: int) -> dict:
    rng = np.random.default_rng(version)
    return {"w": rng.normal(size=(4, 3)), "step": np.int64(version)}


def restored_equal(strategy, comm, path, version):
    got = checkpoint.restore(path, state(0), strategy)
    np.testing.assert_array_equal(got["w"], state(version)["w"])
    assert same_everywhere(comm, int(got["step"])) == version


def test_every_rank_saves_one_path(strategy, comm, shared_dir):
    path = os.path.join(shared_dir, "state.npz")
    for version in (1, 2, 3):
        checkpoint.save(state(version), path, strategy)
        assert os.path.exists(path)  # complete when save returns, on every rank
        restored_equal(strategy, comm, path, version)
    assert same_everywhere(comm, sorted(os.listdir(shared_dir))) == ["state.npz"]


def test_chief_alone_saves(strategy, comm, shared_dir):
    path = os.path.join(shared_dir, "chief.npz")
    for version in (1, 2):
        if comm.Get_rank() == 0:
            checkpoint.save(state(version), path, strategy)
        strategy.reduce("SUM", np.ones(1), axis=None)  # the program goes on: nothing waits for the save
    restored_equal(strategy, comm, path, 2)
    checkpoint.save(state(3), path, strategy)  # then every rank saves the same path: still one writer
    restored_equal(strategy, comm, path, 3)


def test_every_rank_saves_a_path_of_its_own(strategy, comm, shared_dir):
    own = os.path.join(shared_dir, f"own-{comm.Get_rank()}.npz")
    checkpoint.save(state(comm.Get_rank() + 1), own, strategy)
    with np.load(own) as data:
        assert int(data["leaf_000000"]) == comm.Get_rank() + 1  # the leaves in order: step, w
    comm.Barrier()  # each rank wrote its own file, without waiting for the others
    assert same_everywhere(comm, len(os.listdir(shared_dir))) == comm.Get_size()


def test_chief_write_error_is_raised_on_every_rank_that_saves_its_path(strategy, comm, shared_dir):
    blocker = os.path.join(shared_dir, "a-file")
    if comm.Get_rank() == 0:
        open(blocker, "w").close()
    comm.Barrier()
    with pytest.raises(OSError, match="could not write"):
        checkpoint.save(state(1), os.path.join(blocker, "state.npz"), strategy)


def test_save_by_the_other_ranks_alone_is_an_error_on_every_rank(strategy, comm, shared_dir):
    """Ranks other than the chief saving alone wait for a chief's save that never comes, while the
    chief goes on into a collective they cannot join: within seconds they raise DeadlockError naming
    the rule and where the chief is, the chief's collective raises with their message, nothing is
    written, and the job goes on in step."""
    if comm.Get_size() == 1:
        pytest.skip("needs a rank other than the chief")
    path = os.path.join(shared_dir, "others.npz")
    with pytest.raises(mpidist.errors.MpidistError) as info:
        if comm.Get_rank() != 0:
            checkpoint.save(state(1), path, strategy)
        else:
            strategy.reduce("SUM", np.ones(1), axis=None)
    text = str(info.value)
    assert "rank 0 went on without making this save" in text and "not the other ranks alone" in text, text
    assert isinstance(info.value, mpidist.errors.CollectiveFailedError if comm.Get_rank() == 0
                      else mpidist.errors.DeadlockError), text
    if comm.Get_rank() != 0:
        assert "rank 0 is inside allreduce #" in text and "test_checkpoint_numpy.py:" in text, text
    comm.Barrier()
    assert not os.path.exists(path)
    total = strategy.reduce("SUM", np.ones(1), axis=None)
    assert float(np.asarray(total).ravel()[0]) == comm.Get_size()
    checkpoint.save(state(2), path, strategy)  # then every rank saves: the chief writes, as before
    restored_equal(strategy, comm, path, 2)


def test_restore_errors_are_raised_on_every_rank(strategy, comm, shared_dir):
    """A checkpoint that cannot be read is an error on every rank, not the chief's alone; the job goes
    on in step."""
    with pytest.raises(OSError, match="checkpoint.restore: could not read"):
        checkpoint.restore(os.path.join(shared_dir, "missing.npz"), state(0), strategy)
    total = strategy.reduce("SUM", np.ones(1), axis=None)
    assert float(np.asarray(total).ravel()[0]) == comm.Get_size()
