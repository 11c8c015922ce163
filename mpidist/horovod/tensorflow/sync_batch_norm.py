"""``hvd.SyncBatchNormalization``: batch normalization whose training statistics cover every rank.

A Keras 3 ``BatchNormalization`` whose batch moments in training are those of the batch
concatenated over the process set: each rank sums its elements, their squares and their count
per channel, one Sum-allreduce adds them up, and ``variance = E[x^2] - E[x]^2`` as in Horovod.
Weighting by count equals Horovod's plain average of the ranks' moments when every rank has the
same batch size, and is still the concatenated batch's moments when they differ. Gradients flow
through the allreduce (its gradient is the Sum-allreduce of the incoming gradient), so they are
those of the concatenated batch too. Inference uses the moving statistics (no communication).
"""
from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from ...keras import patching
from .allreduce import allreduce
from .process_sets import ProcessSet, global_process_set
from .reduce_ops import Sum


@keras.saving.register_keras_serializable(package="mpidist.horovod")
class SyncBatchNormalization(keras.layers.BatchNormalization):
    """BatchNormalization with batch statistics synchronized over the ranks during training."""

    def __init__(self, fused: Any = False, process_set: ProcessSet = global_process_set, **kwargs: Any) -> None:
        if fused in (True, None):
            raise ValueError(f"SyncBatchNormalization does not support fused=True, got fused={fused!r}")
        if kwargs.get("synchronized"):
            raise ValueError("SyncBatchNormalization: `synchronized=True` is Keras' tf.distribute path; "
                             "this layer synchronizes over Horovod's ranks itself")
        kwargs.pop("synchronized", None)
        if not kwargs.get("name"):
            kwargs["name"] = "sync_batch_normalization"
        super().__init__(**kwargs)
        self.process_set = process_set

    def _moments(self, inputs: Any, mask: Any) -> tuple[Any, Any]:
        if self.process_set.size() == 1:
            return patching.call_private(super(), "_moments", inputs, mask)
        axes = list(patching.get_private(self, "_reduction_axes"))
        x = tf.convert_to_tensor(inputs)
        if mask is None:
            count = tf.cast(tf.reduce_prod(tf.gather(tf.shape(x), axes)), x.dtype)
            sums = tf.reduce_sum(x, axis=axes)
            squares = tf.reduce_sum(tf.square(x), axis=axes)
            counts = tf.fill(tf.shape(sums), count)
        else:
            weights = tf.cast(tf.broadcast_to(tf.expand_dims(mask, -1), tf.shape(x)), x.dtype)
            sums = tf.reduce_sum(x * weights, axis=axes)
            squares = tf.reduce_sum(tf.square(x) * weights, axis=axes)
            counts = tf.reduce_sum(weights, axis=axes)
        total = allreduce(tf.stack([sums, squares, counts]), op=Sum, name="SyncBatchNormalization",
                          process_set=self.process_set)
        n = total[2] if mask is None else total[2] + keras.backend.epsilon()  # Keras' masked form
        mean = total[0] / n
        variance = tf.maximum(total[1] / n - tf.square(mean), 0.0)
        return mean, variance
