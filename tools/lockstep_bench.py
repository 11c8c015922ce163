"""``python -m tools.lockstep_bench``: what the preemption agreement adds to a training step.

Run under mpirun, e.g. ``mpirun -n 2 python -m tools.lockstep_bench [--tensorflow]`` (rank 0
prints). In ONE run, blocks of every case interleaved (mpidist/bench/timing.py), medians per step
and paired ratios against the step alone:

- a NumPy step (one 2 KB ``Allreduce``) alone; followed by ``LockstepMax.collect()`` + ``post()``
  (mpidist/collectives/lockstep.py) with its persistent request (``MPI_Allreduce_init``), and with
  an ``Iallreduce`` per step; and by a blocking ``Allreduce`` of the same two integers (the round
  trip the lockstep exchange avoids);
- ``--tensorflow``: a ``tf.function`` step of ``strategy.reduce`` under mpidist's
  MultiWorkerMirroredStrategy called directly, through ``PreemptionCheckpointHandler.run``
  (mpidist/tensorflow/preemption.py), and followed by the blocking ``Allreduce``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from typing import Callable

import numpy as np
from mpi4py import MPI

from mpidist.bench.timing import paired_ratios, samples
from mpidist.collectives.lockstep import LockstepMax


def _blocking(comm: MPI.Intracomm) -> Callable[[], None]:
    flag, out = np.zeros(2, np.int64), np.zeros(2, np.int64)
    return lambda: comm.Allreduce(flag, out, op=MPI.MAX)


def numpy_cases(comm: MPI.Intracomm) -> dict[str, Callable[[], object]]:
    data = np.zeros(256)
    persistent, per_post = LockstepMax(comm, width=2), LockstepMax(comm, width=2, persistent=False)
    blocking = _blocking(comm.Clone())

    def step() -> None:
        comm.Allreduce(MPI.IN_PLACE, data, op=MPI.SUM)

    def lockstep(vote: LockstepMax) -> Callable[[], None]:
        def call() -> None:
            vote.collect()
            vote.post(0, 0)
            step()
        return call

    def blocked() -> None:
        blocking()
        step()

    return {"step alone": step, "lockstep (persistent)": lockstep(persistent),
            "lockstep (Iallreduce)": lockstep(per_post), "blocking Allreduce": blocked}


def tensorflow_cases(comm: MPI.Intracomm) -> dict[str, Callable[[], object]]:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    import mpidist
    strategy = mpidist.MultiWorkerMirroredStrategy()
    directory = comm.bcast(tempfile.mkdtemp(prefix="lockstep-bench-") if comm.Get_rank() == 0 else None)
    with strategy.scope():
        v = tf.Variable(tf.zeros(4))
        handler = tf.distribute.experimental.PreemptionCheckpointHandler(
            strategy.cluster_resolver, tf.train.Checkpoint(v=v), directory)

    @tf.function
    def step() -> object:
        return strategy.reduce("SUM", strategy.run(lambda: tf.ones(512)), axis=None)

    blocking = _blocking(comm.Clone())

    def blocked() -> object:
        blocking()
        return step()

    return {"step alone": step, "handler.run(step)": lambda: handler.run(step), "blocking Allreduce": blocked}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tensorflow", action="store_true", help="the TensorFlow handler instead of NumPy")
    parser.add_argument("--seconds", type=float, default=6.0, help="time per run of the interleaved blocks")
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    cases = tensorflow_cases(comm) if args.tensorflow else numpy_cases(comm)
    times = samples(comm, cases, args.seconds)
    ratios = paired_ratios(times, "step alone")
    if comm.Get_rank() == 0:
        base = statistics.median(times["step alone"])
        library = MPI.Get_library_version().split(",")[0]
        print(f"{comm.Get_size()} ranks, {len(times['step alone'])} rounds, {library}")
        for name, t in times.items():
            median = statistics.median(t)
            print(f"{name:24s} {median * 1e6:9.2f} us/step  +{(median - base) * 1e6:7.2f} us  "
                  f"x{ratios[name]:.3f} (paired)")


if __name__ == "__main__":
    main()
