"""A deadline inside a ``tf.function`` reaches the program as ``tf.errors.DeadlineExceededError``.

TensorFlow turns any exception raised in a ``tf.numpy_function`` / ``tf.py_function`` into
``UnknownError`` (its py_func kernel maps ValueError/TypeError to InvalidArgument, StopIteration
to OutOfRange, and everything else to Unknown; an exception that is itself a
``tf.errors.DeadlineExceededError`` is no exception: tested with TensorFlow 2.21). So the
collective's Python function, when it gets mpidist's ``DeadlineExceededError``, logs the message
and returns a flag instead; the graph then runs, only when the flag is set, an op whose own kernel
fails with DEADLINE_EXCEEDED: TensorFlow's CollectiveReduceV2 in a group of two that no second
member ever joins, with a tiny ``timeout_seconds``. The program sees a genuine
``tf.errors.DeadlineExceededError`` (TensorFlow's message: "Collective has timed out waiting for
other workers", at node ``<collective>_deadline_exceeded``); mpidist's own message (which
collective, which ranks) is in the log. That op also aborts TensorFlow's own collective executor
for the process, as a timed-out TensorFlow collective does; mpidist's engine is broken by then
too (``CommunicatorBrokenError``).

Built only for collectives that have a deadline (``timeout_seconds`` in the call's options or
``rc.timeout_seconds``): the others' graphs are unchanged.
"""
from __future__ import annotations

import logging
from typing import Callable

import numpy as np
import tensorflow as tf

from ..errors import DeadlineExceededError

_log = logging.getLogger("mpidist")
_GROUP_KEY = 0x6D7069  # a group of 2 of which this process is the only member
_INSTANCE_KEY = 1
_TIMEOUT = 1e-3        # seconds TensorFlow's op waits for the member that never comes


def reporting(func: Callable[..., list[np.ndarray]]) -> Callable[..., list[np.ndarray]]:
    """``func`` with one more output, a bool: True when its collective missed its deadline (the
    other outputs are then the inputs, never used: the graph fails before anything reads them)."""
    def timed(*arrays: np.ndarray) -> list[np.ndarray]:
        try:
            return list(func(*arrays)) + [np.array(False)]
        except DeadlineExceededError as error:
            _log.error("mpidist: %s (raised in the tf.function as tf.errors.DeadlineExceededError)", error)
            return [np.asarray(a) for a in arrays] + [np.array(True)]
    return timed


def _fail_with_deadline_exceeded(name: str) -> tf.Tensor:
    with tf.device("/device:CPU:0"):  # host memory: no NCCL group is ever formed for it
        return _lone_collective(name)


def _lone_collective(name: str) -> tf.Tensor:
    return tf.raw_ops.CollectiveReduceV2(
        input=tf.zeros([1]), group_size=tf.constant(2), group_key=tf.constant(_GROUP_KEY),
        instance_key=tf.constant(_INSTANCE_KEY), ordering_token=[], merge_op="Add", final_op="Id",
        communication_hint="auto", timeout_seconds=_TIMEOUT, name=f"{name}_deadline_exceeded")


def raise_if_late(late: tf.Tensor, outs: list[tf.Tensor], name: str) -> list[tf.Tensor]:
    """``outs``, after an op that fails with DEADLINE_EXCEEDED when ``late`` is True."""
    check = tf.cond(tf.reshape(late, []), lambda: _fail_with_deadline_exceeded(name), lambda: tf.zeros([1]))
    with tf.control_dependencies([check]):
        return [tf.identity(o) for o in outs]
