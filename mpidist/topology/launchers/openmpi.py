"""Open MPI's mpirun/prterun: OMPI_COMM_WORLD_SIZE and OMPI_COMM_WORLD_RANK."""
from __future__ import annotations

from typing import Mapping

from .base import Launcher, int_var


def detect(env: Mapping[str, str]) -> Launcher | None:
    rank = int_var(env, "OMPI_COMM_WORLD_RANK")
    tasks = int_var(env, "OMPI_COMM_WORLD_SIZE")
    if rank is None or tasks is None:
        return None
    return Launcher(name="mpirun (Open MPI)", tasks=tasks, rank=rank,
                    hint="mpi4py is probably built against another MPI library than this mpirun; "
                         "check `python -c 'from mpi4py import MPI; print(MPI.Get_library_version())'`.")
