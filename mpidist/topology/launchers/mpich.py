"""MPICH's Hydra mpiexec (and Intel MPI): PMI_SIZE and PMI_RANK."""
from __future__ import annotations

from typing import Mapping

from .base import Launcher, int_var


def detect(env: Mapping[str, str]) -> Launcher | None:
    rank = int_var(env, "PMI_RANK")
    tasks = int_var(env, "PMI_SIZE")
    if rank is None or tasks is None:
        return None
    return Launcher(name="mpiexec (MPICH/Hydra)", tasks=tasks, rank=rank,
                    hint="mpi4py is probably built against another MPI library than this mpiexec; "
                         "check `python -c 'from mpi4py import MPI; print(MPI.Get_library_version())'`.")
