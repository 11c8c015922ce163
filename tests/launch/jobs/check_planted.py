"""``python -m mpidist check`` with something planted, for tests/launch/test_check_jobs.py.

    check_planted.py MODE [CHECK ARGS...]

MODE: ``none`` (as is); ``wrong-allgather`` (rank 1's allgather results are off by one: a broken
collective on one rank); ``raise-reduce-scatter`` (reduce_scatter raises on every rank);
``fake-gpu`` (the host fake of CuPy/NCCL of tests/mpi stands in for a GPU); ``tensorflow-cpu``
(only the TensorFlow check's reduction, on a CPU tensor: its code path without a GPU). Every rank
prints ``EXIT rank=R code=C`` with the exit status it returns.
"""
from __future__ import annotations

import os
import sys

import numpy as np
from mpi4py import MPI

import mpidist
from mpidist import check
from mpidist.check import gpu
from mpidist.check.results import Outcome

mode, args = sys.argv[1], sys.argv[2:]
rank = MPI.COMM_WORLD.Get_rank()
if mode == "wrong-allgather":
    if rank == 1:
        original = mpidist.Engine.allgather
        mpidist.Engine.allgather = lambda self, value, **kw: np.asarray(original(self, value, **kw)) + 1
elif mode == "raise-reduce-scatter":
    def planted(self, value, *a, **kw):
        raise RuntimeError(f"planted failure on rank {rank}")
    mpidist.Engine.reduce_scatter = planted
elif mode == "fake-gpu":
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "mpi"))
    import fake_cupy
    from mpidist.collectives.gpu import cupy_arrays
    cupy_arrays.forget()
    fake_cupy.install()
elif mode == "tensorflow-cpu":
    def cpu_tensorflow(ctx) -> Outcome:
        return gpu.tensorflow_reduce(ctx, "/CPU:0")
    check.CHECKS[:] = [("TensorFlow reduce (CPU tensor)", cpu_tensorflow)]
elif mode != "none":
    sys.exit(f"check_planted.py: unknown MODE {mode!r}")
code = check.main(args)
print(f"EXIT rank={rank} code={code}", flush=True)
sys.exit(code)
