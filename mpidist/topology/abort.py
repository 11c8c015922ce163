"""Failure ends the job: an uncaught exception on one rank aborts every rank.

Without this, a rank that dies of an exception leaves the others waiting forever in their next
collective. Like ``python -m mpi4py``, mpidist installs (when the first Engine is built, and
``rc.abort_on_error`` is on; importing mpidist alone changes nothing) a ``sys.excepthook`` that
prints the traceback as usual and then calls ``MPI_Abort`` on COMM_WORLD, so the launcher ends the
job with a non-zero status. Single-process runs are left alone (nothing can wait for them).
``SystemExit`` is not an exception here: ``sys.exit(3)`` on one rank still leaves the others
running, as in plain MPI.
"""
from __future__ import annotations

import logging
import sys
import threading
from types import TracebackType

from mpi4py import MPI

from .._config import rc

_log = logging.getLogger("mpidist")
_installed: list[object] = []


def _abort(exc_type: type[BaseException]) -> None:
    if not rc.abort_on_error or MPI.Is_finalized() or MPI.COMM_WORLD.Get_size() == 1:
        return
    if issubclass(exc_type, KeyboardInterrupt):
        code = 130
    else:
        code = 1
    sys.stderr.write(f"mpidist: uncaught {exc_type.__name__} on rank {MPI.COMM_WORLD.Get_rank()}: "
                     f"aborting the MPI job (mpidist.rc.abort_on_error)\n")
    sys.stderr.flush()
    MPI.COMM_WORLD.Abort(code)


def install() -> None:
    """Chain mpidist's hooks in front of the current ``sys.excepthook`` and ``threading.excepthook``."""
    if _installed:
        return
    previous = sys.excepthook
    previous_thread = threading.excepthook

    def excepthook(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        previous(exc_type, exc, tb)
        _abort(exc_type)

    def thread_excepthook(args: threading.ExceptHookArgs) -> None:
        previous_thread(args)
        if args.exc_type is not SystemExit:
            _abort(args.exc_type)

    sys.excepthook = excepthook
    threading.excepthook = thread_excepthook
    _installed.append(excepthook)
