"""The last rank never reaches the collective; the others use timeout_seconds.

Usage: stall.py TIMEOUT [tf]  -- with "tf", catch it as tf.errors.DeadlineExceededError.
"""
import sys
import time

import numpy as np
from mpi4py import MPI

timeout = float(sys.argv[1])
use_tf = "tf" in sys.argv[2:]
if use_tf:
    import tensorflow as tf
    Expected = tf.errors.DeadlineExceededError
import mpidist  # noqa: E402
from mpidist.errors import CommunicatorBrokenError, DeadlineExceededError  # noqa: E402

if not use_tf:
    Expected = DeadlineExceededError
engine = mpidist.Engine()
engine.allreduce(np.ones(4))  # everyone is here once
stalled = engine.rank == engine.size - 1
# the ranks that wait: they meet here before exiting, so the first to reach its exit hook (which
# aborts the job) cannot kill another before that one has printed what the test reads
waiters = MPI.COMM_WORLD.Split(MPI.UNDEFINED if stalled else 0, engine.rank)
if stalled:
    time.sleep(300)  # stalled: never arrives
    sys.exit(0)
start = time.monotonic()
try:
    engine.allreduce(np.ones(4), timeout_seconds=timeout)
except Expected as err:
    print(f"rank {engine.rank}: DEADLINE after {time.monotonic() - start:.3f} s: {type(err).__name__}: {err}",
          flush=True)
try:
    engine.allreduce(np.ones(4), timeout_seconds=timeout)
except CommunicatorBrokenError as err:
    print(f"rank {engine.rank}: BROKEN {err}", flush=True)
print(f"rank {engine.rank}: exiting normally", flush=True)
waiters.Barrier()
