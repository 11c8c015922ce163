"""Batch moments over the batch concatenated across a process set: what ``SyncBatchNormalization``
(Keras 3: sync_batch_norm.py; Keras 2: keras2_sync_batch_norm.py) normalizes with in training.

Each rank sums its elements, their squares and their count per channel (masked elements weigh 0);
one Sum-allreduce adds them up; ``mean = sum / count`` and ``variance = E[x^2] - E[x]^2`` as in
Horovod. Weighting by count equals Horovod's plain average of the ranks' moments when every rank
has the same batch size, and is still the concatenated batch's moments when they differ. Gradients
flow through the allreduce (its gradient is the Sum-allreduce of the incoming gradient), so they
are those of the concatenated batch too. No Keras import: both Keras layers use it.
"""
from __future__ import annotations

from typing import Any, Sequence

import tensorflow as tf

from .allreduce import allreduce
from .process_sets import ProcessSet
from .reduce_ops import Sum


def global_moments(x: Any, axes: Sequence[int], mask: Any, process_set: ProcessSet, *,
                   masked_epsilon: float = 0.0) -> tuple[Any, Any]:
    """``(mean, variance)`` of ``x`` over ``axes`` (reduced away) and over every rank of
    ``process_set``; ``mask`` (the batch's leading axes, or None) weighs elements; with a mask the
    count gets ``masked_epsilon`` added (Keras 3's masked form)."""
    axes = list(axes)
    x = tf.convert_to_tensor(x)
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
                      process_set=process_set)
    n = total[2] if mask is None else total[2] + masked_epsilon
    mean = total[0] / n
    variance = tf.maximum(total[1] / n - tf.square(mean), 0.0)
    return mean, variance


def layer_kwargs(fused: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments ``SyncBatchNormalization(fused=..., **kwargs)`` passes to Keras's
    ``BatchNormalization``, checked as Horovod does (no fused kernel: it computes its own moments)."""
    if fused in (True, None):
        raise ValueError(f"SyncBatchNormalization does not support fused=True, got fused={fused!r}")
    if kwargs.get("synchronized"):
        raise ValueError("SyncBatchNormalization: `synchronized=True` is Keras' tf.distribute path; "
                         "this layer synchronizes over Horovod's ranks itself")
    kwargs = {k: v for k, v in kwargs.items() if k != "synchronized"}
    if not kwargs.get("name"):
        kwargs["name"] = "sync_batch_normalization"
    return kwargs
