"""DistributedGradientTape (and PartialDistributedGradientTape): gradients averaged over ranks.

``DistributedGradientTape(tape)`` returns a tape of a subclass of ``type(tape)`` sharing the
original tape's state, whose ``gradient()`` allreduces the local gradients: grouped into one
engine call (or ``num_groups`` / ``groups`` calls), IndexedSlices by allgather unless
``sparse_as_dense``, with ``compression`` and, for Average, ``gradient_predivide_factor`` split
between pre- and postscaling as Horovod does.

``PartialDistributedGradientTape(tape, local_layers=...)`` (and ``register_local_source``) leaves
the gradients of local variables out of the allreduce; with ``scale_local_gradients`` (default
True, as Horovod) they are divided by the process set's size, like the averaged ones.
"""
from __future__ import annotations

from typing import Any, Sequence

import tensorflow as tf

from .allreduce import grouped
from .compression import Compression
from .process_sets import ProcessSet, global_process_set
from .reduce_ops import Adasum, Average


def check_reduce_args(op: Any, gradient_predivide_factor: float, num_groups: Any, groups: Any,
                      where: str) -> None:
    if op == Adasum:
        raise NotImplementedError(f"{where}: op=Adasum is not supported by mpidist.horovod")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError(f"{where}: gradient_predivide_factor not supported with op != Average "
                         f"(got op={op!r}, gradient_predivide_factor={gradient_predivide_factor!r})")
    if groups is not None:
        if num_groups:
            raise ValueError(f"{where}: give `num_groups` or `groups`, not both")
        if not isinstance(groups, (list, tuple)) or not all(isinstance(g, (list, tuple)) for g in groups):
            raise ValueError(f"{where}: `groups` must be a list of lists of variables, got {type(groups).__name__}")
    elif not isinstance(num_groups, int) or isinstance(num_groups, bool) or num_groups < 0:
        raise ValueError(f"{where}: `num_groups` must be an integer >= 0, got {num_groups!r}")


def reduce_gradients(grads: Sequence[Any], variables: Sequence[Any] | None, *, op: Any = Average,
                     compression: Any = Compression.none, sparse_as_dense: bool = False,
                     gradient_predivide_factor: float = 1.0, num_groups: int = 0, groups: Any = None,
                     process_set: ProcessSet = global_process_set, name: str = "DistributedGradient",
                     local: Sequence[int] = (), scale_local_gradients: bool = True) -> list[Any]:
    """Allreduce ``grads`` (None entries stay None) the way Horovod's tape and optimizer do; the
    gradients at indices ``local`` stay on this rank (divided by the set's size when
    ``scale_local_gradients``)."""
    grads = list(grads)
    if sparse_as_dense:
        grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
    prescale, postscale = 1.0, 1.0
    if op == Average and gradient_predivide_factor != 1.0:
        prescale, postscale = 1.0 / gradient_predivide_factor, gradient_predivide_factor
    local_set = set(local)
    todo = [i for i, g in enumerate(grads) if g is not None and i not in local_set]
    if groups is not None and variables is not None:
        ids = {id(v): k for k, group in enumerate(groups) for v in group}
        buckets: dict[int, list[int]] = {}
        for i in todo:
            buckets.setdefault(ids.get(id(variables[i]), len(groups)), []).append(i)  # ungrouped: one last call
        batches = [buckets[k] for k in sorted(buckets)]
    elif num_groups:
        n = min(num_groups, len(todo)) or 1
        cut = [len(todo) * k // n for k in range(n + 1)]
        batches = [todo[cut[k]:cut[k + 1]] for k in range(n)]
    else:
        batches = [todo]
    out = list(grads)
    for b, batch in enumerate(batches):
        if not batch:
            continue
        reduced = grouped([grads[i] for i in batch], op=op, compression=compression, prescale_factor=prescale,
                          postscale_factor=postscale, name=f"{name}_{b}", process_set=process_set)
        for i, r in zip(batch, reduced):
            out[i] = r
    if scale_local_gradients and local_set:
        size = process_set.require_engine(name).size
        for i in sorted(local_set):
            if out[i] is not None and size > 1:
                g = out[i]
                out[i] = tf.IndexedSlices(g.values / size, g.indices, g.dense_shape) \
                    if isinstance(g, tf.IndexedSlices) else g / tf.cast(size, g.dtype)
    return out


def local_variable_ids(local_layers: Any, where: str) -> set[int]:
    """The ids of the trainable variables of ``local_layers`` (a Keras layer or a list of them)."""
    if local_layers is None:
        return set()
    layers = local_layers if isinstance(local_layers, (list, tuple)) else [local_layers]
    for layer in layers:
        if not hasattr(layer, "trainable_weights"):
            raise ValueError(f"{where}: all `local_layers` must be Keras layers, got {type(layer).__name__}")
    return {id(v) for layer in layers for v in layer.trainable_weights}


class _DistributedTapeMixin:
    """The ``gradient`` override; the rest is the wrapped tape's class."""

    hvd_args: dict[str, Any]  # reduce_gradients' settings (DistributedGradientTape sets them)
    hvd_local: set[int]  # ids of the sources whose gradients stay on this rank

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None,
                 unconnected_gradients: Any = tf.UnconnectedGradients.NONE) -> Any:
        grads = super().gradient(target, sources, output_gradients, unconnected_gradients)  # type: ignore[misc]
        flat_sources = tf.nest.flatten(sources)
        flat = tf.nest.flatten(grads, expand_composites=False)
        local = [i for i, v in enumerate(flat_sources) if id(v) in self.hvd_local]
        reduced = reduce_gradients(flat, flat_sources, local=local, **self.hvd_args)
        return tf.nest.pack_sequence_as(grads, reduced)

    def get_local_and_global_gradients(self, target: Any, sources: Any, output_gradients: Any = None) -> tuple:
        """``gradient()``'s results split into two lists of ``(variable, gradient)``: the local
        sources' (left on this rank) and the others' (allreduced), in the order of ``sources``."""
        flat_sources = tf.nest.flatten(sources)
        grads = tf.nest.flatten(self.gradient(target, sources, output_gradients))
        local: list[tuple[Any, Any]] = []
        others: list[tuple[Any, Any]] = []
        for variable, grad in zip(flat_sources, grads):
            (local if id(variable) in self.hvd_local else others).append((variable, grad))
        return local, others

    def register_local_source(self, source: Any) -> None:
        """Leave the gradient of ``source`` (a variable) on this rank (Horovod's tape method)."""
        self.hvd_local.add(id(source))


def DistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "", device_sparse: str = "",
                            compression: Any = Compression.none, sparse_as_dense: bool = False,
                            op: Any = Average, gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                            groups: Any = None, process_set: ProcessSet = global_process_set,
                            scale_local_gradients: bool = True) -> tf.GradientTape:
    """A tape whose ``gradient()`` returns gradients allreduced over ``process_set``."""
    check_reduce_args(op, gradient_predivide_factor, num_groups, groups, "DistributedGradientTape")
    process_set.require_engine("DistributedGradientTape")
    cls: Any = type(gradtape.__class__.__name__, (_DistributedTapeMixin, gradtape.__class__), {})
    tape = cls.__new__(cls)
    tape.__dict__.update(gradtape.__dict__)  # the same recording: tapes keep their state in attributes
    tape.hvd_args = dict(op=op, compression=compression, sparse_as_dense=sparse_as_dense,
                          gradient_predivide_factor=gradient_predivide_factor, num_groups=num_groups,
                          groups=groups, process_set=process_set, scale_local_gradients=scale_local_gradients)
    tape.hvd_local = set()
    return tape


def PartialDistributedGradientTape(gradtape: tf.GradientTape, device_dense: str = "", device_sparse: str = "",
                                   compression: Any = Compression.none, sparse_as_dense: bool = False,
                                   op: Any = Average, gradient_predivide_factor: float = 1.0,
                                   num_groups: int = 0, groups: Any = None,
                                   process_set: ProcessSet = global_process_set, local_layers: Any = None,
                                   scale_local_gradients: bool = True) -> tf.GradientTape:
    """DistributedGradientTape that leaves the gradients of ``local_layers``' variables on this rank
    (divided by the set's size when ``scale_local_gradients``)."""
    local = local_variable_ids(local_layers, "PartialDistributedGradientTape")
    tape = DistributedGradientTape(gradtape, device_dense, device_sparse, compression, sparse_as_dense, op,
                                   gradient_predivide_factor, num_groups, groups, process_set,
                                   scale_local_gradients=scale_local_gradients)
    tape.hvd_local = local
    return tape
