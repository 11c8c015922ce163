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


@pytest.fixture
def usr1_restored():
    import signal
    old = signal.getsignal(signal.SIGUSR1), signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGUSR1, old[0])
    signal.signal(signal.SIGTERM, old[1])


def test_preemption_writes_the_commit_exits_0_and_resumes(strategy, tmp_path, usr1_restored):
    import os
    import signal
    path = str(tmp_path / "ckpt.pkl")
    state = mpidist.elastic.ObjectState(strategy, step=0, w=np.zeros(2))
    preemption = mpidist.elastic.on_preemption(state, path)
    assert not preemption.resumed
    state.step, state.w = 1, np.ones(2)
    state.commit()  # no signal: goes on, no file
    assert not os.path.exists(path)
    os.kill(os.getpid(), signal.SIGUSR1)
    state.step, state.w = 2, np.full(2, 2.0)
    with pytest.raises(SystemExit) as exc:
        state.commit()
    assert exc.value.code == 0
    snapshot = mpidist.elastic.read_checkpoint(path)
    assert snapshot["step"] == 2
    np.testing.assert_array_equal(snapshot["w"], [2.0, 2.0])
    again = mpidist.elastic.ObjectState(strategy, step=0, w=np.zeros(2))
    assert mpidist.elastic.on_preemption(again, path).resumed and again.step == 2
    again.step = 5
    again.restore()  # the loaded checkpoint is the commit
    assert again.step == 2


def test_preemption_rejects_other_files_and_states(strategy, tmp_path, usr1_restored):
    bad = tmp_path / "other.pkl"
    import pickle
    bad.write_bytes(pickle.dumps({"step": 1}))
    with pytest.raises(ValueError, match="read_checkpoint: `path`"):
        mpidist.elastic.read_checkpoint(str(bad))
    with pytest.raises(TypeError, match="on_preemption: `state`"):
        mpidist.elastic.on_preemption(object(), str(bad))
