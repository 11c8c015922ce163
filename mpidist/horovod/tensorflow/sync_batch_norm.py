"""``hvd.SyncBatchNormalization`` for Keras 3: batch normalization whose training statistics cover
every rank.

A Keras 3 ``BatchNormalization`` whose batch moments in training are those of the batch
concatenated over the process set (moments.py: one Sum-allreduce of per-channel sums, squares and
counts). Inference uses the moving statistics (no communication). Keras 2 (tf_keras) models get
keras2_sync_batch_norm.py's layer: ``hvd.SyncBatchNormalization`` is the one of ``tf.keras``.
"""
from __future__ import annotations

from typing import Any

import keras

from ...tensorflow import patching
from .moments import global_moments, layer_kwargs
from .process_sets import ProcessSet, global_process_set


@keras.saving.register_keras_serializable(package="mpidist.horovod")
class SyncBatchNormalization(keras.layers.BatchNormalization):
    """BatchNormalization with batch statistics synchronized over the ranks during training."""

    def __init__(self, fused: Any = False, process_set: ProcessSet = global_process_set, **kwargs: Any) -> None:
        super().__init__(**layer_kwargs(fused, kwargs))
        self.process_set = process_set

    def _moments(self, inputs: Any, mask: Any) -> tuple[Any, Any]:
        if self.process_set.size() == 1:
            return patching.call_private(super(), "_moments", inputs, mask)
        return global_moments(inputs, patching.get_private(self, "_reduction_axes"), mask, self.process_set,
                              masked_epsilon=keras.backend.epsilon())  # Keras 3's masked form
