"""tf.distribute.experimental.PreemptionCheckpointHandler under mpidist strategies
(mpidist/tensorflow/preemption.py): a SIGTERM (or a watcher) on ONE rank makes every rank save once
at the same run count and call exit_fn; a new handler on the directory restores that run count;
errors on one rank are errors on every rank; TensorFlow's own class runs where mpidist is not in use.

The "signal" is a real SIGTERM this process sends itself on one rank (``os.kill``), caught by the
handler's signal handler; exit_fn records the run count and returns, so the test goes on.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import mpidist  # noqa: E402
from mpidist.tensorflow import patching  # noqa: E402
from mpidist.tensorflow import preemption  # noqa: E402
from reference import same_everywhere  # noqa: E402

pytestmark = pytest.mark.mpi
Handler = tf.distribute.experimental.PreemptionCheckpointHandler
Config = tf.distribute.experimental.TerminationConfig


@pytest.fixture(autouse=True)
def signals_restored():
    """Each handler installs its signal handlers; the next test starts with the previous ones."""
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    yield
    for s, handler in previous.items():
        signal.signal(s, handler)


def make(strategy, directory, config=None, resolver=None, manager=False, size=3):
    """(handler, counter variable, checkpoint) built in the strategy's scope, as TensorFlow's guide does."""
    with strategy.scope():
        v = tf.Variable(tf.zeros(size))
        checkpoint = tf.train.Checkpoint(v=v)
        target = tf.train.CheckpointManager(checkpoint, directory, max_to_keep=2) if manager else checkpoint
        handler = Handler(resolver, target, None if manager else directory, config)
    return handler, v, checkpoint


def step_of(strategy, v):
    def step():  # one collective per step, as a training step has
        total = strategy.reduce("SUM", strategy.run(lambda: tf.ones(())), axis=None)
        v.assign_add(tf.fill(v.shape, total))
        return total
    return step


def train(handler, step, first, last, signal_at=None, signal_rank=None, sleep=0.0, signum=signal.SIGTERM):
    for i in range(first, last):
        if i == signal_at and this_rank() == signal_rank:
            os.kill(os.getpid(), signum)
        handler.run(step)
        if sleep:
            time.sleep(sleep)


def this_rank() -> int:
    from mpi4py import MPI
    return MPI.COMM_WORLD.Get_rank()


def saved(directory, name="v"):
    path = tf.train.latest_checkpoint(directory)
    return (int(tf.train.load_variable(path, "checkpointed_runs/.ATTRIBUTES/VARIABLE_VALUE")),
            tf.train.load_variable(path, f"{name}/.ATTRIBUTES/VARIABLE_VALUE").tolist(), os.path.basename(path))


@pytest.mark.parametrize("who", ["last", "chief"])
def test_sigterm_on_one_rank_saves_on_every_rank_at_one_run_and_a_new_handler_restores(comm, shared_dir, who):
    size = comm.Get_size()
    strategy = mpidist.MultiWorkerMirroredStrategy()  # its cluster_resolver is an MPIClusterResolver
    exits: list[int] = []
    config = Config(exit_fn=lambda: exits.append(handler.total_run_calls))
    handler, v, _ = make(strategy, shared_dir, config, resolver=strategy.cluster_resolver)
    assert type(handler) is preemption.PreemptionCheckpointHandler and isinstance(handler, Handler)
    assert handler.total_run_calls == 0
    signal_rank = size - 1 if who == "last" else 0
    train(handler, step_of(strategy, v), 0, 9, signal_at=4, signal_rank=signal_rank)
    # the notice came before run 4 on one rank: posted at run 4, acted on by every rank at run 5
    assert same_everywhere(comm, exits) == [5]
    assert handler.total_run_calls == 9
    assert same_everywhere(comm, saved(shared_dir)) == (5, [5.0 * size] * 3, "ckpt-1")
    assert sorted(os.listdir(shared_dir)) == ["checkpoint", "ckpt-1.data-00000-of-00001", "ckpt-1.index"]
    # a relaunch: a new handler on the directory restores the run count and the variables
    again, v2, _ = make(strategy, shared_dir, Config(exit_fn=lambda: None), resolver=strategy.cluster_resolver)
    assert same_everywhere(comm, again.total_run_calls) == 5
    np.testing.assert_array_equal(v2.numpy(), [5.0 * size] * 3)
    strategy.close()


def test_a_checkpoint_manager_a_strategy_without_resolver_and_save_checkpoint_if_preempted(comm, strategy,
                                                                                          shared_dir):
    """The module's strategy has no cluster_resolver (None is passed, as for TensorFlow's
    MirroredStrategy): the handler belongs to it through its scope. The loop of TensorFlow's
    save_checkpoint_if_preempted example, inside watch_preemption_scope."""
    exits: list[tuple[int, float]] = []
    config = Config(exit_fn=lambda: exits.append((handler.total_run_calls, float(v.numpy()[0]))))
    handler, v, _ = make(strategy, shared_dir, config, manager=True)
    assert type(handler) is preemption.PreemptionCheckpointHandler
    step = step_of(strategy, v)
    with handler.watch_preemption_scope():
        for i in range(8):
            step()
            if i == 2 and this_rank() == comm.Get_size() - 1:
                os.kill(os.getpid(), signal.SIGTERM)
            handler.save_checkpoint_if_preempted()
    size = comm.Get_size()
    # noticed before call 2: posted by call 2, acted on by call 3, after 4 steps (TensorFlow counts a
    # call of save_checkpoint_if_preempted as a run after its check: 3 runs)
    assert same_everywhere(comm, exits) == [(3, 4.0 * size)]
    assert same_everywhere(comm, saved(shared_dir)[:2]) == (3, [4.0 * size] * 3)
    assert handler.total_run_calls == 8


@pytest.mark.parametrize("notice", ["signal", "watcher"])
def test_an_exit_fn_that_returns_goes_on_and_a_second_notice_saves_again(comm, strategy, shared_dir, notice):
    size, rank = comm.Get_size(), comm.Get_rank()
    flag = threading.Event()
    exits: list[int] = []

    def exit_fn():
        exits.append(handler.total_run_calls)
        flag.clear()

    watcher = flag.is_set if notice == "watcher" else None
    handler, v, _ = make(strategy, shared_dir, Config(exit_fn=exit_fn, termination_watcher_fn=watcher))
    step = step_of(strategy, v)
    # the first notice on the last rank at loop step 2, the second on the chief 10 steps after the first exit
    second_at = None
    for i in range(1000):
        if len(exits) == 2:
            break
        if len(exits) == 1 and second_at is None:
            second_at = i + 10
        if (i == 2 and rank == size - 1) or (i == second_at and rank == 0):
            if notice == "signal":
                os.kill(os.getpid(), signal.SIGTERM)
            else:
                flag.set()
        handler.run(step)
        if notice == "watcher":
            time.sleep(0.01)
    got = same_everywhere(comm, exits)
    if notice == "signal":
        assert got == [3, 15]  # exit_fn ran inside run 3; second_at = 4 + 10: the notice before run 14
    else:  # polled every second: later, the same everywhere
        assert len(got) == 2 and 3 <= got[0] and got[0] + 10 < got[1], got
    assert same_everywhere(comm, saved(shared_dir)[0]) == got[1]


def test_default_exit_is_sys_exit_42_on_every_rank(comm, strategy, shared_dir):
    handler, v, _ = make(strategy, shared_dir)
    with pytest.raises(SystemExit) as raised:
        train(handler, step_of(strategy, v), 0, 20, signal_at=1, signal_rank=0)
    assert same_everywhere(comm, (raised.value.code, handler.total_run_calls)) == (42, 2)
    assert same_everywhere(comm, saved(shared_dir)[0]) == 2


def test_the_preemption_signals_setting_adds_sigusr1(comm, strategy, shared_dir, rc_settings):
    """Under mpirun, which SIGKILLs its ranks 0.2 s after forwarding them a SIGTERM but forwards
    SIGUSR1 alone: MPIDIST_PREEMPTION_SIGNALS=TERM,USR1."""
    rc_settings(preemption_signals="TERM,USR1")
    exits: list[int] = []
    handler, v, _ = make(strategy, shared_dir, Config(exit_fn=lambda: exits.append(handler.total_run_calls)))
    assert signal.getsignal(signal.SIGUSR1) == signal.getsignal(signal.SIGTERM) != signal.SIG_DFL
    train(handler, step_of(strategy, v), 0, 6, signal_at=2, signal_rank=comm.Get_size() - 1, signum=signal.SIGUSR1)
    assert same_everywhere(comm, exits) == [3]


def test_a_watcher_on_one_rank_and_a_grace_period(comm, strategy, shared_dir):
    """termination_watcher_fn (polled every second on a thread) turns True on the last rank; with a
    grace period of 2 s every rank saves at once, trains on, saves again near the period's end and
    exits, each time at the same run everywhere."""
    size, rank = comm.Get_size(), comm.Get_rank()
    raised = threading.Event()
    saves: list[int] = []
    exits: list[int] = []

    def save_fn():
        saves.append(handler.total_run_calls)
        manager.save()

    config = Config(termination_watcher_fn=raised.is_set, exit_fn=lambda: exits.append(handler.total_run_calls),
                    grace_period=2, save_fn=save_fn)
    handler, v, checkpoint = make(strategy, shared_dir, config)
    manager = tf.train.CheckpointManager(checkpoint, shared_dir, max_to_keep=3)
    step = step_of(strategy, v)
    start = None
    for i in range(400):
        if i == 3 and rank == size - 1:
            raised.set()
            start = time.monotonic()
        handler.run(step)
        time.sleep(0.02)
        if exits:
            break
    everyone = same_everywhere(comm, (saves, exits))
    assert len(everyone[0]) == 2 and everyone[1] == [everyone[0][1]], everyone
    assert 3 < everyone[0][0] < everyone[0][1]
    if start is not None:  # the final save came near the end of the grace period, counted from the notice
        assert 1.0 < time.monotonic() - start < 5.0
    assert same_everywhere(comm, saved(shared_dir)[0]) == everyone[0][1]


def test_a_save_error_on_one_rank_is_an_error_on_every_rank(comm, strategy, shared_dir):
    size, rank = comm.Get_size(), comm.Get_rank()

    def save_fn():
        if rank == size - 1:
            raise OSError("disk full (planted)")

    handler, v, _ = make(strategy, shared_dir, Config(exit_fn=lambda: None, save_fn=save_fn))
    expected = OSError if rank == size - 1 else RuntimeError
    with pytest.raises(expected) as raised:
        train(handler, step_of(strategy, v), 0, 10, signal_at=2, signal_rank=0)
    assert same_everywhere(comm, handler.total_run_calls) == 3
    if rank != size - 1:
        assert f"the preemption checkpoint failed on rank {size - 1}, so every rank stops: OSError: disk full" \
            in str(raised.value)


def test_a_watcher_error_on_one_rank_is_an_error_on_every_rank(comm, strategy, shared_dir):
    size, rank = comm.Get_size(), comm.Get_rank()
    raise_now = threading.Event()

    def watcher():
        if raise_now.is_set() and rank == size - 1:
            raise ConnectionError("metadata server unreachable (planted)")
        return False

    handler, v, _ = make(strategy, shared_dir, Config(termination_watcher_fn=watcher, exit_fn=lambda: None))
    raise_now.set()
    with pytest.raises(RuntimeError, match="termination_watcher_fn raised") as raised:
        train(handler, step_of(strategy, v), 0, 400, sleep=0.02)
    assert f"rank {size - 1}" in str(raised.value)
    runs = same_everywhere(comm, handler.total_run_calls)
    assert 0 < runs < 400


def test_ranks_naming_different_directories_fail_on_every_rank(comm, strategy, shared_dir):
    size, rank = comm.Get_size(), comm.Get_rank()
    mine = os.path.join(shared_dir, f"rank{rank}")
    if size == 1:
        handler, _, _ = make(strategy, mine)
        assert handler.total_run_calls == 0
        return
    with pytest.raises(ValueError, match="every rank must name the same checkpoint directory") as raised:
        make(strategy, mine)
    assert f"rank {size - 1}: {os.path.join(shared_dir, f'rank{size - 1}')}" in str(raised.value)


def test_a_checkpoint_without_directory_fails_on_every_rank(comm, strategy):
    with pytest.raises(tf.errors.InvalidArgumentError, match="`checkpoint_dir` must be given with a tf.train"):
        make(strategy, None)


def test_tensorflow_class_runs_unchanged_without_an_mpidist_strategy(comm, strategy, shared_dir):
    assert "tensorflow.python.distribute.failure_handling.failure_handling.PreemptionCheckpointHandler.__init__" \
        in patching.installed()
    mine = os.path.join(shared_dir, f"rank{comm.Get_rank()}")  # TensorFlow's local mode: each rank its own
    checkpoint = tf.train.Checkpoint(v=tf.Variable(1.0))  # no strategy: no scope, nothing tracked
    handler = Handler(None, checkpoint, mine)
    assert type(handler) is Handler
    with tf.distribute.OneDeviceStrategy("/cpu:0").scope():  # TensorFlow's own strategy
        other = Handler(None, tf.train.Checkpoint(w=tf.Variable(1.0)), mine + "b")
    assert type(other) is Handler
    assert handler.run(lambda: 3) == 3 and handler.total_run_calls == 1
    with pytest.raises(ValueError, match="needs an mpidist strategy"):
        preemption.PreemptionCheckpointHandler(None, checkpoint, mine)
    assert sys.modules["mpidist.tensorflow.preemption"] is preemption
