"""``hvd.SyncBatchNormalization`` for Keras 2 (``tf_keras``: ``tf.keras`` with TF_USE_LEGACY_KERAS=1),
the layer Horovod programs built: a tf_keras ``BatchNormalization`` whose batch moments in
training are those of the batch concatenated over the process set (moments.py), computed in
float32 for float16 inputs as Keras 2's own synchronized path does. Never the fused kernel (which
computes its own moments): ``fused=False`` always. Inference uses the moving statistics.
"""
from __future__ import annotations

from typing import Any

import tensorflow as tf
import tf_keras

from ...tensorflow import patching
from .moments import global_moments, layer_kwargs
from .process_sets import ProcessSet, global_process_set


@tf_keras.saving.register_keras_serializable(package="mpidist.horovod")
class SyncBatchNormalization(tf_keras.layers.BatchNormalization):
    """BatchNormalization with batch statistics synchronized over the ranks during training."""

    def __init__(self, fused: Any = False, process_set: ProcessSet = global_process_set, **kwargs: Any) -> None:
        super().__init__(fused=False, **layer_kwargs(fused, kwargs))
        self.process_set = process_set

    def _calculate_mean_and_var(self, inputs: Any, reduction_axes: Any, keep_dims: bool,
                                mask: Any = None) -> tuple[Any, Any]:
        if self.process_set.size() == 1:
            return patching.call_private(super(), "_calculate_mean_and_var", inputs, reduction_axes, keep_dims,
                                         mask=mask)
        x = tf.convert_to_tensor(inputs)
        y = tf.cast(x, tf.float32) if x.dtype == tf.float16 else x
        mean, variance = global_moments(y, reduction_axes, mask, self.process_set)
        if keep_dims:
            for axis in sorted(reduction_axes):
                mean, variance = tf.expand_dims(mean, axis), tf.expand_dims(variance, axis)
        return tf.cast(mean, x.dtype), tf.cast(variance, x.dtype)
