"""The record every launcher reader returns."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True)
class Launcher:
    name: str          # "srun", "mpirun (Open MPI)", "mpiexec (MPICH/Hydra)", "singleton"
    tasks: int         # how many processes the launcher started for this job step
    rank: int          # this process's index among them
    detail: str = ""   # e.g. the PMI plugin srun used
    hint: str = ""     # what to do when MPI disagrees with the launcher


def int_var(env: Mapping[str, str], *names: str) -> int | None:
    """The first of ``names`` set to an integer in ``env``."""
    for name in names:
        value = env.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return None
