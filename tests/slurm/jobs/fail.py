"""Slurm test job that fails on purpose: the job's exit code must say so.

    fail.py exit CODE   every rank finishes its allreduce, then exits with CODE
    fail.py raise       the last rank raises; the others wait in a second allreduce until
                        mpidist's excepthook aborts the job (MPI_Abort)
"""
from __future__ import annotations

import sys

import numpy as np

import mpidist

engine = mpidist.Engine()
engine.allreduce(np.ones(3))
mode = sys.argv[1] if len(sys.argv) > 1 else ""
if mode == "exit":
    print(f"rank {engine.rank}: exiting with {sys.argv[2]}", flush=True)
    sys.exit(int(sys.argv[2]))
if mode == "raise":
    if engine.rank == engine.size - 1:
        raise RuntimeError(f"rank {engine.rank} fails on purpose")
    engine.allreduce(np.ones(3))  # never completes: the failing rank is gone
    print(f"rank {engine.rank}: second allreduce returned, which it must not", flush=True)
    sys.exit(0)
sys.exit(f"usage: fail.py exit CODE | fail.py raise (got {sys.argv[1:]})")
