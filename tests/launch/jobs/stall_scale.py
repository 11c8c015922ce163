"""The last rank is late in one allreduce; what the job does then is set by the settings.

Usage: stall_scale.py DIR MODE, with MPIDIST_STALL_SECONDS set (short) and MODE:
  go-on:    the late rank stays busy 2x the stall time, and on until its monitor has answered the
            chief's question (however slow the machine, the report has been gathered), then arrives;
            every rank prints its result check
  abort:    the late rank never arrives (busy until killed, at most 120 s); MPIDIST_STALL_ABORT_SECONDS
            ends the job
  deadline: the late rank arrives once every other rank has caught its DeadlineExceededError
            (MPIDIST_TIMEOUT_SECONDS; each writes DIR/timed_out.<rank>), then times out itself in the
            step the others never issued; every rank prints its error and exits with status 3
The chief prints ``stall-scale {json}``: the stall reports it logged and every rank's count of
stall-report messages (collectives/stall.py's Monitor.messages) once the report is in.
"""
import json
import logging
import os
import sys
import time

import numpy as np
from mpi4py import MPI

import mpidist
from mpidist.errors import DeadlineExceededError

directory, mode = sys.argv[1], sys.argv[2]
CAP = 120.0  # a wait that would mean a bug (the test then fails on its assertions or its timeout)
reports: list[str] = []


class _Reports(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("mpidist: stall:"):
            reports.append(record.getMessage())


def wait_for(condition) -> None:
    deadline = time.monotonic() + CAP
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)  # (sleeping releases the GIL: the monitor thread runs)


def busy_in_user_code() -> None:
    start, stall = time.monotonic(), mpidist.rc.stall_seconds
    if mode == "go-on":
        wait_for(lambda: time.monotonic() - start >= 2 * stall and monitor.messages >= 1)
    elif mode == "abort":
        wait_for(lambda: False)
    else:
        others = [os.path.join(directory, f"timed_out.{r}") for r in range(engine.size) if r != engine.rank]
        wait_for(lambda: time.monotonic() - start >= 2 * stall and all(map(os.path.exists, others)))


engine = mpidist.Engine()
monitor = engine.pipeline.monitor
assert monitor is not None, "the stall monitor needs MPI_THREAD_MULTIPLE"
log = logging.getLogger("mpidist")
log.addHandler(_Reports())
log.addHandler(logging.StreamHandler())  # (as logging's last resort prints them when no handler is set)
rank, size = engine.rank, engine.size
late = size - 1
engine.allreduce(np.ones(2))  # every rank here once
if rank == late:
    busy_in_user_code()
try:
    total = engine.allreduce(np.full(3, rank + 1.0))
except DeadlineExceededError as err:
    open(os.path.join(directory, f"timed_out.{rank}"), "w").close()
    print(f"rank {rank}: DeadlineExceededError: {err}", flush=True)
    sys.exit(3)
ok = bool(np.array_equal(total, np.full(3, size * (size + 1) / 2)))
if rank == 0:
    wait_for(lambda: reports)  # the last answer may reach the chief after the collective ended
messages = MPI.COMM_WORLD.gather(monitor.messages, root=0)
if rank == 0:
    print("stall-scale " + json.dumps({"size": size, "reports": reports, "messages": messages}), flush=True)
print(f"rank {rank}: result {'correct' if ok else f'WRONG {total}'}", flush=True)
