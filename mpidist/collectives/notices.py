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
from . import progress

_log = logging.getLogger("mpidist")
TAG = 0x6D70  # "mp"
_WARN_AFTER = 60.0
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


def begin(engine: Any, kind: str) -> Save:
    """Start a save of ``kind`` on this rank (every rank that saves, the chief too)."""
    progress.wait_idle(engine.pipeline)  # asynchronous collectives queued run first: the position is settled
    board = _board(engine)
    where = position(engine)
    board.position = max(board.position, where)
    number = board.counts.get((kind, where), 0) + 1
    board.counts = {k: v for k, v in board.counts.items() if k[1] >= where}
    board.counts[(kind, where)] = number
    return Save(kind, where, number)


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
    made no such save here (then the path is this rank's own).

    The wait has a collective's limits: a warning after ``rc.stall_seconds``, the job aborted after
    ``rc.stall_abort_seconds``, :class:`mpidist.errors.DeadlineExceededError` after
    ``rc.timeout_seconds`` (a chief stuck in a collective that this rank never joins, or a save
    made by ranks other than the chief alone, would otherwise wait forever)."""
    board = _board(engine)
    comm = engine.topology.comm
    start, nap, warned = time.monotonic(), 1e-4, False
    warn_after = _WARN_AFTER if rc.stall_seconds is None else rc.stall_seconds
    while True:
        _drain(comm, board)
        decided, notice = _match(board, save)
        if decided:
            return notice
        waited = time.monotonic() - start
        if not warned and waited > warn_after:
            warned = True
            _log.warning("mpidist: rank %d has waited %.0f s for the chief's %s of %s: %s", comm.Get_rank(),
                         waited, save.kind, path, _RULE)
        if rc.stall_abort_seconds is not None and waited >= rc.stall_abort_seconds:
            _log.error("mpidist: rank %d has waited %.0f s for the chief's %s of %s (rc.stall_abort_seconds): "
                       "aborting the job; %s", comm.Get_rank(), waited, save.kind, path, _RULE)
            MPI.COMM_WORLD.Abort(1)
        if rc.timeout_seconds and waited >= rc.timeout_seconds:
            raise errors.deadline_exceeded(
                f"mpidist: rank {comm.Get_rank()} waited {waited:.0f} s (rc.timeout_seconds) for the chief's "
                f"{save.kind} of {path}, which did not come: {_RULE}")
        time.sleep(nap)
        nap = min(nap * 2, 0.01)


_RULE = ("a save on a rank other than the chief follows the chief's save at the same point of the program "
         "(every rank saves, or the chief alone; not the other ranks alone)")
