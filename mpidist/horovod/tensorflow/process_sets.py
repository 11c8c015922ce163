"""Horovod's process sets on mpidist sub-communicators: one Engine per set, built collectively.

``ProcessSet(ranks)`` names ranks of the job's communicator; ``add_process_set`` (called by every
rank, in the same order) splits that communicator and builds an Engine on the ranks of the set.
A rank outside a set holds no engine for it; a collective there raises ValueError.
"""
from __future__ import annotations

import logging
from typing import Any, cast

from mpi4py import MPI

from ...collectives import Engine

_log = logging.getLogger("mpidist")


class ProcessSet:
    """A set of ranks of the job (Horovod's ``hvd.ProcessSet``); usable once registered."""

    def __init__(self, ranks_or_comm: Any) -> None:
        self.process_set_id: int | None = None
        self.engine: Engine | None = None
        self._comm: MPI.Comm | None = None
        if isinstance(ranks_or_comm, MPI.Comm):
            self._comm = ranks_or_comm
            self.ranks: list[int] | None = None  # filled when registered
        else:
            try:
                ranks = sorted(int(r) for r in ranks_or_comm)
            except TypeError:
                raise TypeError(f"ProcessSet: `ranks_or_comm` must be a list of ranks or an mpi4py "
                                f"communicator, got {type(ranks_or_comm).__name__}") from None
            if len(set(ranks)) != len(ranks):
                raise ValueError(f"ProcessSet: `ranks_or_comm` lists a rank twice: {ranks}")
            self.ranks = ranks

    def resolve(self, base: MPI.Intracomm) -> list[int]:
        """The set's ranks; from a sub-communicator every rank says whether it is in it (collective)."""
        if self._comm is not None and self.ranks is None:
            flags = base.allgather(self._comm != MPI.COMM_NULL)
            self.ranks = [r for r, f in enumerate(flags) if f]
        assert self.ranks is not None
        return self.ranks

    def build(self, base: MPI.Intracomm, set_id: int) -> None:
        """Collective over ``base``: split off this set's ranks and build their engine."""
        me = base.Get_rank()
        self.resolve(base)
        assert self.ranks is not None
        bad = [r for r in self.ranks if not 0 <= r < base.Get_size()]
        if bad:
            raise ValueError(f"add_process_set: ranks {bad} are not ranks of the job (size {base.Get_size()})")
        color = 0 if me in self.ranks else MPI.UNDEFINED
        sub = base.Split(color, me)
        self.process_set_id = set_id
        if sub != MPI.COMM_NULL:
            # mpi4py's stub types Split as returning Comm; an Intracomm's split is an Intracomm
            self.engine = Engine(cast(MPI.Intracomm, sub))
            sub.Free()  # the engine holds its own clone

    def free(self) -> None:
        if self.engine is not None:
            self.engine.close()
        self.engine = None
        self.process_set_id = None

    def included(self) -> bool:
        """Whether this rank belongs to the set."""
        return self.engine is not None

    def size(self) -> int | None:
        """The number of ranks in the set (None before it is registered)."""
        return None if self.ranks is None else len(self.ranks)

    def rank(self) -> int | None:
        """This rank's index in the set, or None when it is not in the set."""
        return self.engine.rank if self.engine is not None else None

    def require_engine(self, where: str) -> Engine:
        require_initialized(where)
        if self.process_set_id is None:
            raise ValueError(f"{where}: process set {self.ranks} has not been registered; call "
                             f"hvd.add_process_set() on every rank first (or pass it to hvd.init)")
        if self.engine is None:
            raise ValueError(f"{where}: this rank is not in process set {self.process_set_id} "
                             f"(ranks {self.ranks})")
        return self.engine

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, ProcessSet) and self.ranks == other.ranks and \
            self.process_set_id == other.process_set_id

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0

_sets: dict[int, ProcessSet] = {}


def require_initialized(where: str) -> Engine:
    """The global set's engine (``hvd.init()`` registers it), or Horovod's "not initialized" error."""
    if global_process_set.engine is None:
        raise ValueError(f"{where}: Horovod has not been initialized; use hvd.init().")
    return global_process_set.engine


def register_global(engine: Engine) -> None:
    global_process_set.engine = engine
    global_process_set.ranks = list(range(engine.size))
    global_process_set.process_set_id = 0
    _sets.clear()
    _sets[0] = global_process_set


def add_process_set(process_set: Any) -> ProcessSet:
    """Register ``process_set`` (a ProcessSet or a list of ranks); collective over the whole job."""
    base = require_initialized("add_process_set").topology.comm
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.process_set_id is not None:
        raise ValueError(f"add_process_set: {process_set} is registered already")
    ranks = process_set.resolve(base)
    for other in _sets.values():
        if other.ranks == ranks:
            raise ValueError(f"add_process_set: a process set with ranks {other.ranks} exists already "
                             f"(id {other.process_set_id})")
    new_id = max(_sets) + 1
    process_set.build(base, new_id)
    _sets[new_id] = process_set
    _log.debug("horovod: process set %d = ranks %s", new_id, process_set.ranks)
    return process_set


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister ``process_set`` (collective over its ranks); False if it was not registered."""
    if process_set is global_process_set:
        raise ValueError("remove_process_set: the global process set cannot be removed")
    if process_set.process_set_id not in _sets or _sets[process_set.process_set_id] is not process_set:
        return False
    del _sets[process_set.process_set_id]
    process_set.free()
    return True


def all_sets() -> list[ProcessSet]:
    return list(_sets.values())


def clear() -> None:
    """Close every registered set's engine (shutdown)."""
    for ps in list(_sets.values()):
        if ps is not global_process_set:
            ps.free()
    global_process_set.engine = None
    _sets.clear()
