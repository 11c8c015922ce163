"""``tf.distribute.experimental.PreemptionCheckpointHandler`` under mpidist strategies.

TensorFlow's handler keeps its agreement in the coordination service's key-value store, which an MPI
job has not (``FailedPreconditionError: Coordination service is not enabled``). Once an mpidist
TensorFlow strategy is built, ``install()`` wraps the class's ``__init__`` (through the patch
registry, mpidist/tensorflow/patching.py): a handler that belongs to mpidist (``owner``) becomes this
module's :class:`PreemptionCheckpointHandler`, a subclass of TensorFlow's (``isinstance`` holds);
anything else — TensorFlow's own strategies, a non-MPI resolver with no mpidist strategy — runs
TensorFlow's class unchanged. Programs written from TensorFlow's fault-tolerance guide need no
change::

    strategy = mpidist.MultiWorkerMirroredStrategy()          # or tf.distribute.... under `mpidist run`
    with strategy.scope():
        model, optimizer = ...
        checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
        handler = tf.distribute.experimental.PreemptionCheckpointHandler(
            strategy.cluster_resolver, checkpoint, checkpoint_dir)
    for step in range(handler.total_run_calls, steps):        # restored after a relaunch
        handler.run(distributed_train_step, next(iterator))

Semantics (TensorFlow's, off Google Cloud):

- Construction (collective over the strategy's ranks): restores the latest checkpoint of the
  directory and ``total_run_calls`` with it (the ``checkpointed_runs`` variable the handler adds to
  the checkpoint, as TensorFlow's does, so checkpoints of either restore in the other). Every rank
  must name the same directory and restore the same run count, else an error on every rank.
- A termination notice — SIGTERM (the signals of ``rc.preemption_signals``: ``MPIDIST_PREEMPTION_SIGNALS=
  TERM,USR1`` adds SIGUSR1, which mpirun forwards to the ranks without killing them), or
  ``TerminationConfig.termination_watcher_fn`` returning True (polled every second on a thread,
  and then no signal is watched) — reaching any one rank makes every rank save once, at the same
  run count, then call ``exit_fn`` (default ``sys.exit(42)``, TensorFlow's code off Google Cloud;
  TensorFlow's on Google Cloud defaults are not detected here: give them in a TerminationConfig).
- ``grace_period`` > 0: the first save is followed by training until the grace period (counted from
  the notice, less six estimated run times, as TensorFlow does) has nearly passed, then a final save
  and ``exit_fn``. ``save_fn``: called instead of ``CheckpointManager.save`` (every rank).
- ``run(fn, *args, **kwargs)``: ``fn(*args, **kwargs)``, counted in ``total_run_calls``.
  ``save_checkpoint_if_preempted(*args, **kwargs)``: the same check without a function (its
  arguments go to the save), counted too. ``watch_preemption_scope()``: a scope that re-raises
  (an uncaught exception ends the whole job: mpidist's abort hook, as always).

How every rank learns of the notice at the same run: one ``LockstepMax`` (mpidist/collectives/
lockstep.py) on a private clone of the strategy's communicator. Each ``run`` first collects the
exchange posted at the previous run, then posts its own: two integers, MAX over ranks, (rank + 1 if
a notice reached this rank, rank + 1 if its watcher raised). A notice that reaches a rank during
step k is posted at run k + 1 and acted on by every rank at run k + 2, the run TensorFlow's handler
saves at too. No per-step round trip: the exchange completes during the step's own collectives. A
watcher that raises is an error on every rank at the same run. ``notify_termination()`` is what a
signal does (tests call it, or send the signal).

The save: the chief writes the checkpoint directory, the other ranks follow it (mpidist's
``CheckpointManager.save``, mpidist/tensorflow/keras/tf_checkpoint.py: no per-worker temporary directories as
TensorFlow's handler makes); an error there is raised on every rank (one allgather of the outcome).
"""
from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading
import time
from typing import Any, Callable, Iterator

import tensorflow as tf

from .._config import rc
from ..cluster_resolver import MPIClusterResolver
from ..collectives.lockstep import LockstepMax
from . import owners, patching
from .checkpoint import key_of
from .strategy import MPIStrategy

_log = logging.getLogger("mpidist")
_TF = tf.distribute.experimental.PreemptionCheckpointHandler
EXIT_CODE = 42  # TensorFlow's exit code off Google Cloud (failure_handling.py, BorgTerminationConfig)
RUNS_NAME = "checkpointed_runs"  # the attribute TensorFlow's handler adds to the checkpoint
WATCH_SECONDS = 1.0  # how often termination_watcher_fn is called (TensorFlow's interval)
GRACE_BUFFER = 6  # a grace period's final save comes this many estimated run times before its end


def strategy_of(checkpoint_or_manager: Any) -> Any:
    """The strategy in scope, else the first one an object the checkpoint tracks was built under."""
    if tf.distribute.has_strategy():
        return tf.distribute.get_strategy()
    root = checkpoint_or_manager
    if isinstance(root, tf.train.CheckpointManager):
        root = root.checkpoint
    try:
        nodes = tf.train.TrackableView(root).descendants()
    except (AttributeError, TypeError):  # not a trackable: TensorFlow's class reports it
        return None
    for node in [root, *nodes]:
        found = owners.built_under(node)
        if found is not None:
            return found
    return None


def owner(cluster_resolver: Any, checkpoint_or_manager: Any) -> tuple[MPIStrategy | None, Any] | None:
    """``(strategy, communicator)`` when a handler of these arguments belongs to mpidist: an mpidist
    strategy in scope or tracked by the checkpoint (its communicator), or, with no strategy at all,
    an ``MPIClusterResolver`` (its communicator); None otherwise (TensorFlow's class runs)."""
    strategy = strategy_of(checkpoint_or_manager)
    if isinstance(strategy, MPIStrategy):
        return strategy, strategy.engine.topology.comm
    if strategy is None and isinstance(cluster_resolver, MPIClusterResolver):
        return None, cluster_resolver.comm
    return None


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


class PreemptionCheckpointHandler(tf.distribute.experimental.PreemptionCheckpointHandler):
    """TensorFlow's ``PreemptionCheckpointHandler`` on MPI (see the module docstring).

    ``PreemptionCheckpointHandler(cluster_resolver, checkpoint_or_checkpoint_manager,
    checkpoint_dir=None, termination_config=None)``, collective over the ranks of the mpidist
    strategy the checkpoint belongs to (``owner``); call it on every rank, in the main thread.
    """

    def __init__(self, cluster_resolver: Any, checkpoint_or_checkpoint_manager: Any, checkpoint_dir: Any = None,
                 termination_config: Any = None) -> None:  # TensorFlow's __init__ needs its coordination service
        where = self._where = "PreemptionCheckpointHandler"
        found = owner(cluster_resolver, checkpoint_or_checkpoint_manager)
        if found is None:
            raise ValueError(f"{where}: mpidist's handler needs an mpidist strategy (in scope, or one the "
                             f"checkpoint's objects were built under) or an MPIClusterResolver, got "
                             f"{type(cluster_resolver).__name__} and no mpidist strategy")
        self._strategy, comm = found
        self._cluster_resolver = cluster_resolver
        self._vote = LockstepMax(comm, width=2, where=where)  # collective: every rank, before any check
        self._rank, self._size = self._vote.rank, self._vote.size
        self._signal_time: float | None = None  # when a notice reached this rank (None: none)
        self._watch_error: str | None = None  # what termination_watcher_fn raised on this rank
        self._countdown = False  # saved once, training on through a grace period
        self._deadline: float | None = None  # end of the grace period's training on this rank
        self._estimated_run_time, self._timed = 0.0, 0
        self._watcher: threading.Thread | None = None
        self._stop_watching = threading.Event()
        problem: BaseException | None = None
        try:  # this rank's part: nothing collective, so an error here cannot leave another rank waiting
            self._configure(checkpoint_or_checkpoint_manager, checkpoint_dir, termination_config)
        except Exception as error:
            problem = error
        directory = key_of(self._manager.directory) if problem is None else ""
        self._agree("set up the handler", problem, self._gather(problem, directory),
                    "every rank must name the same checkpoint directory (the chief writes it, every rank "
                    "restores from it)")
        self._runs = -1
        try:
            self._runs_variable = self._runs_variable_of(self._manager.checkpoint)  # collective in a scope
            self._manager.restore_or_initialize()
            self._runs = int(self._runs_variable.numpy())
        except Exception as error:
            problem = error
        self._agree("restore the checkpoint", problem, self._gather(problem, self._runs),
                    f"the ranks restored different run counts from {directory}: every rank must see the chief's "
                    f"files (a file system the ranks share)")
        self._watch()
        if self._rank == 0:
            _log.info("mpidist: %s: %s, %d ranks, exit_fn %s", where,
                      f"restored run {self._runs} from {directory}" if self._runs else f"no checkpoint in {directory}",
                      self._size, "given" if self._exit_fn_given else f"sys.exit({EXIT_CODE})")

    # -- construction ---------------------------------------------------------------------------------

    def _configure(self, checkpoint_or_manager: Any, checkpoint_dir: Any, config: Any) -> None:
        where = self._where
        if config is None:
            config = tf.distribute.experimental.TerminationConfig()
        if not isinstance(config, tf.distribute.experimental.TerminationConfig):
            raise TypeError(f"{where}: `termination_config` must be a tf.distribute.experimental.TerminationConfig "
                            f"or None, got {type(config).__name__}")
        self._watcher_fn: Callable[[], Any] | None = config.termination_watcher_fn
        self._exit_fn_given = config.exit_fn is not None
        self._exit_fn: Callable[[], Any] = config.exit_fn or (lambda: sys.exit(EXIT_CODE))
        grace = config.grace_period or 0
        if isinstance(grace, bool) or not isinstance(grace, (int, float)) or grace < 0:
            raise ValueError(f"{where}: `termination_config.grace_period` must be seconds >= 0 or None, got {grace!r}")
        self._grace_period = float(grace)
        self._save_fn: Callable[..., Any] | None = config.save_fn
        if self._watcher_fn is None and threading.current_thread() is not threading.main_thread():
            raise RuntimeError(f"{where}: watching {', '.join(rc.preemption_signals)} needs the handler built in the "
                               f"main thread (Python runs signal handlers there); give a "
                               f"TerminationConfig(termination_watcher_fn=...)")
        if isinstance(checkpoint_or_manager, tf.train.CheckpointManager):
            self._manager = checkpoint_or_manager
        elif isinstance(checkpoint_or_manager, tf.train.Checkpoint):
            if not checkpoint_dir:
                raise tf.errors.InvalidArgumentError(
                    None, None, f"{where}: `checkpoint_dir` must be given with a tf.train.Checkpoint (a "
                                f"CheckpointManager brings its own directory), got {checkpoint_dir!r}")
            self._manager = tf.train.CheckpointManager(checkpoint_or_manager, directory=checkpoint_dir, max_to_keep=1)
        else:
            raise TypeError(f"{where}: `checkpoint_or_checkpoint_manager` must be a tf.train.Checkpoint or "
                            f"tf.train.CheckpointManager, got {type(checkpoint_or_manager).__name__}")

    @staticmethod
    def _runs_variable_of(checkpoint: Any) -> Any:
        """The checkpoint's run counter, added as TensorFlow's handler adds it (same name)."""
        runs = getattr(checkpoint, RUNS_NAME, None)
        if runs is None:
            runs = tf.Variable(0, dtype=tf.int64, trainable=False, name=RUNS_NAME)
            setattr(checkpoint, RUNS_NAME, runs)
        return runs

    def _gather(self, problem: BaseException | None, fact: Any) -> list[tuple[str | None, Any]]:
        """Every rank's (error text or None, ``fact``), in rank order (collective)."""
        return self._vote.comm.allgather((None if problem is None else _describe(problem), fact))

    def _agree(self, what: str, problem: BaseException | None, facts: list[tuple[str | None, Any]],
               mismatch: str) -> None:
        """Raise on every rank when any failed to ``what`` (its own error where it failed), or, saying
        ``mismatch``, when the ranks' facts differ."""
        failed = [(r, text) for r, (text, _) in enumerate(facts) if text is not None]
        if problem is not None:
            raise problem
        if failed:
            rank, text = failed[0]
            raise RuntimeError(f"{self._where}: rank {rank} failed to {what}, so no rank goes on: {text}")
        values = [v for _, v in facts]
        if len(set(values)) > 1:
            listed = ", ".join(f"rank {r}: {v}" for r, v in enumerate(values))
            raise ValueError(f"{self._where}: {mismatch}; got {listed}")

    def _watch(self) -> None:
        """SIGTERM (``rc.preemption_signals``), or a thread calling termination_watcher_fn, notes a
        notice on this rank."""
        if self._watcher_fn is None:
            for name in rc.preemption_signals:
                signal.signal(getattr(signal, name), self._on_signal)
            return
        self._stop_watching = stop = threading.Event()  # each thread its own: one set stays set
        self._watcher = threading.Thread(target=self._poll_watcher, args=(stop,),
                                         name=f"mpidist-preemption-watcher-{self._rank}", daemon=True)
        self._watcher.start()

    def _poll_watcher(self, stop: threading.Event) -> None:
        watcher = self._watcher_fn
        while watcher is not None and not stop.is_set():
            try:
                if watcher():
                    self.notify_termination()
                    return
            except Exception as error:  # an error on every rank at the next run (see _check)
                self._watch_error = _describe(error)
                _log.error("mpidist: %s: rank %d: termination_watcher_fn raised %s", self._where, self._rank,
                           self._watch_error)
                return
            stop.wait(WATCH_SECONDS)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.notify_termination()

    # -- the notice -----------------------------------------------------------------------------------

    def notify_termination(self) -> None:
        """What a SIGTERM (``rc.preemption_signals``) or termination_watcher_fn returning True does: a
        termination notice reached this rank; every rank acts on it at the same run. Safe in a signal
        handler."""
        if self._signal_time is None:
            self._signal_time = time.time()

    def _posted(self) -> tuple[int, int]:
        notice = self._signal_time is not None and (not self._countdown or
                                                    (self._deadline is not None and time.time() >= self._deadline))
        return (self._rank + 1 if notice else 0), (self._rank + 1 if self._watch_error is not None else 0)

    def _check(self, args: tuple, kwargs: dict) -> None:
        notice, failed = self._vote.collect()
        if failed:
            rank = failed - 1
            if rank == self._rank:
                raise RuntimeError(f"{self._where}: termination_watcher_fn raised on rank {rank} (this rank), so "
                                   f"every rank stops here: {self._watch_error}")
            raise RuntimeError(f"{self._where}: termination_watcher_fn raised on rank {rank} (its log has the "
                               f"error), so every rank stops here")
        if notice:
            self._act(notice - 1, args, kwargs)
        self._vote.post(*self._posted())

    def _act(self, rank: int, args: tuple, kwargs: dict) -> None:
        final = self._countdown or self._grace_period <= 0
        if self._rank == 0:
            _log.warning("mpidist: %s: a termination notice reached rank %d%s; every rank saves at run %d%s",
                         self._where, rank, " (and perhaps lower ranks)" if rank > 0 else "", self._runs,
                         " and exits" if final else ", then trains on through the grace period")
        self._save(args, kwargs)
        if not final:
            self._countdown = True
            if self._signal_time is not None:
                self._deadline = (self._signal_time + self._grace_period
                                  - GRACE_BUFFER * self._estimated_run_time)
            return
        self._stop_watching.set()
        self._exit_fn()
        # exit_fn returned (a restart in process): watch for the next notice
        self._signal_time, self._countdown, self._deadline = None, False, None
        if self._watcher_fn is not None:
            self._watch()

    def _save(self, args: tuple, kwargs: dict) -> None:
        """Every rank: the checkpoint of this run count, written once; an error raised on every rank."""
        problem: BaseException | None = None
        try:
            self._runs_variable.assign(self._runs)
            with self._save_scope():
                if self._save_fn is not None:
                    self._save_fn(*args, **kwargs)
                elif self._strategy is not None or self._rank == 0:  # no strategy: the chief writes
                    self._manager.save(*args, **kwargs)
        except Exception as error:
            problem = error
        texts = self._vote.comm.allgather(None if problem is None else _describe(problem))
        failed = [(r, t) for r, t in enumerate(texts) if t is not None]
        if problem is not None:
            raise problem
        if failed:
            raise RuntimeError(f"{self._where}: the preemption checkpoint failed on rank {failed[0][0]}, so every "
                               f"rank stops: {failed[0][1]}")

    def _save_scope(self) -> Any:
        """The strategy's scope, unless a strategy is in scope already: mpidist's saves then route the
        write to the chief (mpidist/tensorflow/keras/tf_checkpoint.py)."""
        if self._strategy is None or tf.distribute.has_strategy():
            return contextlib.nullcontext()
        return self._strategy.scope()

    # -- TensorFlow's API -----------------------------------------------------------------------------

    @property
    def total_run_calls(self) -> int:
        """Calls of ``run`` (and ``save_checkpoint_if_preempted``), those before a relaunch included."""
        return self._runs

    def run(self, distributed_train_function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``distributed_train_function(*args, **kwargs)``, after saving and exiting if a termination
        notice reached any rank (every rank at the same run)."""
        self._check((), {})
        start = time.monotonic()
        result = distributed_train_function(*args, **kwargs)
        self._runs += 1
        self._timed += 1
        self._estimated_run_time += (time.monotonic() - start - self._estimated_run_time) / self._timed
        return result

    def save_checkpoint_if_preempted(self, *args: Any, **kwargs: Any) -> None:
        """Save (``args`` / ``kwargs`` go to the save) and exit if a termination notice reached any
        rank; counted as a run, as TensorFlow counts it."""
        self._check(args, kwargs)
        self._runs += 1
        self._estimated_run_time = 0.0

    @contextlib.contextmanager
    def watch_preemption_scope(self) -> Iterator[None]:
        """TensorFlow's scope for ``run`` / ``save_checkpoint_if_preempted`` loops; errors pass through."""
        yield

    def __del__(self) -> None:
        stop = getattr(self, "_stop_watching", None)
        if stop is not None:
            stop.set()


def _init(original: Callable[..., None]) -> Callable[..., None]:
    def __init__(self: Any, cluster_resolver: Any, checkpoint_or_checkpoint_manager: Any, checkpoint_dir: Any = None,
                 termination_config: Any = None) -> None:
        if type(self) is _TF and owner(cluster_resolver, checkpoint_or_checkpoint_manager) is not None:
            patching.adopt(self, PreemptionCheckpointHandler, checked=patching.TENSORFLOW,  # a subclass, no slots
                           reason="a handler of an mpidist strategy becomes mpidist's (no coordination service)")
            PreemptionCheckpointHandler.__init__(self, cluster_resolver, checkpoint_or_checkpoint_manager,
                                                 checkpoint_dir, termination_config)
            return
        original(self, cluster_resolver, checkpoint_or_checkpoint_manager, checkpoint_dir, termination_config)
    return __init__


def install() -> None:
    """Route ``tf.distribute.experimental.PreemptionCheckpointHandler`` of mpidist strategies here (once)."""
    patching.patch(_TF, "__init__", _init, checked=patching.TENSORFLOW,
                   reason="TensorFlow's handler needs a coordination service an MPI job lacks")
