"""Which process prints: rank 0 of an MPI job, or the only process of a serial run."""
from __future__ import annotations

import sys


def is_chief() -> bool:
    """Rank 0 of an initialised MPI job, or a serial run; never imports mpi4py itself."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None or not mpi.Is_initialized() or mpi.Is_finalized():
        return True
    return mpi.COMM_WORLD.Get_rank() == 0
