"""join, barrier and broadcast_variables."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import tensorflow as tf

from . import joins, runner
from .gather import broadcast
from .process_sets import ProcessSet, global_process_set


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Wait until every rank of the process set has called barrier."""
    engine = process_set.require_engine("barrier")

    def run(arrays: list[np.ndarray]) -> list[np.ndarray]:
        joins.collective(engine, "barrier", engine.barrier)
        return [arrays[0]]

    out = runner.execute("HorovodBarrier", run, [tf.constant(0, tf.int32)], [tf.int32], [[]], "barrier")
    return None if tf.executing_eagerly() else out[0].op


def join(device: str = "", process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """This rank has no more data: stand in (with zeros) for the allreduces of the ranks still
    training until every rank has joined. Returns the last rank that joined (an int32 tensor, the
    same on every rank). See joins.py; while a rank has joined, collectives other than allreduce
    are an error on every rank, as in Horovod.
    """
    engine = process_set.require_engine("join")

    def run(arrays: list[np.ndarray]) -> list[np.ndarray]:
        return [np.asarray(joins.join(engine), np.int32).reshape(())]

    return runner.execute("HorovodJoin", run, [tf.constant(0, tf.int32)], [tf.int32], [[]], "join")[0]


def broadcast_variables(variables: Sequence[Any], root_rank: int,
                        process_set: ProcessSet = global_process_set, inplace: bool = False) -> Any:
    """Assign ``root_rank``'s values to ``variables`` on every rank (one engine call per variable).

    Eagerly the variables are assigned at once; in a graph the grouped assign op is returned.
    """
    variables = list(variables)
    assigns = [v.assign(broadcast(v, root_rank, name=f"broadcast_var_{i}", process_set=process_set))
               for i, v in enumerate(variables)]
    if tf.executing_eagerly():
        return None
    return tf.group(*assigns)


def broadcast_global_variables(root_rank: int) -> Any:
    """In a tf.compat.v1 graph: the op that broadcasts every global variable from ``root_rank``.

    Eagerly there is no global variable collection (as in Horovod, this raises); use
    ``broadcast_variables(model.variables, root_rank)``.
    """
    if tf.executing_eagerly():
        raise RuntimeError("hvd.broadcast_global_variables() does not support eager execution. "
                           "Please use `hvd.broadcast_variables(<model/optimizer variables>)` instead.")
    return broadcast_variables(tf.compat.v1.global_variables(), root_rank)
