"""Horovod's ``hvd.elastic`` names of the Keras module, for mpidist's fixed-size jobs.

Horovod's elastic mode needs ``horovodrun --elastic``, which adds and removes workers and
restarts ``run``'s function on the new set. An mpidist Horovod job is an ``mpirun``/``srun`` job of
fixed size, so here:

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

import functools
from typing import Any, Callable

import tensorflow as tf

from ....keras import flavor
from ..objects import broadcast_object
from ..sync import broadcast_variables

keras: Any = flavor.user_keras()


class TensorFlowKerasState:
    """State of a Keras model and optimizer plus attributes given as keyword arguments (Horovod's)."""

    def __init__(self, model: Any, optimizer: Any = None, backend: Any = None, **kwargs: Any) -> None:
        if not getattr(model, "built", True):
            raise ValueError("TensorFlowKerasState: the model must be built first; run `model.build(input_shape)`")
        self.model = model
        self.optimizer = optimizer if optimizer is not None else model.optimizer
        self.backend = backend
        self._reset_callbacks: list[Callable[[], None]] = []
        self._saved_state = dict(kwargs)
        self._set_attrs()
        self._save_model()

    def register_reset_callbacks(self, callbacks: list[Callable[[], None]]) -> None:
        """Functions to call after a reset (kept for Horovod's API; a fixed-size job never resets)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def reset(self) -> None:
        """Reset objects after a reset event (Horovod's hook; nothing to do here)."""

    def commit(self) -> None:
        """Keep the current state in this process's memory (the point ``restore`` goes back to)."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Never interrupts: the hosts of an mpirun/srun job do not change."""

    def save(self) -> None:
        self._save_model()
        self._saved_state = {name: getattr(self, name) for name in self._saved_state}

    def restore(self) -> None:
        """Go back to the last ``save``/``commit`` (or ``sync``)."""
        self._load_model()
        self._set_attrs()

    def sync(self) -> None:
        """Every rank gets rank 0's model and optimizer variables and committed attributes (collective)."""
        broadcast_variables(self.model.variables, root_rank=0)
        if self.optimizer is not None:
            broadcast_variables(flavor.optimizer_variables(self.optimizer), root_rank=0)
        self._save_model()
        if self._saved_state:
            self._saved_state = broadcast_object(self._saved_state, root_rank=0)
            self._set_attrs()

    def _set_attrs(self) -> None:
        for name, value in self._saved_state.items():
            setattr(self, name, value)

    def _optimizer_variables(self) -> list[Any]:
        return flavor.optimizer_variables(self.optimizer) if self.optimizer is not None else []

    def _save_model(self) -> None:
        self._saved_model_state = [tf.identity(v) for v in self.model.variables]
        self._saved_optimizer_state = [tf.identity(v) for v in self._optimizer_variables()]

    def _load_model(self) -> None:
        for var, saved in zip(self.model.variables, self._saved_model_state):
            var.assign(saved)
        for var, saved in zip(self._optimizer_variables(), self._saved_optimizer_state):
            var.assign(saved)


class KerasState(TensorFlowKerasState):
    """State of a ``tf.keras`` model and optimizer (Horovod's ``hvd.elastic.KerasState``)."""

    def __init__(self, model: Any, optimizer: Any = None, **kwargs: Any) -> None:
        super().__init__(model, optimizer=optimizer, backend=keras.backend, **kwargs)


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate ``func(state, *args, **kwargs)``: sync ``state``, then run ``func`` once (see the module)."""
    if not callable(func):
        raise TypeError(f"hvd.elastic.run: `func` must be callable, got {type(func).__name__}")

    @functools.wraps(func)
    def wrapper(state: Any, *args: Any, **kwargs: Any) -> Any:
        state.sync()
        return func(state, *args, **kwargs)

    return wrapper


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
