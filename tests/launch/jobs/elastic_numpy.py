"""Elastic NumPy loop: ranks SIGKILL themselves at given steps; the survivors shrink and go on.

Usage: elastic_numpy.py STEPS [RANK:STEP ...]  (original COMM_WORLD rank RANK dies before step STEP)

Gradients depend on each process's ORIGINAL rank and the step, with integer values, so the test
recomputes the result exactly from the state every segment started from and who took part in it.
Each survivor prints one line ``RESULT {json}`` at the end; the dying rank prints ``KILLING``.
"""
import json
import logging
import os
import signal
import sys
import time

import numpy as np
from mpi4py import MPI

import mpidist

logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
steps = int(sys.argv[1])
kills = {int(r): int(s) for r, s in (a.split(":") for a in sys.argv[2:])}
me = MPI.COMM_WORLD.Get_rank()


def gradient(rank: int, step: int) -> np.ndarray:
    return (rank + 1) * (step + 1) * np.arange(1, 5, dtype=np.float64)


strategy = mpidist.MultiWorkerMirroredStrategy()
state = mpidist.elastic.ObjectState(strategy, step=0, w=np.zeros(4))
segments = []  # (step, w, survivors' original ranks, wall time) at every (re)start of train


@mpidist.elastic.run
def train(state):
    survivors = strategy.gather(np.array([me]), axis=0)
    segments.append({"step": state.step, "w": state.w.tolist(), "ranks": survivors.tolist(), "t": time.time()})
    while state.step < steps:
        if kills.get(me) == state.step:
            print(f"KILLING rank={me} step={state.step} t={time.time():.6f}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        total = strategy.reduce("SUM", gradient(me, state.step))
        state.w = state.w + total
        state.step += 1
        state.commit()


train(state)
print("RESULT " + json.dumps({"rank": me, "w": state.w.tolist(), "step": state.step, "segments": segments,
                              "recoveries": [r.seconds for r in mpidist.elastic.recoveries()],
                              "size": strategy.num_replicas_in_sync}), flush=True)
mpidist.elastic.shutdown()  # skips MPI_Finalize after a recovery (see its docstring)
