"""Horovod's ``hvd.elastic`` for TensorFlow: ObjectState, TensorFlowState, TensorFlowKerasState, ``run``.

A state keeps a saved copy of its attributes (and, for TensorFlowState, of its variables' values):
``commit()`` saves the current values, ``restore()`` goes back to the saved ones, ``sync()`` gives
every rank the root rank's (the variables' current values and the saved attributes, through
``hvd.broadcast_variables`` / ``hvd.broadcast_object``: agreement-checked engine collectives) and
saves them. That is Horovod's behaviour.

What differs: an mpidist.horovod job has a fixed size, so there are no host updates to react to;
``run(func)`` syncs the state and calls ``func(state, ...)``. A job that must survive the loss of
ranks uses mpidist's own ``mpidist.elastic`` (ULFM; docs/elastic.md). TensorFlowState works
eagerly (a v1 graph's ``session`` is not supported). ``check_host_updates()`` never interrupts and
``register_reset_callbacks`` is kept, but a reset never happens. The Keras module's ``elastic``
(keras/elastic.py) adds ``KerasState`` and Horovod's Keras callbacks on top of these.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from ...tensorflow.keras import flavor
from .basics import rank
from .objects import broadcast_object
from .sync import broadcast_variables


class ObjectState:
    """Attributes given as keyword arguments, saved, restored and synced (Horovod's ObjectState).

    ``bcast_object(obj)`` broadcasts from rank 0 (default: ``hvd.broadcast_object``); ``get_rank``
    is accepted for Horovod's signature."""

    def __init__(self, bcast_object: Callable[[Any], Any] | None = None, get_rank: Callable[[], int] | None = None,
                 **kwargs: Any) -> None:
        self._bcast_object = bcast_object if bcast_object is not None else broadcast_object
        self._get_rank = get_rank if get_rank is not None else rank
        self._saved_state = dict(kwargs)
        self._reset_callbacks: list[Callable[[], None]] = []
        self._set_attrs()

    def _set_attrs(self) -> None:
        for name, value in self._saved_state.items():
            setattr(self, name, value)

    def save(self) -> None:
        self._saved_state = {name: getattr(self, name) for name in self._saved_state}

    def commit(self) -> None:
        """Save the current values (the point ``restore`` goes back to)."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Never interrupts: the hosts of an mpirun/srun job do not change."""

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        """Every rank gets rank 0's saved attributes (collective)."""
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def register_reset_callbacks(self, callbacks: list[Callable[[], None]]) -> None:
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def reset(self) -> None:
        """Reset objects after a reset event (Horovod's hook; nothing to do here)."""


class TensorFlowState(ObjectState):
    """ObjectState plus TensorFlow variables (Horovod's TensorFlowState; eager only)."""

    def __init__(self, variables: Any = None, session: Any = None, **kwargs: Any) -> None:
        if session is not None or not tf.executing_eagerly():
            raise NotImplementedError("elastic.TensorFlowState: only eager execution is supported "
                                      "(no tf.compat.v1 session)")
        self.variables = list(variables) if variables is not None else []
        self._saved_model_state = self._values()
        super().__init__(**kwargs)

    def _values(self) -> list[np.ndarray]:
        return [np.array(v.numpy()) for v in self.variables]

    def save(self) -> None:
        self._saved_model_state = self._values()
        super().save()

    def restore(self) -> None:
        for variable, value in zip(self.variables, self._saved_model_state):
            variable.assign(value)
        super().restore()

    def sync(self) -> None:
        """Every rank gets rank 0's variables and saved attributes; they become the saved state."""
        if self.variables:
            broadcast_variables(self.variables, root_rank=0)
        self._saved_model_state = self._values()
        super().sync()


class TensorFlowKerasState(ObjectState):
    """A Keras model's and optimizer's variables plus attributes given as keyword arguments
    (Horovod's TensorFlowKerasState; any Keras of ``tf.keras``: Keras 3, or Keras 2 under tf_keras)."""

    def __init__(self, model: Any, optimizer: Any = None, backend: Any = None, **kwargs: Any) -> None:
        if not getattr(model, "built", True):
            raise ValueError("TensorFlowKerasState: the model must be built first; run `model.build(input_shape)`")
        self.model = model
        self.optimizer = optimizer if optimizer is not None else model.optimizer
        self.backend = backend
        self._save_model()
        super().__init__(**kwargs)

    def _optimizer_variables(self) -> list[Any]:
        return flavor.optimizer_variables(self.optimizer) if self.optimizer is not None else []

    def _save_model(self) -> None:
        self._saved_model_state = [tf.identity(v) for v in self.model.variables]
        self._saved_optimizer_state = [tf.identity(v) for v in self._optimizer_variables()]

    def save(self) -> None:
        self._save_model()
        super().save()

    def restore(self) -> None:
        """Go back to the last ``save``/``commit`` (or ``sync``)."""
        for var, saved in zip(self.model.variables, self._saved_model_state):
            var.assign(saved)
        for var, saved in zip(self._optimizer_variables(), self._saved_optimizer_state):
            var.assign(saved)
        super().restore()

    def sync(self) -> None:
        """Every rank gets rank 0's model and optimizer variables and committed attributes (collective)."""
        broadcast_variables(self.model.variables, root_rank=0)
        if self.optimizer is not None:
            broadcast_variables(self._optimizer_variables(), root_rank=0)
        self._save_model()
        super().sync()


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate ``func(state, *args, **kwargs)``: sync ``state``, then run ``func`` once (a fixed-size
    job: no membership changes, see the module docstring)."""
    if not callable(func):
        raise TypeError(f"hvd.elastic.run: `func` must be callable, got {type(func).__name__}")

    @functools.wraps(func)
    def wrapper(state: Any, *args: Any, **kwargs: Any) -> Any:
        state.sync()
        return func(state, *args, **kwargs)

    return wrapper


__all__ = ["ObjectState", "TensorFlowState", "TensorFlowKerasState", "run"]
