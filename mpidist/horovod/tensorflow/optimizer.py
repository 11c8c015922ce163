"""DistributedOptimizer for Keras 3 optimizers, Keras 2 ones (keras2_optimizer.py) and
``tf.compat.v1.train`` optimizers.

Keras 3: a new optimizer of a subclass of the given one's class (built from its config), whose
``apply()`` allreduces the gradients before the update. With ``backward_passes_per_step`` N > 1
the gradients are summed locally in accumulators; every N-th call allreduces the sum (divided by
N first when ``average_aggregated_gradients``) and applies it, the other calls apply nothing (the
optimizer's ``iterations`` counts applied updates, as with Horovod).

``tf.compat.v1.train.Optimizer``: a subclass whose ``compute_gradients`` allreduces (graph mode).
"""
from __future__ import annotations

from typing import Any, Callable

import tensorflow as tf

from ...tensorflow import patching
from ...tensorflow.keras import flavor
from . import keras2_optimizer
from .compression import Compression
from .process_sets import ProcessSet, global_process_set
from .reduce_ops import Average
from .tape import check_reduce_args, local_variable_ids, reduce_gradients


class _KerasMixin:
    """The overrides of a Keras 3 optimizer class (see the module docstring)."""

    hvd_args: dict[str, Any]
    hvd_passes: int
    hvd_average_aggregated: bool
    hvd_local: set[int]
    # the Keras 3 optimizer's (the class this is mixed into), declared for the type checker:
    built: bool
    add_variable: Callable[..., Any]
    add_variable_from_reference: Callable[..., Any]

    @property
    def hvd_accumulators(self) -> list[Any]:
        """The local gradient accumulators (``backward_passes_per_step`` > 1, once built)."""
        try:
            return list(self._hvd_acc)
        except AttributeError:
            return []

    def register_local_var(self, var: Any) -> None:
        """Leave ``var``'s gradient out of the allreduce (Horovod's PartialDistributedOptimizer)."""
        self.hvd_local.add(id(var))

    def hvd_reduce(self, grads: list[Any], variables: list[Any] | None) -> list[Any]:
        """The gradients allreduced as configured, local variables' gradients left on this rank."""
        local: list[int] = []
        if self.hvd_local:
            named = variables if variables is not None else \
                list(patching.get_private(self, "_trainable_variables"))
            local = [i for i, v in enumerate(named) if id(v) in self.hvd_local]
        return reduce_gradients(grads, variables, local=local, **self.hvd_args)

    def compute_gradients(self, loss: Any, var_list: Any, tape: Any = None) -> list[tuple[Any, Any]]:
        return self._compute_gradients(loss, var_list, None, tape)

    def _compute_gradients(self, loss: Any, var_list: Any, grad_loss: Any = None,
                           tape: Any = None) -> list[tuple[Any, Any]]:
        """Horovod's Keras 2 method on Keras 3: (gradient, variable) pairs of ``loss`` (a tensor
        recorded by ``tape``, or a function of no arguments). With backward_passes_per_step 1 the
        gradients come allreduced, and ``apply_gradients`` of exactly these pairs applies them
        without reducing again; with N > 1 they are this rank's own (``apply`` sums and reduces)."""
        tape = tf.GradientTape() if tape is None else tape
        if callable(loss):
            with tape:
                loss = loss()
        variables = list(var_list() if callable(var_list) else var_list)
        grads = list(tape.gradient(loss, variables, output_gradients=grad_loss))
        if self.hvd_passes == 1:
            grads = self.hvd_reduce(grads, variables)
            object.__setattr__(self, "_hvd_reduced", list(grads))  # past Keras's attribute tracking
        return list(zip(grads, variables))

    def _already_reduced(self, grads: list[Any]) -> bool:
        """Whether ``grads`` are what ``_compute_gradients`` returned last (forgotten once asked)."""
        marked = self.__dict__.pop("_hvd_reduced", None)
        return marked is not None and len(marked) == len(grads) and all(g is m for g, m in zip(grads, marked))

    def build(self, variables: Any) -> None:
        super().build(variables)  # type: ignore[misc]  # the Keras class mixed in has it
        if self.hvd_passes > 1:
            self._hvd_acc = [self.add_variable_from_reference(v, name="hvd_aggregated")
                             for v in variables]
            self._hvd_counter = self.add_variable(shape=(), dtype="int64", initializer="zeros",
                                                  name="hvd_backward_passes")

    def apply(self, grads: Any, trainable_variables: Any = None) -> Any:
        grads = list(grads)
        variables = None if trainable_variables is None else list(trainable_variables)
        if self.hvd_passes == 1:
            reduced = grads if self._already_reduced(grads) else self.hvd_reduce(grads, variables)
            return super().apply(reduced, variables)  # type: ignore[misc]  # the Keras class mixed in has it
        if not self.built:
            self.build(variables)
            self.built = True
        if variables is None:
            variables = list(patching.get_private(self, "_trainable_variables"))
        index = {id(v): i for i, v in enumerate(patching.get_private(self, "_trainable_variables"))}
        accs = [self._hvd_acc[index[id(v)]] for v in variables]
        for g, acc in zip(grads, accs):
            if g is not None:
                acc.assign_add(tf.convert_to_tensor(g))
        self._hvd_counter.assign_add(1)
        passes = self.hvd_passes

        def update() -> tf.Tensor:
            summed = [None if g is None else tf.identity(acc) for g, acc in zip(grads, accs)]
            if self.hvd_average_aggregated:
                summed = [None if s is None else s / tf.cast(passes, s.dtype) for s in summed]
            reduced = self.hvd_reduce(summed, variables)
            super(_KerasMixin, self).apply(reduced, variables)  # type: ignore[misc]  # the Keras class mixed in has it
            for acc in accs:
                acc.assign(tf.zeros_like(acc))
            return tf.constant(True)

        is_update = tf.equal(self._hvd_counter % passes, 0)
        if tf.executing_eagerly():
            if bool(is_update):
                update()
            return None
        tf.cond(is_update, update, lambda: tf.constant(False))
        return None


def check_passes(backward_passes_per_step: Any) -> None:
    if not isinstance(backward_passes_per_step, int) or isinstance(backward_passes_per_step, bool) \
            or backward_passes_per_step < 1:
        raise ValueError(f"DistributedOptimizer: `backward_passes_per_step` must be an integer >= 1, "
                         f"got {backward_passes_per_step!r}")


def _keras_optimizer(optimizer: Any, name: Any, compression: Any, sparse_as_dense: bool,
                     gradient_predivide_factor: float, op: Any, backward_passes_per_step: int,
                     average_aggregated_gradients: bool, num_groups: int, groups: Any,
                     process_set: ProcessSet, scale_local_gradients: bool, local: set[int]) -> Any:
    check_passes(backward_passes_per_step)
    cls: Any = type(optimizer.__class__.__name__, (_KerasMixin, optimizer.__class__), {})  # a Keras class
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    new = cls.from_config(config)
    new.hvd_args = dict(op=op, compression=compression, sparse_as_dense=sparse_as_dense,
                         gradient_predivide_factor=gradient_predivide_factor, num_groups=num_groups,
                         groups=groups, process_set=process_set, name="DistributedOptimizer",
                         scale_local_gradients=scale_local_gradients)
    new.hvd_passes = backward_passes_per_step
    new.hvd_average_aggregated = average_aggregated_gradients
    new.hvd_local = set(local)
    return new


def wrap_in_place(optimizer: Any, compression: Any = Compression.none, sparse_as_dense: bool = False,
                  op: Any = Average, gradient_predivide_factor: float = 1.0,
                  process_set: ProcessSet = global_process_set) -> Any:
    """Make a built Keras optimizer allreduce its gradients, keeping its state (hvd.load_model)."""
    if flavor.keras2_optimizer_kind(optimizer) is not None:
        args = dict(op=op, compression=compression, sparse_as_dense=sparse_as_dense,
                    gradient_predivide_factor=gradient_predivide_factor, num_groups=0, groups=None,
                    process_set=process_set, name="DistributedOptimizer")
        return keras2_optimizer.wrap_in_place(optimizer, keras2_optimizer.settings(args, 1, False, None))
    patching.adopt(optimizer, type(optimizer.__class__.__name__, (_KerasMixin, optimizer.__class__), {}),
                   checked=patching.KERAS3,
                   reason="hvd.load_model: the loaded optimizer allreduces, its state (slots, iterations) kept")
    optimizer.hvd_args = dict(op=op, compression=compression, sparse_as_dense=sparse_as_dense,
                               gradient_predivide_factor=gradient_predivide_factor, num_groups=0,
                               groups=None, process_set=process_set, name="DistributedOptimizer")
    optimizer.hvd_passes = 1
    optimizer.hvd_average_aggregated = False
    optimizer.hvd_local = set()
    return optimizer


class _V1Mixin:
    """``compute_gradients`` of a tf.compat.v1.train.Optimizer, allreduced."""

    hvd_args: dict[str, Any]

    def compute_gradients(self, *args: Any, **kwargs: Any) -> list[tuple[Any, Any]]:
        pairs = super().compute_gradients(*args, **kwargs)  # type: ignore[misc]  # the Keras class mixed in has it
        grads = [g for g, _ in pairs]
        variables = [v for _, v in pairs]
        return list(zip(reduce_gradients(grads, variables, **self.hvd_args), variables))


def shared_variables(optimizer: Any) -> list[Any]:
    """``optimizer.variables`` without a DistributedOptimizer's local gradient accumulators (each rank
    sums its own backward passes there), i.e. what broadcasting the optimizer's state covers."""
    local = {id(v) for v in getattr(optimizer, "hvd_accumulators", [])}
    return [v for v in flavor.optimizer_variables(optimizer) if id(v) not in local]


def is_keras_optimizer(optimizer: Any) -> bool:
    """A Keras 3 optimizer, or a Keras 2 one (tf_keras: current or legacy)."""
    return flavor.is_keras3_optimizer(optimizer) or flavor.keras2_optimizer_kind(optimizer) is not None


def DistributedOptimizer(optimizer: Any, name: str | None = None, use_locking: bool = False,
                         device_dense: str = "", device_sparse: str = "", compression: Any = Compression.none,
                         sparse_as_dense: bool = False, backward_passes_per_step: int = 1, op: Any = Average,
                         gradient_predivide_factor: float = 1.0, average_aggregated_gradients: bool = False,
                         num_groups: int = 0, groups: Any = None, process_set: ProcessSet = global_process_set,
                         scale_local_gradients: bool = True, local_layers: Any = None) -> Any:
    """Wrap a Keras 3, Keras 2 or ``tf.compat.v1.train`` optimizer so that gradients are allreduced first
    (``local_layers``: what PartialDistributedOptimizer leaves on this rank, Keras optimizers only)."""
    check_reduce_args(op, gradient_predivide_factor, num_groups, groups, "DistributedOptimizer")
    process_set.require_engine("DistributedOptimizer")
    if flavor.keras2_optimizer_kind(optimizer) is not None:
        check_passes(backward_passes_per_step)
        args = dict(op=op, compression=compression, sparse_as_dense=sparse_as_dense,
                    gradient_predivide_factor=gradient_predivide_factor, num_groups=num_groups, groups=groups,
                    process_set=process_set, name="DistributedOptimizer", scale_local_gradients=scale_local_gradients)
        return keras2_optimizer.distributed_optimizer(optimizer, name, keras2_optimizer.settings(
            args, backward_passes_per_step, average_aggregated_gradients, local_layers))
    if flavor.is_keras3_optimizer(optimizer):
        return _keras_optimizer(optimizer, name, compression, sparse_as_dense, gradient_predivide_factor, op,
                                backward_passes_per_step, average_aggregated_gradients, num_groups, groups,
                                process_set, scale_local_gradients,
                                local_variable_ids(local_layers, "PartialDistributedOptimizer"))
    if isinstance(optimizer, tf.compat.v1.train.Optimizer):
        if local_layers is not None:
            raise ValueError("PartialDistributedOptimizer: `optimizer` must be a Keras optimizer, got "
                             f"{type(optimizer).__name__}")
        if backward_passes_per_step != 1:
            raise NotImplementedError("DistributedOptimizer: backward_passes_per_step > 1 is supported for "
                                      "Keras optimizers only")
        cls: Any = type(optimizer.__class__.__name__, (_V1Mixin, optimizer.__class__), {})  # a TF class
        new = cls.__new__(cls)
        new.__dict__.update(optimizer.__dict__)
        new.hvd_args = dict(op=op, compression=compression, sparse_as_dense=sparse_as_dense,
                             gradient_predivide_factor=gradient_predivide_factor, num_groups=num_groups,
                             groups=groups, process_set=process_set, name="DistributedOptimizer")
        return new
    raise TypeError(f"DistributedOptimizer: `optimizer` must be a Keras optimizer (Keras 3, or Keras 2 from "
                    f"tf_keras) or a tf.compat.v1.train.Optimizer, got {type(optimizer).__name__}")
