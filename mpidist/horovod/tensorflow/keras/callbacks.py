"""Horovod's Keras callbacks, for the Keras of ``tf.keras``: Keras 3, or Keras 2 (tf_keras) under
``TF_USE_LEGACY_KERAS=1`` (the callbacks derive from that Keras's ``Callback``, as Horovod's do).

- BroadcastGlobalVariablesCallback(root_rank, device, local_variables): the root's model and
  optimizer variables on every rank after the first batch, as Horovod does (then the optimizer's
  slot variables exist; the first step itself runs on each rank's own weights); the
  ``local_variables`` (a variable or a list of them) keep this rank's values.
- MetricAverageCallback: the epoch's logs averaged over ranks (sorted by name, one allreduce each).
- LearningRateScheduleCallback / LearningRateWarmupCallback: set ``optimizer.learning_rate`` by
  epoch (staircase) or by fractional epoch, as Horovod does.
  ``momentum_correction`` (default True, as Horovod): when the learning rate changes from ``old``
  to ``new``, Horovod multiplies the momentum by ``new / old`` for that step. Keras 3 compiles its
  ``momentum`` into the train function as a constant, so here the velocity slots are multiplied by
  ``new / old`` instead, which is the same update for ``keras.optimizers.SGD``
  (``v = momentum * v - lr * g``). For ``nesterov=True`` the velocity is corrected, its look-ahead
  term is not. Other optimizers with a nonzero ``momentum`` (RMSprop) train without the correction
  and the chief logs a warning saying so (the script still runs, as it did under Horovod; pass
  ``momentum_correction=False`` to silence it); optimizers without one are left alone, as in Horovod.
  Keras 2: a ``tf.keras.optimizers.legacy`` optimizer keeps ``momentum`` in a variable, so Horovod's
  own correction is made (momentum times ``new / old`` for the batch, restored after it; RMSprop
  included, as in Horovod); tf_keras's current ``SGD`` gets the velocity correction above.
"""
from __future__ import annotations

import logging
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from ....collectives.ops import ReduceOp
from ....tensorflow.keras import flavor
from .. import basics, joins
from ..objects import allgather_object  # noqa: F401 - kept for users of horovod.keras.callbacks
from ..optimizer import shared_variables
from ..process_sets import global_process_set
from ..sync import broadcast_variables

_log = logging.getLogger("mpidist")
keras: Any = flavor.user_keras()  # tf.keras: Keras 2 (tf_keras) under TF_USE_LEGACY_KERAS=1, else Keras 3


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """Broadcast the root's model and optimizer variables to every rank after the first batch
    (``local_variables``: a variable or a list of them that keep this rank's values)."""

    def __init__(self, root_rank: int, device: str = "", local_variables: Any = None,
                 process_set: Any = global_process_set) -> None:
        super().__init__()
        self.root_rank = root_rank
        self.process_set = process_set
        self.broadcast_done = False
        self.local_ids: set[int] = set()
        if local_variables is None:
            local_variables = []
        elif not isinstance(local_variables, (list, tuple)):
            local_variables = [local_variables]
        for var in local_variables:
            self.register_local_var(var)

    def register_local_var(self, var: Any) -> None:
        """Leave ``var`` out of the broadcast (Horovod's method)."""
        if not isinstance(var, tf.Variable) and not _is_keras_variable(var):
            raise ValueError(f"BroadcastGlobalVariablesCallback: all `local_variables` must be variables, "
                             f"got {type(var).__name__}")
        self.local_ids.add(id(var))

    def on_batch_end(self, batch: int, logs: Any = None) -> None:
        if self.broadcast_done:
            return
        shared = [v for v in self.model.variables if id(v) not in self.local_ids]
        _run_in_graph(broadcast_variables(shared, self.root_rank, process_set=self.process_set))
        optimizer = getattr(self.model, "optimizer", None)
        if optimizer is not None and getattr(optimizer, "built", False):
            _run_in_graph(broadcast_variables(shared_variables(optimizer), self.root_rank,
                                              process_set=self.process_set))
        self.broadcast_done = True


class MetricAverageCallback(keras.callbacks.Callback):
    """Average the epoch's metrics over ranks; put it before callbacks that read the logs."""

    def __init__(self, device: str = "", process_set: Any = global_process_set) -> None:
        super().__init__()
        self.process_set = process_set

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if not logs:
            return
        engine = self.process_set.require_engine("MetricAverageCallback")
        names = sorted(k for k, v in logs.items() if np.ndim(v) == 0 and np.issubdtype(np.asarray(v).dtype, np.number))
        if not names:
            return
        values = np.array([float(logs[k]) for k in names], dtype=np.float64)
        averaged = joins.allreduce(engine, values, ReduceOp.MEAN)
        for k, v in zip(names, np.asarray(averaged).tolist()):
            logs[k] = v


def _run_in_graph(op: Any) -> None:
    """Run ``op`` in Keras's session where Keras runs v1 graphs (tf_keras after
    ``tf.compat.v1.disable_eager_execution()``); eagerly ``op`` is None: the work is done."""
    if op is not None and not tf.executing_eagerly():
        tf.compat.v1.keras.backend.get_session().run(op)


def _is_keras_variable(var: Any) -> bool:
    try:
        import keras as keras3
    except ImportError:  # pragma: no cover - Keras 3 comes with TensorFlow 2.16+
        return False
    return isinstance(var, keras3.Variable)


def _set_lr(optimizer: Any, value: float, where: str) -> None:
    try:
        optimizer.learning_rate = value
    except TypeError as e:  # Keras 3 / tf_keras: a LearningRateSchedule cannot be set
        raise ValueError(f"{where}: cannot set the optimizer's learning_rate ({e})") from None


def _get_lr(optimizer: Any) -> float:
    lr = optimizer.learning_rate
    if callable(lr) and not hasattr(lr, "numpy") and not hasattr(lr, "value"):  # a legacy optimizer's schedule
        lr = lr(optimizer.iterations)
    return _value(lr)


def _value(x: Any) -> float:
    """A variable's or tensor's value, eagerly or in a v1 graph (tf_keras after
    ``disable_eager_execution()``: read in Keras's session)."""
    if tf.executing_eagerly() or not isinstance(x, (tf.Variable, tf.Tensor)):
        return float(np.asarray(x))
    return float(tf.compat.v1.keras.backend.get_value(x))


def _has_momentum(optimizer: Any, where: str) -> Any:
    """Which momentum correction applies to ``optimizer`` (see the module docstring): "velocity",
    "hyper" (a legacy Keras 2 optimizer's momentum variable) or False."""
    momentum = getattr(optimizer, "momentum", None)
    if isinstance(momentum, tf.Variable) and flavor.keras2_optimizer_kind(optimizer) == "legacy":
        return "hyper" if _value(momentum) != 0 else False
    if not isinstance(momentum, (int, float)) or isinstance(momentum, bool) or momentum == 0:
        return False
    if not flavor.is_sgd(optimizer):
        if basics.rank() == 0:
            _log.warning("%s: momentum_correction is applied to keras.optimizers.SGD only; %s has "
                         "momentum=%s, so the learning rate changes without it (pass "
                         "momentum_correction=False to silence this)", where, type(optimizer).__name__, momentum)
        return False
    return "velocity"


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """``learning_rate = initial_lr * multiplier(epoch)`` for epochs in [start_epoch, end_epoch)."""

    def __init__(self, initial_lr: float | None, multiplier: Any, start_epoch: int = 0,
                 end_epoch: int | None = None, staircase: bool = True, momentum_correction: bool = True,
                 steps_per_epoch: int | None = None, *args: Any) -> None:
        super().__init__()
        self.initial_lr = initial_lr
        self.start_epoch, self.end_epoch = start_epoch, end_epoch
        self.staircase = staircase if callable(multiplier) else True
        self.multiplier: Callable[[float], float] = multiplier if callable(multiplier) else (lambda epoch: multiplier)
        self.momentum_correction = momentum_correction
        self.correct_momentum: Any = False
        self.restore_momentum: float | None = None
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = 0

    def _adjust(self, epoch: float) -> None:
        optimizer = self.model.optimizer
        initial_lr = self.initial_lr
        assert initial_lr is not None, "on_train_begin has set initial_lr"
        old, new = _get_lr(optimizer), initial_lr * self.multiplier(epoch)
        _set_lr(optimizer, new, type(self).__name__)
        if self.correct_momentum == "hyper" and old != 0:  # Horovod's own: for this batch only
            self.restore_momentum = _value(optimizer.momentum)
            optimizer.momentum = self.restore_momentum * new / old
        elif self.correct_momentum and old != 0 and new != old:
            for velocity in getattr(optimizer, "momentums", None) or []:  # none before the first step
                velocity.assign(velocity * (new / old))

    def on_batch_end(self, batch: int, logs: Any = None) -> None:
        if self.restore_momentum is not None:
            self.model.optimizer.momentum = self.restore_momentum
            self.restore_momentum = None

    def on_train_begin(self, logs: Any = None) -> None:
        self.correct_momentum = self.momentum_correction and _has_momentum(self.model.optimizer,
                                                                           type(self).__name__)
        if self.initial_lr is None:
            self.initial_lr = _get_lr(self.model.optimizer)
        if not self.staircase and not self.steps_per_epoch:
            params = self.params or {}
            steps = params.get("steps")
            if not steps and params.get("samples") and params.get("batch_size"):  # Keras 2's v1 graph loop
                steps = params["samples"] // params["batch_size"]  # as Horovod counts them
            if not steps:
                raise ValueError(f"{type(self).__name__}: could not tell the steps per epoch; pass `steps_per_epoch`")
            self.steps_per_epoch = steps

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self.current_epoch = epoch

    def on_batch_begin(self, batch: int, logs: Any = None) -> None:
        ended = self.end_epoch is not None and self.current_epoch >= self.end_epoch
        if self.current_epoch < self.start_epoch or ended:
            return
        if self.staircase and batch == 0:
            self._adjust(self.current_epoch)
        elif not self.staircase:
            steps = self.steps_per_epoch
            assert steps is not None, "on_train_begin has set steps_per_epoch where staircase is off"
            self._adjust(self.current_epoch + float(batch) / steps)

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if logs is not None:
            logs["lr"] = _get_lr(self.model.optimizer)


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Ramp the learning rate from ``initial_lr / size`` to ``initial_lr`` over ``warmup_epochs``."""

    def __init__(self, initial_lr: float | None, warmup_epochs: int = 5, momentum_correction: bool = True,
                 steps_per_epoch: int | None = None, verbose: int = 0, *args: Any) -> None:
        def multiplier(epoch: float) -> float:
            size = basics.size()
            steps = self.steps_per_epoch
            assert steps is not None, "on_train_begin has set steps_per_epoch (the warmup is not a staircase)"
            epoch += 1.0 / steps
            return 1.0 / size * (epoch * (size - 1) / warmup_epochs + 1)

        super().__init__(initial_lr, multiplier, start_epoch=0, end_epoch=warmup_epochs, staircase=False,
                         momentum_correction=momentum_correction, steps_per_epoch=steps_per_epoch)
        self.verbose = verbose

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        super().on_epoch_end(epoch, logs)
        assert self.end_epoch is not None, "the warmup ends at warmup_epochs"
        if epoch == self.end_epoch - 1 and self.verbose > 0 and basics.rank() == 0:
            _log.info("Epoch %d: finished gradual learning rate warmup to %g.", epoch + 1,
                      _get_lr(self.model.optimizer))
