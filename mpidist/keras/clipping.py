"""Gradient clipping under an mpidist strategy of several ranks acts on the aggregated gradient.

Data parallelism must not change what ``clipnorm``, ``global_clipnorm`` and ``clipvalue`` mean: one
process clips the gradient of the global batch, so N ranks clip the sum of their N parts. Keras 3
clips in ``BaseOptimizer.apply`` (``_clip_gradients``) *before* its TensorFlow backend sums the
replicas' gradients (``TFOptimizer._all_reduce_sum_gradients``, in ``_backend_update_step``): each
replica's part (1/N of the gradient when the loss is scaled by 1/N, as Keras does) is clipped on
its own. TensorFlow's own strategies do exactly that with Keras 3: measured with
``tf.distribute.MirroredStrategy`` on 2 logical CPUs, 8 SGD steps of a small MLP end up to 0.007
(``clipnorm``), 0.003 (``global_clipnorm``) and 0.008 (``clipvalue``) away from one process on the
same global batches, and mpidist did the same (docs/keras.md). Keras 2 (tf_keras, current and legacy
optimizers) and Horovod's ``DistributedOptimizer`` aggregate first and clip the result: no patch.

Patched (Keras 3, only for an optimizer that clips, inside a replica context of a multi-rank mpidist
strategy: ``fit``, and custom loops calling ``optimizer.apply_gradients`` / ``apply`` in
``strategy.run``): ``_clip_gradients`` first sums the gradients over the replicas (the replica
context's ``all_reduce``, one collective for all of them, as Keras's own), then clips the sum; the
following ``_all_reduce_sum_gradients`` of exactly those clipped gradients sums nothing again.
With ``gradient_accumulation_steps`` the accumulated mean is summed and clipped once per applied
update, where Keras clips it. Same number of collectives as without clipping.
"""
from __future__ import annotations

from typing import Any, Callable

from . import patching

_MARK = "_mpidist_reduced"  # on the optimizer: the clipped sums _clip_gradients returned last


def _clips(optimizer: Any) -> bool:
    return any((getattr(optimizer, name, None) or 0) > 0 for name in ("clipnorm", "global_clipnorm", "clipvalue"))


def _replica_strategy() -> Any:
    """The multi-rank mpidist strategy of the current replica context, or None."""
    import tensorflow as tf
    context = tf.distribute.get_replica_context()
    return None if context is None else patching.multi_rank(context.strategy)


def _clip_gradients(original: Callable[..., Any]) -> Callable[..., Any]:
    def clip(self: Any, grads: Any) -> Any:
        if not _clips(self) or _replica_strategy() is None:
            return original(self, grads)
        import tensorflow as tf
        grads = list(grads)
        present = [g for g in grads if g is not None]
        summed = iter(tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, present)
                      if present else [])
        clipped = list(original(self, [None if g is None else next(summed) for g in grads]))
        self.__dict__[_MARK] = clipped  # past Keras's attribute tracking
        return clipped
    return clip


def _all_reduce_sum_gradients(original: Callable[..., Any]) -> Callable[..., Any]:
    def all_reduce_sum(self: Any, grads_and_vars: Any) -> Any:
        marked = self.__dict__.pop(_MARK, None)
        pairs = list(grads_and_vars)
        if marked is not None and len(marked) == len(pairs) and all(g is m for (g, _), m in zip(pairs, marked)):
            return pairs  # summed before clipping
        return original(self, pairs)
    return all_reduce_sum


def install() -> None:
    from keras.src.backend.tensorflow.optimizer import TFOptimizer
    from keras.src.optimizers.base_optimizer import BaseOptimizer
    patching.patch(BaseOptimizer, "_clip_gradients", _clip_gradients)
    patching.patch(TFOptimizer, "_all_reduce_sum_gradients", _all_reduce_sum_gradients)
