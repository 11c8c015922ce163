"""Slurm: srun steps (SLURM_STEP_NUM_TASKS, SLURM_PROCID), and the batch script itself.

The batch script of an N-task allocation also sees SLURM_NTASKS=N and SLURM_PROCID=0, but it is one
process: only a step started by srun carries SLURM_STEP_NUM_TASKS.
"""
from __future__ import annotations

from typing import Mapping

from .base import Launcher, int_var


def detect(env: Mapping[str, str]) -> Launcher | None:
    rank = int_var(env, "SLURM_PROCID")
    if rank is None:
        return None
    tasks = int_var(env, "SLURM_STEP_NUM_TASKS")
    if tasks is None:  # the batch script: one process, whatever the allocation holds
        allocation = int_var(env, "SLURM_NTASKS")
        return Launcher(name="sbatch (batch script, not an srun step)", tasks=1, rank=0,
                        detail=f"allocation of {allocation} tasks" if allocation else "",
                        hint="Start the ranks with `srun --mpi=pmix` or mpirun inside the batch script.")
    plugin = env.get("SLURM_MPI_TYPE", "")
    return Launcher(
        name="srun", tasks=tasks, rank=rank,
        detail=f"--mpi={plugin}" if plugin else "",
        hint="Launch with `srun --mpi=pmix` (the plugin that the PyPI Open MPI wheel and most "
             "system Open MPI builds speak; `srun --mpi=list` shows what this cluster has), or use "
             "mpirun inside the allocation.")
