"""A Horovod program on mpidist whose rank 1 is late: HOROVOD_STALL_CHECK_TIME_SECONDS gives the report.

Usage: horovod_stall.py DIR [until-killed]. Rank 0, once it has logged its stall report, writes
DIR/reported.0; rank 1 stays busy in user code until that file is there (at most 150 s), so the
report comes however slow the machine is; with "until-killed", until the job is aborted.
"""
import logging
import os
import sys
import time

import tensorflow as tf

import mpidist.horovod.tensorflow as hvd

directory = sys.argv[1]
until_killed = "until-killed" in sys.argv[2:]


class _Flag(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        if "mpidist: stall:" in record.getMessage():
            open(os.path.join(directory, f"reported.{hvd.rank()}"), "w").close()


def busy_in_user_code() -> None:
    reported = os.path.join(directory, "reported.0")
    deadline = time.monotonic() + 150
    while (until_killed or not os.path.exists(reported)) and time.monotonic() < deadline:
        time.sleep(0.05)


hvd.init()
log = logging.getLogger("mpidist")
log.addHandler(_Flag())
log.addHandler(logging.StreamHandler())  # (as logging's last resort prints them when no handler is set)
hvd.allreduce(tf.ones([2]))
if hvd.rank() == 1:
    busy_in_user_code()
hvd.allreduce(tf.ones([2]))
print(f"rank {hvd.rank()}: done", flush=True)
