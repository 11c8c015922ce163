"""Preemption: on SIGUSR1 / SIGTERM the chief writes the last commit to a file and every rank exits
cleanly; the requeued job resumes from it.

``on_preemption(state, path, signals=(SIGUSR1, SIGTERM))``:

- if ``path`` exists, the state is loaded from it (and that is its commit): a requeued job resumes;
- a handler for ``signals`` only notes that the signal came (nothing unsafe in a signal handler);
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

from .state import State

_log = logging.getLogger("mpidist")
FORMAT = "mpidist.elastic.preemption/1"


class Preemption:
    """What :func:`on_preemption` installs: ``requested`` (a signal came to this rank), ``path``,
    ``resumed`` (whether the state was loaded from ``path``)."""

    def __init__(self, state: State, path: str, signals: Iterable[int]) -> None:
        self.state, self.path, self.requested, self.resumed = state, os.fspath(path), False, False
        self.signals = tuple(signals)
        for sig in self.signals:
            signal.signal(sig, self.handle)

    def handle(self, signum: int, frame: Any) -> None:
        self.requested = True

    def after_commit(self, state: State) -> None:
        """Collective over the strategy's engine (called by ``state.commit()``)."""
        comm = state.engines()[0].topology.comm
        anyone = comm.allreduce(1 if self.requested else 0, op=MPI.MAX) if comm.Get_size() > 1 else int(self.requested)
        if not anyone:
            return
        if comm.Get_rank() == 0:
            tmp = f"{self.path}.tmp{os.getpid()}"
            with open(tmp, "wb") as f:
                pickle.dump({"format": FORMAT, "snapshot": state.committed()}, f)
            os.replace(tmp, self.path)
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
