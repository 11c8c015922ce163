"""A Horovod program on mpidist whose rank 1 is late: HOROVOD_STALL_CHECK_TIME_SECONDS gives the report."""
import time

import tensorflow as tf

import mpidist.horovod.tensorflow as hvd


def busy_in_user_code(seconds: float) -> None:
    time.sleep(seconds)


hvd.init()
hvd.allreduce(tf.ones([2]))
if hvd.rank() == 1:
    busy_in_user_code(4.0)
hvd.allreduce(tf.ones([2]))
print(f"rank {hvd.rank()}: done", flush=True)
