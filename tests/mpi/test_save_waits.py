"""A save that the other ranks follow (every rank saves one path; the chief writes) never leaves them
waiting silently: a chief stuck in a collective inside its save, or stuck elsewhere past
``rc.timeout_seconds``, makes every rank raise an error that names who waited for whom and where the
chief is; the ranks then go on in step."""
from __future__ import annotations

import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import mpidist  # noqa: E402

pytestmark = pytest.mark.mpi
THIS_FILE = os.path.basename(__file__)


class Planted(keras.layers.Layer):
    """A layer whose saving code runs ``stuck()`` on the chief (a bug planted for these tests)."""

    def __init__(self, stuck, rank):
        super().__init__()
        self.stuck, self.rank = stuck, rank

    def call(self, x):
        return x

    def save_own_variables(self, store):
        if self.rank == 0:
            self.stuck()


def planted_model(strategy, stuck, rank):
    with strategy.scope():
        return keras.Sequential([keras.Input((3,)), Planted(stuck, rank), keras.layers.Dense(2)])


def still_in_step(strategy, comm):
    """Every rank's next collective meets the others' (nothing left half done)."""
    total = strategy.reduce("SUM", tf.constant(float(comm.Get_rank() + 1)), axis=None)
    assert float(total) == comm.Get_size() * (comm.Get_size() + 1) / 2


def test_a_chief_stuck_in_a_collective_inside_its_save_is_an_error_on_every_rank(strategy, comm, shared_dir):
    """The chief makes a collective inside the save that the others follow (they can never join
    it): the others raise DeadlockError naming rank 0's collective and its code within seconds (far
    before rc.stall_seconds, 60 s), and the chief's collective raises with their message."""
    if comm.Get_size() == 1:
        pytest.skip("one rank: nobody follows the chief")
    model = planted_model(strategy, lambda: strategy.reduce("SUM", tf.constant(1.0), axis=None), comm.Get_rank())
    start = time.monotonic()
    with pytest.raises(mpidist.errors.MpidistError) as info:  # every rank: model.save_weights of one path
        model.save_weights(os.path.join(shared_dir, "m.weights.h5"))
    took = comm.allgather(time.monotonic() - start)
    text = str(info.value)
    if comm.Get_rank() == 0:
        assert isinstance(info.value, mpidist.errors.CollectiveFailedError), text
        assert "DeadlockError" in text, text
    else:
        assert isinstance(info.value, mpidist.errors.DeadlockError), text
        assert f"rank {comm.Get_rank()} waited" in text and "rank 0 is inside allreduce #" in text, text
        assert f"{THIS_FILE}:" in text and "(<lambda>)" in text, text  # the chief's code, in this file
        assert "m.weights.h5" in text, text
    assert max(took) < 30, took
    still_in_step(strategy, comm)


def test_a_chief_stuck_elsewhere_is_an_error_after_timeout_seconds(strategy, comm, shared_dir, rc_settings):
    """The chief waits inside its save for something outside mpidist (an MPI barrier of its own
    communicator): the others raise DeadlineExceededError at rc.timeout_seconds naming where the
    chief is, and tell it; once released, the chief's save raises too."""
    if comm.Get_size() == 1:
        pytest.skip("one rank: nobody follows the chief")
    limit = 2.0
    rc_settings(timeout_seconds=limit)
    other = comm.Dup()
    try:
        model = planted_model(strategy, other.Barrier, comm.Get_rank())
        start = time.monotonic()
        with pytest.raises(mpidist.errors.DeadlineExceededError) as info:
            try:
                model.save_weights(os.path.join(shared_dir, "m.weights.h5"))
            finally:
                if comm.Get_rank() != 0:
                    waited = time.monotonic() - start
                    other.Barrier()  # releases the chief
        text = str(info.value)
        if comm.Get_rank() == 0:
            assert "had stopped waiting for it" in text, text
        else:
            assert limit <= waited < limit + 15, waited
            assert f"rank {comm.Get_rank()} has waited" in text and "rank 0 is at " in text, text
            assert f"{THIS_FILE}:" in text and "(save_own_variables)" in text, text
            assert "rc.timeout_seconds=2" in text, text
    finally:
        other.Free()
    still_in_step(strategy, comm)

