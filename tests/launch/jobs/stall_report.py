"""Rank 1 is late (busy in user code) while the others wait in an allreduce."""
import time

import numpy as np

import mpidist


def busy_in_user_code(seconds: float) -> None:
    time.sleep(seconds)


engine = mpidist.Engine()
engine.allreduce(np.ones(2))
if engine.rank == 1:
    busy_in_user_code(4.0)
engine.allreduce(np.ones(2))
print(f"rank {engine.rank}: done", flush=True)
