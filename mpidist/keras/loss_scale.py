"""Dynamic loss scaling (``mixed_float16``) under an mpidist strategy of several ranks: every rank
decides alike whether a step's gradients are finite.

Keras 3's ``LossScaleOptimizer`` checks the gradients for inf / nan before its inner optimizer sums
them over the replicas (the TensorFlow backend's ``_tf_apply`` takes the first local replica's
answer, "since grads is all-reduced", which they are not yet). One process checks the gradient of
the global batch; N ranks each checked their own part, so a part that overflowed on one rank made
that rank skip the step and halve its loss scale while the others applied theirs: the ranks issued
different collectives (``CollectiveMismatchError``, measured at 2 ranks with one large target per
global batch). Patched (Keras 3, in a replica context of a multi-rank mpidist strategy):
``check_finite`` is this rank's answer combined over the replicas (one 4-byte ``all_reduce`` a step:
the ranks whose part is not): the gradients are finite when every rank's part is, i.e. when their
sum, the global gradient, is (short of an overflow in that sum). Keras 2 (tf_keras) aggregates the
gradients before its check, and so does a ``jit_compile=True`` step (``mpidist.tensorflow.xla``): its
update is given the summed gradients, the same on every rank, and their check needs no collective.
"""
from __future__ import annotations

from typing import Any, Callable

from ..tensorflow import xla_record
from . import patching


def _check_finite(original: Callable[..., Any]) -> Callable[..., Any]:
    def check_finite(self: Any, grads: Any) -> Any:
        import tensorflow as tf
        finite = original(self, grads)
        context = tf.distribute.get_replica_context()
        if context is None or patching.multi_rank(context.strategy) is None or xla_record.replaying_update():
            return finite
        failed = context.all_reduce(tf.distribute.ReduceOp.SUM, tf.cast(tf.logical_not(finite), tf.float32))
        return tf.equal(failed, 0.0)
    return check_finite


def install() -> None:
    from keras.src.optimizers.loss_scale_optimizer import LossScaleOptimizer
    patching.patch(LossScaleOptimizer, "check_finite", _check_finite)
