"""``model.predict`` under an mpidist strategy of several ranks: every rank gets every row.

Keras runs each predict step through ``strategy.run`` and joins the replicas' outputs with
``reduce_per_replica(..., "concat")`` (keras/src/backend/tensorflow/trainer.py). It gathers across
workers only for TensorFlow's own MultiWorkerMirroredStrategy (``_multi_worker_concat``); for any
other strategy with one replica per process it returns this process's rows. The patch: for a
multi-rank mpidist strategy, "concat" is ``strategy.gather(outputs, axis=0)``: the ranks' blocks
of each global batch in rank order, which is the batch in input order (DATA sharding gives rank r
the r-th ``array_split`` block), so ``predict`` returns what one process returns, on every rank.
One allgather per step for all outputs; a rank with an empty block (a short last batch) adds
nothing. Other reductions are Keras's own.

``predict_on_batch(x)`` does not shard ``x``: each rank predicts its own ``x`` and gets its own
rows (no gather), through a predict function of its own.

Keras 2 (tf_keras) has the same ``reduce_per_replica`` (tf_keras/src/engine/training.py), gathering
only under TensorFlow's MultiWorkerMirroredStrategy: the same patch (``install_keras2``). There
``predict_on_batch(x)`` shards ``x`` over the ranks like ``predict``, so it gathers too, as under
TensorFlow's strategy with Keras 2.
"""
from __future__ import annotations

import contextvars
import weakref
from typing import Any, Callable

from .. import owners, patching

_LOCAL = contextvars.ContextVar("mpidist_keras_local_predict", default=False)
_local_functions: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def gather_outputs(values: Any, strategy: Any) -> Any:
    """Every rank's ``values`` (a nest of tensors) joined along axis 0 in rank order, one call."""
    import tensorflow as tf
    flat = tf.nest.flatten(values)
    for v in flat:
        if isinstance(v, (tf.SparseTensor, tf.RaggedTensor)):
            raise NotImplementedError(f"model.predict under an mpidist strategy: outputs must be dense "
                                      f"tensors, got {type(v).__name__}")
    scalars = [v.shape.rank == 0 for v in flat]
    ready = [tf.reshape(v, [1]) if s else v for v, s in zip(flat, scalars)]  # Keras stacks scalars
    gathered = strategy.gather(ready, axis=0)
    return tf.nest.pack_sequence_as(values, list(gathered))


def _reduce_per_replica(original: Callable[..., Any]) -> Callable[..., Any]:
    def reduce_per_replica(values: Any, strategy: Any, reduction: Any) -> Any:
        if reduction == "concat" and not _LOCAL.get() and owners.multi_rank(strategy) is not None:
            return gather_outputs(values, strategy)
        return original(values, strategy, reduction)
    return reduce_per_replica


def _predict_on_batch(original: Callable[..., Any]) -> Callable[..., Any]:
    def predict_on_batch(self: Any, x: Any) -> Any:
        if owners.multi_rank(self.distribute_strategy) is None:
            return original(self, x)
        shared = self.predict_function
        self.predict_function = _local_functions.get(self)  # None: Keras makes one, traced unsharded
        token = _LOCAL.set(True)
        try:
            return original(self, x)
        finally:
            _LOCAL.reset(token)
            if self.predict_function is not None:
                _local_functions[self] = self.predict_function
            self.predict_function = shared
    return predict_on_batch


def install() -> None:
    from keras.src.backend.tensorflow import trainer
    patching.patch(trainer, "reduce_per_replica", _reduce_per_replica, checked=patching.KERAS3,
                   reason="predict returns every rank's rows, in input order, on every rank")
    patching.patch(trainer.TensorFlowTrainer, "predict_on_batch", _predict_on_batch, checked=patching.KERAS3,
                   reason="predict_on_batch: this rank's rows, not gathered")


def install_keras2() -> None:
    patching.patch(patching.tf_keras_internal("training"), "reduce_per_replica", _reduce_per_replica,
                   checked=patching.KERAS2, reason="predict returns every rank's rows, in input order, on every rank")
