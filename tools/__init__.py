"""Developer tools of the mpidist repository (not installed with the package).

Run them from the repository root, under mpirun where they measure:

- ``python -m tools.sweep``: nccl-tests-style table of the engine's collectives against raw mpi4py;
- ``python -m tools.tf_bench`` / ``python -m tools.tf_sweep``: TensorFlow: mpidist against raw MPI
  and TensorFlow's own MultiWorkerMirroredStrategy;
- ``python -m tools.xla_bench``: Keras step time with and without ``jit_compile`` under an mpidist
  strategy and in plain Keras;
- ``python -m tools.costmodel [fit]``: the allreduce cost model, 1 to 10 000 ranks, and its fit to
  measured sweeps (serial).

They import mpidist like any program does; nothing in ``mpidist`` imports them.
"""
