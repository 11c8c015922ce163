"""Preemption: on SIGUSR1 / SIGTERM the chief writes the last commit to a file and every rank exits
cleanly; the requeued job resumes from it.

``on_preemption(state, path, signals=(SIGUSR1, SIGTERM))``:

- if ``path`` exists, the state is loaded from it (and that is its commit): a requeued job resumes;
- a handler for ``signals`` notes that the signal came and, on the chief, writes its last commit
  to ``path`` at once (Python runs handlers in the main thread between bytecodes, never inside an
  MPI call, and a commit replaces the snapshot whole), for when the ranks are killed before their
  next commit: Slurm SIGKILLs a terminated job ``KillWait`` seconds after its SIGTERM, and a
  SIGTERM to ``mpirun`` alone makes it SIGKILL its ranks about 0.2 s later. A handler waits for
  the main thread: a long C call (a TensorFlow step) delays it;
- from then on each ``state.commit()`` also runs one small allreduce (MAX of "a signal came here")
  over the strategy's engine, so all ranks see the preemption at the same commit even when the
  signal reached them at different steps; then the chief writes the commit to ``path`` (a temporary
  file renamed into place), every rank waits for it (barrier) and raises ``SystemExit(0)``: the
  script ends with status 0 and MPI finalizes as usual.

Under Slurm ``#SBATCH --signal=B:USR1@120`` signals the batch shell 120 s before the time limit;
the script forwards it to ``mpirun`` (which passes SIGUSR1 on to the ranks), see slurm/elastic.sbatch.
"""
from __future__ import annotations

import logging
import os
import pickle
import signal
from typing import Any, Iterable

from mpi4py import MPI

from .. import files
from .state import State

_log = logging.getLogger("mpidist")
FORMAT = "mpidist.elastic.preemption/1"


class Preemption:
    """What :func:`on_preemption` installs: ``requested`` (a signal came to this rank), ``path``,
    ``resumed`` (whether the state was loaded from ``path``)."""

    def __init__(self, state: State, path: str, signals: Iterable[int]) -> None:
        self.state, self.path, self.requested, self.resumed = state, os.fspath(path), False, False
        self.signals = tuple(signals)
        self._writing = False
        for sig in self.signals:
            signal.signal(sig, self.handle)

    def handle(self, signum: int, frame: Any) -> None:
        first, self.requested = not self.requested, True
        if first and not self._writing and self.state.engines()[0].rank == 0 and self.state.committed() is not None:
            self.write(self.state.committed(), "sig")
            _log.warning("mpidist.elastic: signal %d: the last commit (%d so far) is in %s; leaving at the "
                         "next commit", signum, self.state.commits, self.path)

    def write(self, snapshot: Any, tag: str = "") -> None:
        """Write ``snapshot`` to ``path`` with ``mpidist.files.write_atomically`` (never half a file,
        even after a crash). ``tag`` names the temporary file of a write from a signal handler, which
        may interrupt a write of the same process."""

        def dump(tmp: str) -> None:
            with open(tmp, "wb") as f:
                pickle.dump({"format": FORMAT, "snapshot": snapshot}, f)

        self._writing = True
        try:
            files.write_atomically(self.path, dump, temporary=files.temporary_name(self.path) + tag)
        finally:
            self._writing = False

    def after_commit(self, state: State) -> None:
        """Collective over the strategy's engine (called by ``state.commit()``)."""
        comm = state.engines()[0].topology.comm
        anyone = comm.allreduce(1 if self.requested else 0, op=MPI.MAX) if comm.Get_size() > 1 else int(self.requested)
        if not anyone:
            return
        if comm.Get_rank() == 0:
            self.write(state.committed())
            _log.warning("mpidist.elastic: preempted: the last commit (%d so far) is in %s; exiting",
                         state.commits, self.path)
        comm.Barrier()
        raise SystemExit(0)


def read_checkpoint(path: str) -> Any:
    """The committed snapshot written to ``path`` at a preemption (what ``State.save()`` returned)."""
    with open(path, "rb") as f:
        content = pickle.load(f)
    if not isinstance(content, dict) or content.get("format") != FORMAT:
        raise ValueError(f"mpidist.elastic.read_checkpoint: `path` must be a file written at a preemption "
                         f"({FORMAT}), got {path!r}")
    return content["snapshot"]


def on_preemption(state: State, path: str, signals: Iterable[int] = (signal.SIGUSR1, signal.SIGTERM)) -> Preemption:
    """Resume ``state`` from ``path`` if it exists; on ``signals`` write the next commit there and exit 0.

    Call it on every rank, in the main thread, before ``elastic.run``'s function starts (see the
    module docstring)."""
    if not isinstance(state, State):
        raise TypeError(f"mpidist.elastic.on_preemption: `state` must be an mpidist.elastic State, "
                        f"got {type(state).__name__}")
    preemption = Preemption(state, path, signals)
    if os.path.exists(preemption.path):
        state.load(read_checkpoint(preemption.path))
        state.commit()
        preemption.resumed = True
        if state.engines()[0].rank == 0:
            _log.warning("mpidist.elastic: resuming from the preemption checkpoint %s", preemption.path)
    state.add_commit_hook(preemption.after_commit)
    return preemption
