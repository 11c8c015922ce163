"""Rank 1 is late (busy in user code) while the others wait in an allreduce.

Usage: stall_report.py DIR [until-killed]. The rank that logs the stall report (the chief) writes
DIR/reported.<rank>; rank 1 stays busy until such a file is there, so the report comes however slow
the machine is; with "until-killed", until the job is aborted (at most 150 s).
"""
import logging
import os
import sys
import time

import numpy as np

import mpidist

directory = sys.argv[1]
until_killed = "until-killed" in sys.argv[2:]


class _Flag(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        if "mpidist: stall:" in record.getMessage():
            open(os.path.join(directory, f"reported.{engine.rank}"), "w").close()


def busy_in_user_code() -> None:
    others = [os.path.join(directory, f"reported.{r}") for r in range(engine.size) if r != engine.rank]
    deadline = time.monotonic() + 150
    while (until_killed or not any(os.path.exists(f) for f in others)) and time.monotonic() < deadline:
        time.sleep(0.05)


engine = mpidist.Engine()
log = logging.getLogger("mpidist")
log.addHandler(_Flag())
log.addHandler(logging.StreamHandler())  # (as logging's last resort prints them when no handler is set)
engine.allreduce(np.ones(2))
if engine.rank == 1:
    busy_in_user_code()
engine.allreduce(np.ones(2))
print(f"rank {engine.rank}: done", flush=True)
