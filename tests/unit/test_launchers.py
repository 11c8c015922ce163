"""Launcher detection and the warning for srun with a --mpi plugin that does not match."""
from __future__ import annotations

import logging

from mpidist.topology import launchers


def test_detect_each_launcher():
    assert launchers.detect({}).name == "singleton"
    assert launchers.detect({"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "2"}).tasks == 4
    srun = launchers.detect({"SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "8", "SLURM_MPI_TYPE": "pmi2"})
    assert (srun.name, srun.tasks, srun.rank, srun.detail) == ("srun", 8, 1, "--mpi=pmi2")
    hydra = launchers.detect({"PMI_SIZE": "3", "PMI_RANK": "0"})
    assert hydra.name.startswith("mpiexec") and hydra.tasks == 3
    # mpirun inside a Slurm allocation: mpirun is the launcher of this process
    both = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1"}
    assert launchers.detect(both).name == "mpirun (Open MPI)"
    # the batch script of a 4-task allocation is one process: no singleton warning for it
    batch = launchers.detect({"SLURM_PROCID": "0", "SLURM_NTASKS": "4"})
    assert batch.name.startswith("sbatch") and batch.tasks == 1 and batch.detail == "allocation of 4 tasks"
    assert launchers.check_world_size(1, {"SLURM_PROCID": "0", "SLURM_NTASKS": "4"}) is None


def test_warns_when_srun_tasks_run_as_singletons(caplog):
    env = {"SLURM_PROCID": "3", "SLURM_STEP_NUM_TASKS": "4", "SLURM_MPI_TYPE": "none"}
    with caplog.at_level(logging.WARNING, logger="mpidist"):
        message = launchers.check_world_size(1, env)
    assert message and "srun started 4 tasks but MPI_COMM_WORLD has size 1 in task 3" in message
    assert "srun --mpi=pmix" in message and message in caplog.text
    assert launchers.check_world_size(4, env) is None
    assert launchers.check_world_size(1, {}) is None
