"""``@mpidist.elastic.run``: call the training function again on the survivors when ranks die.

The wrapped function takes a :class:`~mpidist.elastic.state.State` first. Under ULFM:

1. the state is synced (rank 0's values everywhere) and that is the first commit;
2. the function runs; when a rank dies, the collective that sees it (``MPI_ERR_PROC_FAILED``)
   revokes the engine's communicator, so every survivor gets ``RanksLostError`` from the
   collective it is in or its next one (the engine does this, see collectives/pipeline.py);
3. every survivor, whether it finished the function or got the error, enters one fault-tolerant
   agreement (``MPI_Comm_agree``) on "did everyone finish": so a death after someone's last
   collective is still seen by all, and nobody returns while others recover;
4. if not: the survivors shrink the communicator, ``engine.replace_comm(shrunk, free_old=False)``
   rebuilds everything derived from it, the state rolls back to its last commit and syncs from
   the lowest surviving rank, the reset callbacks run, and the function is called again.

Without ULFM the function runs once, as if undecorated (the chief logs that once): a death then
ends the job as any failure does, and the recovery is a relaunch from a checkpoint.
"""
from __future__ import annotations

import functools
import logging
import os
import sys
import time
from typing import Any, Callable

from mpi4py import MPI

from ..errors import RanksLostError
from . import ulfm
from .state import State

_log = logging.getLogger("mpidist")
_announced: list[bool] = []


class Recovery:
    """What one recovery did (``mpidist.elastic.recoveries()`` lists them, oldest first)."""

    __slots__ = ("old_size", "new_size", "seconds", "seen_at", "step")

    def __init__(self, old_size: int, new_size: int, seconds: float, seen_at: float, step: Any) -> None:
        self.old_size, self.new_size, self.seconds, self.seen_at, self.step = (
            old_size, new_size, seconds, seen_at, step)

    def __repr__(self) -> str:
        return (f"Recovery({self.old_size} -> {self.new_size} ranks in {self.seconds:.3f} s, "
                f"resumed at {self.step!r})")


_recoveries: list[Recovery] = []
_recovered_engines: list[Any] = []  # the engine of the last recovery (shutdown's barrier)


def recoveries() -> list[Recovery]:
    """The recoveries of this process so far (oldest first)."""
    return list(_recoveries)


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate ``func(state, *args, **kwargs)`` to survive the death of ranks (see the module docstring)."""
    if not callable(func):
        raise TypeError(f"mpidist.elastic.run: `func` must be callable, got {type(func).__name__}")

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(state, State):
            raise TypeError(f"mpidist.elastic.run: the first argument of {func.__name__} must be an "
                            f"mpidist.elastic State, got {type(state).__name__}")
        active, why = ulfm.status()
        _announce(state, active, why)
        state.sync()
        if not active:
            return func(state, *args, **kwargs)
        while True:
            ok, result, error = True, None, None
            try:
                result = func(state, *args, **kwargs)
            except Exception as exc:  # any error: only lost ranks are recovered, the rest re-raised
                if not _ranks_lost(state, exc):
                    raise
                ok, error, seen = False, exc, time.monotonic()
            engine = state.engines()[0]
            comm = engine.topology.comm
            if comm.Get_size() == 1 and ok:
                return result
            if ok and not engine.ranks_lost:
                seen = time.monotonic()
            if ulfm.agree_all_ok(comm, ok):
                return result
            _recover(state, seen, error)

    return wrapper


def _announce(state: State, active: bool, why: str) -> None:
    if _announced or state.engines()[0].rank != 0:
        return
    _announced.append(True)
    if active:
        _log.info("mpidist.elastic.run: ULFM %s: the job survives the death of ranks", why)
    else:
        _log.warning("mpidist.elastic.run: ULFM is not active (%s): a rank's death ends the job; relaunch "
                     "and resume from a checkpoint (BackupAndRestore or mpidist.checkpoint)", why)


def _ranks_lost(state: State, exc: BaseException) -> bool:
    """Whether ``exc`` means ranks died: RanksLostError, a raw ULFM error (then revoke here), or any
    error raised after an engine saw the death (TensorFlow may re-wrap the error it carried)."""
    engines = state.engines()
    if isinstance(exc, RanksLostError) or any(e.ranks_lost for e in engines):
        return True
    if ulfm.lost_error(exc):
        for engine in engines:
            topo = engine.topology
            ulfm.revoke([topo.comm, topo.local, topo.cross])
        return True
    return False


def _recover(state: State, seen: float, error: BaseException | None) -> None:
    """Shrink, rebuild the engines on the survivors, roll back and sync (collective over the survivors)."""
    engines = state.engines()
    old = engines[0].topology.comm
    old_size = old.Get_size()
    for engine in engines:
        topo = engine.topology
        ulfm.revoke([topo.comm, topo.local, topo.cross])
    shrunk = ulfm.shrink(old)
    for engine in engines:
        engine.replace_comm(shrunk, free_old=False)
    shrunk.Free()  # each engine cloned it
    state.restore()
    state.sync()
    state.on_reset()
    record = Recovery(old_size, engines[0].size, time.monotonic() - seen, seen, _position(state))
    _recoveries.append(record)
    _recovered_engines[:] = engines[:1]
    if engines[0].rank == 0:
        _log.warning("mpidist.elastic.run: %d of %d ranks lost (%s); continuing on %d ranks from the last "
                     "commit (%r), %.3f s after the failure was seen", old_size - record.new_size, old_size,
                     type(error).__name__ if error is not None else "seen at the end", record.new_size,
                     record.step, record.seconds)


def _position(state: State) -> Any:
    """Where training resumes: ``state.step``, else ``{"epoch": .., "batch": ..}`` (Keras), else None."""
    if hasattr(state, "step"):
        return state.step
    if hasattr(state, "epoch"):
        return {"epoch": state.epoch, "batch": getattr(state, "batch", None)}
    return None


def world_rank() -> int:
    """This process's rank in COMM_WORLD (its original rank: a shrink does not change it)."""
    return MPI.COMM_WORLD.Get_rank()


def shutdown(code: int = 0) -> None:
    """End this process at the end of an elastic job; call it last, on every survivor.

    Without a recovery in this process it is ``sys.exit(code)`` (MPI finalizes as usual). After
    one (``recoveries()`` not empty) it waits for the other survivors (a barrier on the shrunk
    communicator), flushes logging, stdout and stderr and leaves with ``os._exit(code)``, skipping
    ``MPI_Finalize``: Open MPI 5.0's finalize ends with a PMIx fence over every process the job
    started, dead ones included, and after deaths that fence sometimes never completes (seen in
    about 1 of 10 four-rank launches with two deaths here: every survivor inside MPI_Finalize,
    ``mpirun`` waiting for ever). Atexit hooks do not run then.
    """
    if not _recoveries:
        sys.exit(code)
    for engine in _recovered_engines:
        try:
            engine.topology.comm.Barrier()
        except MPI.Exception:
            pass
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)
