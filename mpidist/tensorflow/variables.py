"""Variables created in an mpidist strategy's scope.

- Variables start equal on every rank: the initial value is computed on every rank and rank 0's
  is broadcast through the engine (one broadcast per variable, in creation order, which is the
  same on every rank since every rank builds the same model), whatever its dtype (float,
  integer, bool), as TensorFlow's MultiWorkerMirroredStrategy does. Exceptions, whose initial
  values are equal everywhere by construction and which some programs create on one rank only:
  values restored from a checkpoint, variables a SavedModel load creates without an initial value
  (restored from the files next), and ``tf.train.Checkpoint``'s ``save_counter`` (created by the
  first ``save``, which programs may call on the chief alone).
- ``synchronization=ON_READ`` variables (what Keras metrics are made of) become TensorFlow's
  SyncOnReadVariable with this rank's variable as the only component: updates in a replica
  context stay local, reads in cross-replica context aggregate over ranks (SUM / MEAN /
  ONLY_FIRST_REPLICA), so epoch metrics are global. Their initial value is not broadcast
  (metrics start at zero everywhere). With aggregation NONE they are created as TensorFlow creates
  them: updates in a replica context work, a read in cross-replica context raises TensorFlow's
  ValueError (NONE names no way to combine the replicas' values).
- Everything else becomes TensorFlow's MirroredVariable with this rank's variable as the only
  component (what TensorFlow's MultiWorkerMirroredStrategy makes with one device per worker):
  ``isinstance(v, tf.distribute.DistributedValues)``, ``v.values``, ``synchronization`` ON_WRITE
  and ``aggregation`` read as there, and checkpoints hold the plain variable. Ranks keep identical
  copies by applying identical updates: in a replica context (inside ``strategy.run``),
  ``assign`` / ``assign_add`` / ``assign_sub`` of a variable with aggregation SUM apply the sum
  over replicas of the values given, MEAN their mean, ONLY_FIRST_REPLICA replica 0's (TensorFlow's
  own MirroredVariable code, through ``extended.reduce_to`` / ``broadcast_to``); with NONE each
  rank updates its own copy, as TensorFlow does. One exception saves a collective per Keras
  step: a non-trainable integer ONLY_FIRST_REPLICA variable (``optimizer.iterations``) is
  updated on each rank without the broadcast (every rank counts the same steps).
"""
from __future__ import annotations

import contextlib
import contextvars
import logging
from typing import Any, Callable, Iterator

import tensorflow as tf

from . import _tf_private, collectives

_log = logging.getLogger("mpidist")
_SAVE_COUNTER = "save_counter"  # the variable tf.train.Checkpoint creates on its first save
_OWN = contextvars.ContextVar("mpidist_own_variables", default=False)


@contextlib.contextmanager
def own_variables() -> Iterator[None]:
    """Variables created inside (in this thread or task) are this rank's own: see the module docstring."""
    token = _OWN.set(True)
    try:
        yield
    finally:
        _OWN.reset(token)


def _broadcast(extended: Any, value: Any, dtype: Any, trainable: bool, name: Any) -> Any:
    value = tf.convert_to_tensor(value, dtype=dtype)
    if not (value.dtype.is_bool or value.dtype.is_integer or value.dtype.is_floating or value.dtype.is_complex):
        return value
    if not trainable and name == _SAVE_COUNTER and value.dtype.is_integer:
        return value  # tf.train.Checkpoint's counter (0): programs may save on the chief only
    _log.debug("mpidist: broadcasting the initial value of variable %s from rank 0", name)
    return collectives.broadcast(extended.engine, [value], 0, extended.default_call_options,
                                 "variable creation (broadcast of rank 0's initial value)")[0]


def _broadcast_initial_value(extended: Any, kwargs: dict[str, Any]) -> Any:
    """The initial value in ``kwargs`` (a callable or a value) replaced by rank 0's, of the same kind."""
    initial_value, dtype, name = kwargs.get("initial_value"), kwargs.get("dtype"), kwargs.get("name")
    trainable = kwargs.get("trainable")
    trainable = True if trainable is None else bool(trainable)
    if callable(initial_value):
        def initial() -> Any:
            if not _tf_private.in_xla_context():
                return _broadcast(extended, initial_value(), dtype, trainable, name)
            # created while XLA traces a function (an optimizer built in the first update that
            # jit_compile=True compiles, xla.py), which cannot hold the broadcast: it runs now,
            # eagerly; every rank traces the same step, so they create variables in the same order
            with tf.init_scope():
                return _broadcast(extended, initial_value(), dtype, trainable, name)
        return initial
    return _broadcast(extended, initial_value, dtype, trainable, name)


def create_variable(extended: Any, next_creator: Callable[..., Any], **kwargs: Any) -> Any:
    """The body of ``extended._create_variable``; see the module docstring."""
    kwargs.pop("colocate_with", None)  # one device per rank: colocation is automatic
    if _OWN.get():  # this rank's own: as outside any strategy
        kwargs["distribute_strategy"] = None
        with extended.device_scope():
            return next_creator(**kwargs)
    synchronization = kwargs.get("synchronization", tf.VariableSynchronization.AUTO)
    aggregation = kwargs.get("aggregation", tf.VariableAggregation.NONE)
    if synchronization == tf.VariableSynchronization.ON_READ:
        kwargs["synchronization"] = tf.VariableSynchronization.ON_READ
        with extended.device_scope():
            variable = next_creator(**kwargs)
        return _tf_private.make_sync_on_read(extended.container_strategy(), variable, aggregation)
    kwargs["synchronization"] = tf.VariableSynchronization.ON_WRITE  # what TensorFlow reports for AUTO
    initial_value = kwargs.get("initial_value")
    # None: a variable a SavedModel load creates uninitialized and then restores (the same on every rank)
    if extended.engine.size > 1 and initial_value is not None \
            and not _tf_private.is_checkpoint_initial_value(initial_value):
        kwargs["initial_value"] = _broadcast_initial_value(extended, kwargs)
    with extended.device_scope():
        variable = next_creator(**kwargs)
    return _tf_private.make_mirrored(extended.container_strategy(), variable, aggregation)


def make_session_fetchable(cls: type) -> None:
    """Let a ``tf.compat.v1.Session`` fetch instances of ``cls`` (a variable class whose ``value`` is
    a TensorFlow variable, such as Keras 3's) as it fetches that TensorFlow variable."""
    _tf_private.make_session_fetchable(cls)
