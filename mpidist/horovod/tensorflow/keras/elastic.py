"""Horovod's ``hvd.elastic`` names of the Keras module, for mpidist's fixed-size jobs.

Horovod's elastic mode needs ``horovodrun --elastic``, which adds and removes workers and
restarts ``run``'s function on the new set. An mpidist Horovod job is an ``mpirun``/``srun`` job of
fixed size, so here (the states and ``run`` are the TensorFlow module's, tensorflow/elastic.py):

- ``KerasState(model, optimizer=None, **kwargs)`` (and ``TensorFlowKerasState``) behave as
  Horovod's: ``sync()`` broadcasts rank 0's model and optimizer variables and its committed
  attributes; ``commit()`` keeps the current values in this process (``save()``), ``restore()``
  goes back to them; ``register_reset_callbacks`` is kept (no reset ever happens);
  ``check_host_updates()`` never interrupts (the set of hosts never changes);
- ``run(func)``: syncs the state, then calls ``func(state, ...)`` once. A rank that dies ends the
  job as any failure does; to survive deaths of ranks use ``mpidist.elastic`` (ULFM) with an
  mpidist strategy, see docs/elastic.md;
- ``CommitStateCallback``, ``UpdateBatchStateCallback``, ``UpdateEpochStateCallback``: Horovod's
  Keras callbacks, for the Keras of ``tf.keras`` (Keras 3, or Keras 2 under TF_USE_LEGACY_KERAS=1).
"""
from __future__ import annotations

from typing import Any

from ....tensorflow.keras import flavor
from ..elastic import TensorFlowKerasState, run

keras: Any = flavor.user_keras()


class KerasState(TensorFlowKerasState):
    """State of a ``tf.keras`` model and optimizer (Horovod's ``hvd.elastic.KerasState``)."""

    def __init__(self, model: Any, optimizer: Any = None, **kwargs: Any) -> None:
        super().__init__(model, optimizer=optimizer, backend=keras.backend, **kwargs)


class CommitStateCallback(keras.callbacks.Callback):
    """Commit ``state`` every ``batches_per_commit`` batches and at the end of each epoch."""

    def __init__(self, state: Any, batches_per_commit: int = 1) -> None:
        super().__init__()
        self.state = state
        self.batches_per_commit = batches_per_commit
        self.batches_remaining = batches_per_commit

    def on_train_begin(self, logs: Any = None) -> None:
        self.batches_remaining = self.batches_per_commit

    def on_batch_end(self, batch: int, logs: Any = None) -> None:
        self.batches_remaining -= 1
        if self.batches_remaining == 0:
            self.state.commit()
            self.batches_remaining = self.batches_per_commit

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.state.commit()


class UpdateBatchStateCallback(keras.callbacks.Callback):
    """``state.batch`` = the batch just finished (0 again at each epoch's end); with a known number of
    steps, the first epoch after a reset is shortened by the batches already done (Horovod's)."""

    def __init__(self, state: Any) -> None:
        super().__init__()
        self.state = state
        self.steps_per_epoch: int | None = None

    def on_train_begin(self, logs: Any = None) -> None:
        self.steps_per_epoch = None

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        if self.params.get("steps"):
            if self.steps_per_epoch is None:
                self.steps_per_epoch = self.params.get("steps")
            self.params["steps"] = self.steps_per_epoch - self.state.batch

    def on_batch_end(self, batch: int, logs: Any = None) -> None:
        self.state.batch = batch

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.state.batch = 0


class UpdateEpochStateCallback(keras.callbacks.Callback):
    """``state.epoch`` = the epochs done so far, counted across fits (Horovod's)."""

    def __init__(self, state: Any) -> None:
        super().__init__()
        self.state = state
        self.initial_epoch = self.state.epoch

    def on_train_begin(self, logs: Any = None) -> None:
        self.initial_epoch = self.state.epoch

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.state.epoch = self.initial_epoch + epoch + 1


__all__ = ["KerasState", "TensorFlowKerasState", "CommitStateCallback", "UpdateBatchStateCallback",
           "UpdateEpochStateCallback", "run"]
