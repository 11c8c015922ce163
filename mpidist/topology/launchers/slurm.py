"""Slurm's srun: SLURM_STEP_NUM_TASKS / SLURM_NTASKS and SLURM_PROCID."""
from __future__ import annotations

from typing import Mapping

from ._base import Launcher, int_var


def detect(env: Mapping[str, str]) -> Launcher | None:
    rank = int_var(env, "SLURM_PROCID")
    tasks = int_var(env, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
    if rank is None or tasks is None:
        return None
    plugin = env.get("SLURM_MPI_TYPE", "")
    return Launcher(
        name="srun", tasks=tasks, rank=rank,
        detail=f"--mpi={plugin}" if plugin else "",
        hint="Launch with `srun --mpi=pmix` (the plugin that the PyPI Open MPI wheel and most "
             "system Open MPI builds speak; `srun --mpi=list` shows what this cluster has), or use "
             "mpirun inside the allocation.")
