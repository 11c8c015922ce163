"""join, barrier and broadcast_variables."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import tensorflow as tf

from . import joins, runner
from .process_sets import ProcessSet, global_process_set
from .raw import wire


def barrier(process_set: ProcessSet = global_process_set) -> Any:
    """Wait until every rank of the process set has called barrier."""
    engine = process_set.require_engine("barrier")

    def run(arrays: list[np.ndarray]) -> list[np.ndarray]:
        joins.collective(engine, "barrier", engine.barrier)
        return [arrays[0]]

    out = runner.execute("HorovodBarrier", run, [tf.constant(0, tf.int32)], [tf.int32], [[]], "barrier",
                         engine)
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

    return runner.execute("HorovodJoin", run, [tf.constant(0, tf.int32)], [tf.int32], [[]], "join",
                          engine)[0]


def _grouped_broadcast(tensors: Sequence[Any], root_rank: int, process_set: ProcessSet, name: str) -> list[tf.Tensor]:
    """``root_rank``'s values of ``tensors``, in one engine call (no gradient)."""
    where = "broadcast"
    engine = process_set.require_engine(where)
    wired = [wire(t) for t in tensors]

    def run(arrays: list[np.ndarray]) -> list[np.ndarray]:
        out = joins.collective(engine, where, lambda: engine.broadcast(list(arrays), root=root_rank))
        return [np.asarray(o).reshape(a.shape) for o, a in zip(out, arrays)]

    outs = runner.execute(name, run, [w for w, _ in wired], [w.dtype for w, _ in wired],
                          [w.shape for w, _ in wired], where, engine)
    return [tf.cast(o, d) if o.dtype != d else o for o, (_, d) in zip(outs, wired)]


def broadcast_(variables: Any, root_rank: int, name: str | None = None,
               process_set: ProcessSet = global_process_set) -> Any:
    """In-place broadcast: assign ``root_rank``'s values to ``variables`` (a tf.Variable or a list of
    them) on every rank, in one engine call; returns the new values (a tensor, or a list of them)."""
    single = not isinstance(variables, (list, tuple))
    variables = [variables] if single else list(variables)
    if not variables:
        return []
    with runner.guard(process_set, "broadcast"):
        values = _grouped_broadcast(variables, root_rank, process_set,
                                    runner.scope_name(name, "HorovodBroadcastInplace"))
    assigns = [v.assign(x) for v, x in zip(variables, values)]
    if tf.executing_eagerly():
        out = [tf.convert_to_tensor(v) for v in variables]
    else:
        with tf.control_dependencies(assigns):
            out = [tf.identity(x) for x in values]
    return out[0] if single else out


def broadcast_variables(variables: Sequence[Any], root_rank: int,
                        process_set: ProcessSet = global_process_set, inplace: bool = False) -> Any:
    """Assign ``root_rank``'s values to ``variables`` on every rank (one engine call for all of them).

    Eagerly the variables are assigned at once; in a graph the grouped assign op is returned.
    ``inplace`` is accepted for Horovod's signature: the assignment is the same either way.
    """
    variables = list(variables)
    if not variables:
        return None if tf.executing_eagerly() else tf.no_op()
    with runner.guard(process_set, "broadcast"):
        values = _grouped_broadcast(variables, root_rank, process_set, "HorovodBroadcastVariables")
    assigns = [v.assign(x) for v, x in zip(variables, values)]
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
