"""The last rank never arrives; rank 0 blocks in a strategy-level collective with a deadline
(tests/launch/test_deadline_jobs.py runs gather; the other kinds pass here too).

Usage: strategy_deadline.py reduce|gather|broadcast_to|dataset  (MPIDIST_TIMEOUT_SECONDS sets the deadline)
The straggler works 3 s longer and ends normally; the others catch the error: the job exits 0.
"""
import sys
import time

import numpy as np

import mpidist
from mpidist.errors import DeadlineExceededError

kind = sys.argv[1]
strategy = mpidist.MultiWorkerMirroredStrategy()
rank = strategy.extended.rank
strategy.reduce("SUM", np.ones(1), axis=None)  # everyone is here once
if rank == strategy.num_replicas_in_sync - 1:
    time.sleep(3)
    print(f"rank {rank}: finished (straggler)", flush=True)
    sys.exit(0)
start = time.monotonic()
try:
    if kind == "reduce":
        strategy.reduce("SUM", np.ones(3), axis=0)
    elif kind == "gather":
        strategy.gather(np.ones((2, 2)), axis=1)
    elif kind == "broadcast_to":
        strategy.extended.broadcast_to(np.ones(2), destinations=None)
    else:
        for _ in strategy.experimental_distribute_dataset([np.ones((4, 2))] * 3):
            pass
except DeadlineExceededError as err:
    print(f"rank {rank}: DEADLINE {kind} after {time.monotonic() - start:.2f} s: {err}", flush=True)
print(f"rank {rank}: finished", flush=True)
