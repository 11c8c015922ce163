"""The replica context of an mpidist strategy: this rank is replica ``rank`` of ``size``.

``all_reduce`` and ``all_gather`` make ONE engine call for the whole nest (TensorFlow's base
class goes through ``merge_call`` and ``batch_reduce_to``; the result is the same, with fewer
steps per call). Options given per call are merged over the strategy's own (TensorFlow's merge
rule: the call's non-default fields win). Both have gradients, as TensorFlow's do: the gradient
of an all-sum (all-mean) is the all-sum (all-mean) of the gradients; that of an all-gather is
this rank's slice of the all-summed gradient.

``tf.IndexedSlices`` (sparse gradients, e.g. of an embedding) are all-gathered, not densified:
SUM concatenates every rank's indices and values, MEAN also divides the values by the number
of replicas; MIN/MAX/PROD densify them first.
"""
from __future__ import annotations

from typing import Any

import tensorflow as tf

from ..cross_device.reduce_op import ReduceOp
from . import _tf_private, collectives, reductions, xla_record

_no_autograph = tf.autograph.experimental.do_not_convert  # library code: never converted


class MPIReplicaContext(tf.distribute.ReplicaContext):
    """``tf.distribute.ReplicaContext`` with ``replica_id_in_sync_group`` = this rank."""

    def __init__(self, strategy: tf.distribute.Strategy, replica_id_in_sync_group: int) -> None:
        super().__init__(strategy, replica_id_in_sync_group=replica_id_in_sync_group)

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(self.strategy.extended.worker_devices)

    @_no_autograph
    def all_reduce(self, reduce_op: Any, value: Any, options: Any = None, experimental_hints: Any = None) -> Any:
        """``experimental_hints`` (a CollectiveHints: TensorFlow 2.2-2.3's spelling) is merged under
        ``options`` (the newer one): both reach the engine."""
        where = "MPIReplicaContext.all_reduce"
        op = reductions.parse_op(reduce_op, where)
        options = reductions.hints_and_options(options, experimental_hints, where)
        extended = self.strategy.extended
        call = extended.call_options(options, where)
        flat = tf.nest.flatten(value)
        if not flat:
            return value
        reduced = xla_record.pre_reduced(op, flat, where)  # in the compiled update of a split step (xla.py)
        if reduced is not None:
            return tf.nest.pack_sequence_as(value, reduced)
        sparse = [i for i, v in enumerate(flat) if isinstance(v, tf.IndexedSlices)]
        if sparse and op in (ReduceOp.SUM, ReduceOp.MEAN):
            return tf.nest.pack_sequence_as(value, self._all_reduce_sparse(op, flat, sparse, call, where))
        flat = [tf.convert_to_tensor(v) for v in flat]
        engine = extended.engine

        def reduce(*xs: tf.Tensor) -> list[tf.Tensor]:
            return reductions.reduce_tensors(engine, op, xs, None, call, where)

        if op in (ReduceOp.SUM, ReduceOp.MEAN) and _differentiable(flat) and _tf_private.may_record_gradients():
            @tf.custom_gradient
            def with_gradient(*xs: tf.Tensor) -> Any:
                def grad(*dys: Any) -> Any:  # the all-sum (all-mean) of the upstream gradients
                    return self.all_reduce(op, [tf.zeros_like(x) if d is None else d for d, x in zip(dys, xs)],
                                           options)
                return reduce(*xs), grad
            result = with_gradient(*flat)
        else:
            result = reduce(*flat)
        return tf.nest.pack_sequence_as(value, list(result))

    def _all_reduce_sparse(self, op: ReduceOp, flat: list[Any], sparse: list[int],
                           call: collectives.CallOptions, where: str) -> list[Any]:
        """Dense leaves in one all-reduce, IndexedSlices in one all-gather of indices and values."""
        engine = self.strategy.extended.engine
        dense = [i for i in range(len(flat)) if i not in set(sparse)]
        out: list[Any] = list(flat)
        if dense:
            reduced = reductions.reduce_tensors(engine, op, [flat[i] for i in dense], None, call, where)
            for i, r in zip(dense, reduced):
                out[i] = r
        parts = []
        for i in sparse:
            parts += [flat[i].indices, flat[i].values]
        gathered = collectives.allgather(engine, parts, 0, call, where)
        for k, i in enumerate(sparse):
            indices, values = gathered[2 * k], gathered[2 * k + 1]
            if op is ReduceOp.MEAN:
                values = values / tf.cast(self.num_replicas_in_sync, values.dtype)
            out[i] = tf.IndexedSlices(values, indices, flat[i].dense_shape)
        return out

    @_no_autograph
    def all_gather(self, value: Any, axis: int, options: Any = None, experimental_hints: Any = None) -> Any:
        where = "MPIReplicaContext.all_gather"
        options = reductions.hints_and_options(options, experimental_hints, where)
        extended = self.strategy.extended
        call = extended.call_options(options, where)
        flat = tf.nest.flatten(value)
        for v in flat:
            if isinstance(v, tf.IndexedSlices):
                raise NotImplementedError(f"{where}: all_gather does not support IndexedSlices "
                                          f"(`value` holds a tf.IndexedSlices; TensorFlow's does not either)")
        flat = [tf.convert_to_tensor(v) for v in flat]
        parsed = reductions.parse_axis(axis, where)
        if parsed is None or isinstance(parsed, tuple):
            raise TypeError(f"{where}: `axis` must be an int, got {axis!r}")
        axes = [reductions.normalize_axis(parsed, t.shape.rank, where) for t in flat]
        engine = extended.engine

        def gather(*xs: tf.Tensor) -> list[tf.Tensor]:
            return [collectives.allgather(engine, [x], a, call, where)[0] for x, a in zip(xs, axes)] \
                if len(set(axes)) > 1 else collectives.allgather(engine, list(xs), axes[0], call, where)

        if _differentiable(flat) and _tf_private.may_record_gradients():
            @tf.custom_gradient
            def with_gradient(*xs: tf.Tensor) -> Any:
                return gather(*xs), lambda *dys: self._all_gather_grad(xs, dys, axes, options)
            result = with_gradient(*flat)
        else:
            result = gather(*flat)
        return tf.nest.pack_sequence_as(value, list(result))

    def _all_gather_grad(self, xs: tuple, dys: tuple, axes: list[int], options: Any) -> list[tf.Tensor]:
        """This rank's slice (along each axis) of the all-summed gradients."""
        summed = self.all_reduce(ReduceOp.SUM, list(dys), options)
        sizes = self.all_reduce(ReduceOp.SUM, [tf.one_hot(self.strategy.extended.rank, self.num_replicas_in_sync,
                                                          on_value=tf.shape(x, out_type=tf.int64)[a], off_value=0,
                                                          dtype=tf.int64) for x, a in zip(xs, axes)], options)
        rank = self.strategy.extended.rank
        grads = []
        for g, n, a in zip(summed, sizes, axes):
            begin = tf.reduce_sum(n[:rank])
            grads.append(tf.gather(g, tf.range(begin, begin + n[rank]), axis=a))
        return grads


def _differentiable(tensors: list[tf.Tensor]) -> bool:
    return any(t.dtype.is_floating or t.dtype.is_complex for t in tensors)
