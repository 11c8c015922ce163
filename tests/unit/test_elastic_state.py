"""mpidist.elastic states on one process: commit, restore, sync and attributes set later."""
import numpy as np
import pytest

import mpidist


@pytest.fixture
def strategy():
    with mpidist.MultiWorkerMirroredStrategy() as s:
        yield s


def test_commit_restore_keeps_attributes_set_later(strategy):
    state = mpidist.elastic.ObjectState(strategy, step=0, w=np.zeros(3))
    state.extra = [1]
    state.commit()
    state.step, state.w, state.extra = 5, state.w + 1, [2]
    state.w[0] = 9  # in place, after the commit: the commit is a copy
    state.late = "gone"
    state.restore()
    assert state.step == 0 and state.extra == [1] and not hasattr(state, "late")
    np.testing.assert_array_equal(state.w, np.zeros(3))


def test_sync_makes_the_current_state_the_commit_before_any_commit(strategy):
    state = mpidist.elastic.ObjectState(strategy, step=3)
    state.sync()
    state.step = 7
    state.restore()
    assert state.step == 3


def test_run_without_ulfm_calls_once_and_returns(strategy, monkeypatch):
    monkeypatch.delenv("OMPI_MCA_mpi_ft_enable", raising=False)
    state = mpidist.elastic.ObjectState(strategy, step=0)
    calls = []

    @mpidist.elastic.run
    def train(state, steps):
        calls.append(state.step)
        while state.step < steps:
            state.step += 1
            state.commit()
        return "done"

    assert train(state, 4) == "done" and calls == [0] and state.step == 4
    assert mpidist.elastic.ulfm_status()[0] is False


def test_errors_name_the_argument(strategy):
    with pytest.raises(TypeError, match="`strategy` must be an mpidist strategy"):
        mpidist.elastic.ObjectState(object())
    with pytest.raises(TypeError, match="first argument of _train must be an mpidist.elastic State"):
        mpidist.elastic.run(_train)(42)
    with pytest.raises(TypeError, match="`func` must be callable"):
        mpidist.elastic.run(3)


def _train(state):
    return state
