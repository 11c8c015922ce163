"""Launcher environment readers: which launcher started this process and how many tasks it meant.

One tiny module per launcher (as JAX's ``clusters/``), each with ``detect(environ)`` returning a
:class:`Launcher` or ``None``. Topology never comes from these variables (it comes from MPI); they
serve diagnostics, such as srun started with a ``--mpi`` plugin that does not match the MPI
library, which silently gives N singletons instead of one job of N ranks.
"""
from __future__ import annotations

import logging
import os
from typing import Mapping

from . import mpich, openmpi, slurm
from .base import Launcher

__all__ = ["Launcher", "detect", "check_world_size"]

_log = logging.getLogger("mpidist")
_READERS = (openmpi, slurm, mpich)  # mpirun inside an allocation wins over the allocation itself


def detect(environ: Mapping[str, str] | None = None) -> Launcher:
    """The launcher that started this process; ``Launcher("singleton", 1, 0)`` when none is found."""
    env = os.environ if environ is None else environ
    for reader in _READERS:
        found = reader.detect(env)
        if found is not None:
            return found
    return Launcher(name="singleton", tasks=1, rank=0)


def check_world_size(world_size: int, environ: Mapping[str, str] | None = None) -> str | None:
    """Warn (once per call) when the launcher started several tasks but MPI sees a world of one.

    Returns the warning text, or ``None`` when sizes agree.
    """
    launcher = detect(environ)
    if launcher.tasks <= 1 or world_size != 1:
        return None
    message = (f"{launcher.name} started {launcher.tasks} tasks but MPI_COMM_WORLD has size 1 in task "
               f"{launcher.rank}: each task is running as a separate singleton job. {launcher.hint}")
    _log.warning(message)
    return message
