"""``BroadcastGlobalVariablesHook``: TensorFlow 1's ``MonitoredTrainingSession`` programs.

Horovod defined it on ``tf.estimator.SessionRunHook``, which is gone from TensorFlow 2.16+; here it
is a ``tf.compat.v1.train.SessionRunHook``, so a TF1-style script (``tf.compat.v1`` graph,
``MonitoredTrainingSession(hooks=[hvd.BroadcastGlobalVariablesHook(0)])``) runs unchanged.
"""
from __future__ import annotations

from typing import Any

import tensorflow as tf

from .process_sets import ProcessSet, global_process_set
from .sync import broadcast_variables


class BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook):
    """Broadcast every global variable from ``root_rank`` once the session exists (after the
    variables are initialized or restored), so every rank starts from the same values.

    ``device`` is where the broadcast op is placed (Horovod's argument); ``process_set``: the ranks
    taking part (the whole job by default)."""

    def __init__(self, root_rank: int, device: str = "", process_set: ProcessSet = global_process_set) -> None:
        super().__init__()
        self.root_rank = root_rank
        self.bcast_op: Any = None
        self.device = device
        self.process_set = process_set

    def begin(self) -> None:
        if self.bcast_op is None or self.bcast_op.graph is not tf.compat.v1.get_default_graph():
            with tf.device(self.device):
                self.bcast_op = broadcast_variables(tf.compat.v1.global_variables(), self.root_rank,
                                                    process_set=self.process_set)

    def after_create_session(self, session: Any, coord: Any) -> None:
        session.run(self.bcast_op)
