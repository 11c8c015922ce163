"""The last rank is a straggler; the others use timeout_seconds.

Usage: stall.py TIMEOUT MODE [tf]
  MODE late:      the straggler arrives TIMEOUT + 2 s late (it then times out in the step the others
                  never issue); every rank catches DeadlineExceededError and finishes normally
  MODE never:     the straggler never reaches the collective, works TIMEOUT + 2 s, finishes normally
  MODE unhandled: the waiting ranks do not catch the error; the straggler sleeps 300 s
With "tf", the error is caught as tf.errors.DeadlineExceededError.
"""
import sys
import time

import numpy as np

timeout = float(sys.argv[1])
mode = sys.argv[2]
use_tf = "tf" in sys.argv[3:]
if use_tf:
    import tensorflow as tf
    Expected = tf.errors.DeadlineExceededError
import mpidist  # noqa: E402
from mpidist.errors import CommunicatorBrokenError, DeadlineExceededError  # noqa: E402

if not use_tf:
    Expected = DeadlineExceededError
engine = mpidist.Engine()
engine.allreduce(np.ones(4))  # everyone is here once
straggler = engine.rank == engine.size - 1
if straggler:
    time.sleep(300 if mode == "unhandled" else timeout + 2)
if straggler and mode != "late":
    print(f"rank {engine.rank}: finished (straggler)", flush=True)
    sys.exit(0)
start = time.monotonic()
if mode == "unhandled":
    engine.allreduce(np.ones(4), timeout_seconds=timeout)
try:
    engine.allreduce(np.ones(4), timeout_seconds=timeout)
except Expected as err:
    print(f"rank {engine.rank}: DEADLINE after {time.monotonic() - start:.3f} s: {type(err).__name__}: {err}",
          flush=True)
try:
    engine.allreduce(np.ones(4), timeout_seconds=timeout)
except CommunicatorBrokenError as err:
    print(f"rank {engine.rank}: BROKEN {err}", flush=True)
if engine.rank == 0:
    time.sleep(2)  # the chief still works (writes its results) after the others have ended
print(f"rank {engine.rank}: finished", flush=True)
