"""Saves that the chief may make alone: the chief never waits for anyone, the others follow it.

Programs save in three ways, and a save cannot know which one it is part of:

- **every rank, one path** (``ckpt.save(prefix)`` on every rank; Keras callbacks on every rank);
- **every rank, paths of its own** (TensorFlow's multi-worker tutorials: non-chief workers write to
  temporary directories and delete them);
- **the chief alone** (``if strategy.extended.should_checkpoint: ckpt.save(...)``; Horovod's
  ``if hvd.rank() == 0: checkpoint.save(...)``).

So a save is never a collective the chief waits in. The chief writes, then *publishes* a notice
(kind, path, result or error) to every other rank: one small non-blocking send each, which nobody
may ever receive (a chief-only save). A rank other than the chief that saves *follows* the chief:
it takes the chief's notice for the same save, and when the chief wrote the same path it writes
nothing and returns once the chief's files are complete (with the chief's result, or raising the
chief's error); otherwise the path is its own and it writes it itself.

Which notice is "the same save": ranks that save at one point of the program have issued the same
collectives before it, so a save is identified by its *position* (the number of collectives this
rank has entered on the engine, from the stall monitor, ``rc.stall_seconds``) and its kind, and
the m-th save of a kind at a position matches the chief's m-th. Notices from earlier positions
(chief-only saves) are dropped; a notice from a later position tells the follower that the chief
went past this point without this save, so the path is its own. Without the stall monitor
(``rc.stall_seconds = None``) the position is unknown and the m-th save of a kind matches the
chief's m-th of that kind: do not mix chief-only and every-rank saves of one kind then.

Notices travel point-to-point on the engine's private communicator (its clone of the user's), with a
tag of their own; collectives never match point-to-point messages.

**A follower's wait has limits, and ends in an error on every rank, never a silent hang.** While it
waits, a follower asks the chief where it is (the stall monitor's channel, collectives/stall.py:
every ``_ASK_EVERY`` seconds from then on, never blocking), and:

- the chief found twice in a row inside the same collective of this communicator that began after
  this save did (one the follower cannot join while it waits: a collective inside the chief's save,
  or the chief gone on without making this save) is a certain deadlock: the follower raises
  :class:`mpidist.errors.DeadlockError` naming the chief's collective and its code (innermost frames
  outside mpidist and in the program's own code), after taking part in that collective's agreement
  exchange as a failed call (``Engine.fail``), so that the chief's collective raises
  ``CollectiveFailedError`` with the follower's message and the ranks stay in step (with
  ``rc.check_agreement`` off the chief stays in its collective: ``rc.abort_on_error`` then ends the
  job). Found within seconds, whatever the settings;
- after ``rc.stall_seconds`` (60 s when None) a warning says who waits for whom and where the chief is;
- after ``rc.timeout_seconds`` (when set) the follower raises
  :class:`mpidist.errors.DeadlineExceededError` saying the same (given up to ``_LAST_ANSWER``
  seconds more to learn where the chief is, if it has not said yet), and tells the chief, whose save
  raises it too when it ends; after ``rc.stall_abort_seconds`` (when set) the job is aborted, as for
  a collective.
"""
from __future__ import annotations

import logging
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from mpi4py import MPI

from .. import errors
from .._config import rc
from . import progress, stall

_log = logging.getLogger("mpidist")
TAG = 0x6D70  # "mp"
_GAVE_UP = TAG + 1  # a follower to the chief: it stopped waiting for a save (rc.timeout_seconds)
_ASK_EVERY = 0.5  # seconds between a follower's questions to the chief (the first after as long)
_WARN_AFTER = 60.0
_LAST_ANSWER = 2.0  # seconds a follower past its deadline waits for the chief to say where it is
_MAX_TEXT = 1000


@dataclass
class Notice:
    """What the chief did in one save."""
    kind: str
    position: int
    path: str
    result: str = ""
    error: str | None = None
    extra: dict = field(default_factory=dict)


@dataclass
class Save:
    """One save in progress on this rank: its kind, position and number there (``begin``)."""
    kind: str
    position: int
    number: int
    previous: str = ""  # the stall monitor's activity before this save (finish puts it back)


class _Board:
    """This rank's notices for one engine communicator."""

    def __init__(self) -> None:
        self.received: list[Notice] = []
        self.counts: dict[tuple[str, int], int] = {}
        self.sends: list[MPI.Request] = []
        self.position = 0  # the last position a save began at (older notices are dropped)


_boards: weakref.WeakKeyDictionary[Any, _Board] = weakref.WeakKeyDictionary()


def _board(engine: Any) -> _Board:
    pipeline = engine.pipeline
    board = _boards.get(pipeline)
    if board is None:
        board = _boards[pipeline] = _Board()
    return board


def position(engine: Any) -> int:
    """How many collectives this rank has entered on ``engine`` (0 without the stall monitor)."""
    monitor = engine.pipeline.monitor
    return 0 if monitor is None else int(monitor.seq)


def begin(engine: Any, kind: str, path: str = "") -> Save:
    """Start a save of ``kind`` to ``path`` on this rank (every rank that saves, the chief too); end it
    with :func:`finish`."""
    progress.wait_idle(engine.pipeline)  # asynchronous collectives queued run first: the position is settled
    board = _board(engine)
    where = position(engine)
    board.position = max(board.position, where)
    number = board.counts.get((kind, where), 0) + 1
    board.counts = {k: v for k, v in board.counts.items() if k[1] >= where}
    board.counts[(kind, where)] = number
    save = Save(kind, where, number)
    monitor = engine.pipeline.monitor
    if monitor is not None:  # what a rank asking where this one is learns (stall.describe)
        save.previous, monitor.activity = monitor.activity, f"{kind} of {path}" if path else kind
    return save


def finish(engine: Any, save: Save) -> None:
    """End ``save`` on this rank (however it ended)."""
    monitor = engine.pipeline.monitor
    if monitor is not None:
        monitor.activity = save.previous


def publish(engine: Any, save: Save, path: str, result: str = "", error: BaseException | None = None,
            extra: dict | None = None) -> None:
    """On the chief, after its write: tell every other rank (never waits)."""
    board = _board(engine)
    text = None if error is None else f"{type(error).__name__}: {error}"[:_MAX_TEXT]
    notice = Notice(save.kind, save.position, path, result, text, dict(extra or {}))
    comm = engine.topology.comm
    board.sends = [r for r in board.sends if not r.Test()]
    for rank in range(1, comm.Get_size()):
        board.sends.append(comm.isend(notice, dest=rank, tag=TAG))
    gave_up = []  # followers that stopped waiting for this save (their rc.timeout_seconds)
    while comm.iprobe(source=MPI.ANY_SOURCE, tag=_GAVE_UP):
        kind, where, number, rank, text = comm.recv(source=MPI.ANY_SOURCE, tag=_GAVE_UP)
        if (kind, where, number) == (save.kind, save.position, save.number):
            gave_up.append((rank, text))
    if gave_up and error is None:
        rank, text = min(gave_up)
        raise errors.deadline_exceeded(
            f"mpidist: {save.kind} of {path}: rank 0 (the chief) wrote it, but rank(s) "
            f"{', '.join(str(r) for r, _ in sorted(gave_up))} had stopped waiting for it; rank {rank}: {text}")


def _drain(comm: MPI.Intracomm, board: _Board) -> None:
    while comm.iprobe(source=0, tag=TAG):
        notice = comm.recv(source=0, tag=TAG)
        if notice.position >= board.position:  # earlier ones were saves of the chief alone
            board.received.append(notice)


def _match(board: _Board, save: Save) -> tuple[bool, Notice | None]:
    """(decided, the chief's notice for ``save`` or None when the chief went past without it)."""
    board.received = [n for n in board.received if n.position >= save.position]
    same = [n for n in board.received if n.kind == save.kind and n.position == save.position]
    if len(same) >= save.number:
        notice = same[save.number - 1]
        return True, notice
    if any(n.position > save.position for n in board.received):
        return True, None
    return False, None


def follow(engine: Any, save: Save, path: str) -> Notice | None:
    """On a rank other than the chief: wait for the chief's notice of ``save``; None when the chief
    made no such save here (then the path is this rank's own). The wait's limits: see the module
    docstring."""
    board = _board(engine)
    comm = engine.topology.comm
    monitor = engine.pipeline.monitor
    start, nap, warned, asked = time.monotonic(), 1e-4, False, -_ASK_EVERY
    warn_after = _WARN_AFTER if rc.stall_seconds is None else rc.stall_seconds
    chief: dict[str, Any] | None = None  # the chief's last answer: where it is
    blocked = 0  # answers in a row finding the chief in the same collective this rank cannot join
    outstanding = False  # a question not answered yet
    while True:
        _drain(comm, board)
        decided, notice = _match(board, save)
        if decided:
            return notice
        now = time.monotonic()
        waited = now - start
        if monitor is not None and waited >= _ASK_EVERY:
            answer = monitor.answer(0)
            if answer is not None:
                same = chief is not None and chief["inside"] and answer["seq"] == chief["seq"]
                chief, outstanding = answer, False
                blocked = (blocked + 1 if same else 1) if _blocked(answer, save) else 0
                if blocked >= 2:
                    _drain(comm, board)  # a notice sent before the chief went on decides it
                    decided, notice = _match(board, save)
                    if decided:
                        return notice
                    _deadlock(engine, save, path, waited, answer)
            if now - asked >= (10 * _ASK_EVERY if outstanding else _ASK_EVERY):
                monitor.ask(0)
                asked, outstanding = now, True
        if not warned and waited > warn_after:
            warned = True
            _log.warning("mpidist: %s", _waiting(comm.Get_rank(), save, path, waited, chief))
        if rc.stall_abort_seconds is not None and waited >= rc.stall_abort_seconds:
            _log.error("mpidist: %s (rc.stall_abort_seconds): aborting the job",
                       _waiting(comm.Get_rank(), save, path, waited, chief))
            MPI.COMM_WORLD.Abort(1)
        if rc.timeout_seconds and waited >= rc.timeout_seconds:
            if chief is None and monitor is not None:  # not answered yet: a busy machine; let it say where
                chief = _answer_within(monitor, _LAST_ANSWER)
            text = _waiting(comm.Get_rank(), save, path, waited, chief)
            board.sends.append(comm.isend((save.kind, save.position, save.number, comm.Get_rank(), text),
                                          dest=0, tag=_GAVE_UP))
            raise errors.deadline_exceeded(f"mpidist: {text} (rc.timeout_seconds={rc.timeout_seconds:g})")
        time.sleep(nap)
        nap = min(nap * 2, 0.01)


def _answer_within(monitor: Any, seconds: float) -> dict[str, Any] | None:
    """The chief's answer to a new question, if it comes within ``seconds``."""
    monitor.ask(0)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        answer = monitor.answer(0)
        if answer is not None:
            return answer
        time.sleep(0.01)
    return None


def _blocked(chief: dict[str, Any], save: Save) -> bool:
    """Whether the chief is inside a collective of this communicator that began after ``save`` did."""
    return bool(chief["inside"]) and chief["seq"] > save.position


def _waiting(rank: int, save: Save, path: str, waited: float, chief: dict[str, Any] | None) -> str:
    where = "rank 0 has not said where it is" if chief is None else stall.describe(0, chief)
    return (f"rank {rank} has waited {waited:.0f} s for rank 0 (the chief) to finish its {save.kind} of {path}; "
            f"{where}. {_RULE}")


def _deadlock(engine: Any, save: Save, path: str, waited: float, chief: dict[str, Any]) -> None:
    """Raise DeadlockError here and, through the chief's collective, on the chief (module docstring)."""
    rank = engine.rank
    why = ("nothing inside a save may make a collective (the other ranks wait for the save to end)"
           if chief.get("activity") else f"rank 0 went on without making this save. {_RULE}")
    error = errors.DeadlockError(
        f"mpidist: {save.kind} of {path}: rank {rank} waited {waited:.1f} s for rank 0 (the chief) to finish "
        f"this save, but {stall.describe(0, chief)}: a collective rank {rank} cannot join while it waits; {why}")
    engine.fail(f"{save.kind} (rank {rank} waiting for rank 0)", error)


_RULE = ("A save on a rank other than the chief follows the chief's save at the same point of the program "
         "(every rank saves, or the chief alone; not the other ranks alone)")
