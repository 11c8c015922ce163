"""Preemption: ``mpidist.elastic.on_preemption(state, PATH)``; a SIGUSR1 to every rank makes the chief
write the last commit to PATH and the job exit 0; a relaunch resumes from it.

Usage: elastic_preempt.py PATH STEPS, or PATH +K: no end before a preemption, K more steps after
a resume (one command line for a job and its requeued run); ``--step-seconds=S``: in a run that
did not resume, each step after the READY line also computes for S seconds (a sleep standing for a
long step). Gradients as in elastic_numpy.py. Every rank prints
``READY rank pid`` after its first commit, ``EXIT step=..`` when it leaves (preempted or not), and
``RESULT {json}`` when training finishes.
"""
import json
import logging
import sys
import time

import numpy as np
from mpi4py import MPI

import mpidist

logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
path, steps_arg = sys.argv[1], sys.argv[2]
step_seconds = float(next((a.split("=")[1] for a in sys.argv[3:] if a.startswith("--step-seconds=")), 0))
me = MPI.COMM_WORLD.Get_rank()


def gradient(rank: int, step: int) -> np.ndarray:
    return (rank + 1) * (step + 1) * np.arange(1, 5, dtype=np.float64)


strategy = mpidist.MultiWorkerMirroredStrategy()
state = mpidist.elastic.ObjectState(strategy, step=0, w=np.zeros(4))
preemption = mpidist.elastic.on_preemption(state, path)
start = {"step": state.step, "w": state.w.tolist(), "resumed": preemption.resumed}
if not steps_arg.startswith("+"):
    steps = int(steps_arg)
else:
    steps = state.step + int(steps_arg[1:]) if preemption.resumed else 2 ** 62


@mpidist.elastic.run
def train(state):
    while state.step < steps:
        if step_seconds and state.commits >= 2 and not preemption.resumed:
            time.sleep(step_seconds)  # a long step's computation, not a synchronisation
        state.w = state.w + strategy.reduce("SUM", gradient(me, state.step))
        state.step += 1
        state.commit()
        if state.commits == 2:
            import os
            print(f"READY {me} {os.getpid()}", flush=True)


try:
    train(state)
finally:
    print(f"EXIT rank={me} step={state.step}", flush=True)
print("RESULT " + json.dumps({"rank": me, "w": state.w.tolist(), "step": state.step, "start": start,
                              "size": strategy.num_replicas_in_sync}), flush=True)
