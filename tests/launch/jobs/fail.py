"""One rank fails while the others wait in a collective. Usage: fail.py raise|kill|exit"""
import os
import signal
import sys
import time

import numpy as np

import mpidist

mode = sys.argv[1]
engine = mpidist.Engine()
engine.allreduce(np.ones(2))
if engine.rank == engine.size - 1:
    time.sleep(0.5)
    if mode == "raise":
        raise RuntimeError("boom on purpose")
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(3)
print(f"rank {engine.rank}: waiting in allreduce", flush=True)
engine.allreduce(np.ones(2))  # the last rank never comes
print(f"rank {engine.rank}: UNREACHABLE", flush=True)
