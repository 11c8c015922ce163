"""DistributedOptimizer for Keras 2 optimizers (``tf_keras``: ``tf.keras`` with TF_USE_LEGACY_KERAS=1).

Horovod's Keras 2 optimizer, rebuilt: a new optimizer of a subclass of the given one's class (same
class name, so a saved model loads without mpidist), made from the given one's config. Its
gradients are allreduced where Keras 2 computes them: ``compute_gradients`` / ``_compute_gradients``
(what ``minimize``, and so ``model.fit`` and ``train_on_batch``, call) and ``get_gradients``.
``apply_gradients`` applies what it is given: as in Horovod, gradients of a plain
``tf.GradientTape`` are not reduced by it (use ``DistributedGradientTape``). Both Keras 2
families are covered: ``tf.keras.optimizers.*`` (tf_keras's optimizer since TF 2.11) and
``tf.keras.optimizers.legacy.*`` (OptimizerV2, whose ``variables`` then also reads as a list,
as in Horovod).

``backward_passes_per_step`` N > 1 is Horovod's LocalGradientAggregationHelper(Eager), as
``optimizer._agg_helper``: each computation adds this rank's gradients to local sums and
returns them; every N-th one allreduces the sums (divided by N when
``average_aggregated_gradients``), returns that and clears the sums; ``apply_gradients`` applies
only after such a step and otherwise just counts the step, so ``iterations`` counts every call
(as in Horovod). ``_agg_helper.counter`` is the number of passes since the last allreduce.
"""
from __future__ import annotations

from typing import Any, Callable

import tensorflow as tf

from ...tensorflow import patching
from ...tensorflow.keras import flavor
from .tape import local_variable_ids, reduce_gradients


class GradientAggregation:
    """Local sums of ``passes`` backward passes (Horovod's ``_agg_helper``)."""

    def __init__(self, passes: int, average: bool, sparse_as_dense: bool) -> None:
        self.passes, self.average, self.sparse_as_dense = passes, average, sparse_as_dense
        with tf.init_scope():
            self.counter = tf.Variable(0, dtype=tf.int32, trainable=False, name="hvd_backward_passes")
        self.sums: dict[int, tf.Variable] = {}

    def compute_gradients(self, grads: list[Any], variables: list[Any],
                          reduce: Callable[[list[Any]], list[Any]]) -> list[Any]:
        """Add ``grads`` to the sums; on the N-th pass return ``reduce(sums)`` (cleared after), else the sums."""
        present = []
        for i, (g, v) in enumerate(zip(grads, variables)):
            if g is None:
                continue
            if isinstance(g, tf.IndexedSlices):
                if not self.sparse_as_dense:
                    raise ValueError("DistributedOptimizer: IndexedSlices are not supported when "
                                     "`backward_passes_per_step` > 1 and `sparse_as_dense` is False")
                g = tf.convert_to_tensor(g)
            if i not in self.sums:
                with tf.init_scope():
                    self.sums[i] = tf.Variable(tf.zeros(v.shape, g.dtype), trainable=False, name="hvd_aggregated")
            self.sums[i].assign_add(g)
            present.append(i)
        self.counter.assign_add(1)
        summed = [self.sums[i].read_value() for i in present]

        def allreduce_and_clear() -> list[tf.Tensor]:
            full: list[Any] = [None] * len(grads)
            for i, s in zip(present, summed):
                full[i] = s
            reduced = reduce(full)
            out = [reduced[i] / self.passes if self.average else tf.identity(reduced[i]) for i in present]
            self.counter.assign(0)
            for i in present:
                self.sums[i].assign(tf.zeros_like(self.sums[i]))
            return out

        chosen = tf.cond(tf.equal(self.counter, self.passes), allreduce_and_clear, lambda: list(summed)) \
            if present else []
        result: list[Any] = [None] * len(grads)
        for i, g in zip(present, tf.nest.flatten(chosen)):
            result[i] = g
        return result

    def is_apply_step(self) -> tf.Tensor:
        return tf.equal(self.counter, 0)


class _Keras2Mixin:
    """The overrides of a Keras 2 optimizer class (see the module docstring)."""

    hvd_args: dict[str, Any]
    _agg_helper: GradientAggregation | None
    iterations: Any  # the Keras 2 optimizer's step counter (the class this is mixed into)

    def hvd_setup(self, settings: dict[str, Any]) -> None:
        self.hvd_args = dict(settings["args"])
        self.hvd_local_ids = set(settings["local"])
        self.hvd_legacy = flavor.keras2_optimizer_kind(self) == "legacy"
        self._agg_helper = None
        if settings["passes"] > 1:
            self._agg_helper = GradientAggregation(settings["passes"], settings["average_aggregated"],
                                                   self.hvd_args["sparse_as_dense"])

    def register_local_var(self, var: Any) -> None:
        """Leave ``var``'s gradient out of the allreduce (Horovod's PartialDistributedOptimizer)."""
        self.hvd_local_ids.add(id(var))

    def hvd_allreduce(self, grads: Any, variables: Any) -> list[Any]:
        grads, variables = list(grads), list(variables)
        local = [i for i, v in enumerate(variables) if id(v) in self.hvd_local_ids]

        def reduce(gs: list[Any]) -> list[Any]:
            return reduce_gradients(gs, variables, local=local, **self.hvd_args)

        if self._agg_helper is not None:
            return self._agg_helper.compute_gradients(grads, variables, reduce)
        return reduce(grads)

    def compute_gradients(self, loss: Any, var_list: Any, tape: Any = None) -> list[tuple[Any, Any]]:
        return self._compute_gradients(loss, var_list, None, tape)

    def _compute_gradients(self, loss: Any, var_list: Any, grad_loss: Any = None,
                           tape: Any = None) -> list[tuple[Any, Any]]:
        """This rank's gradients of ``loss``, allreduced (Horovod's override of Keras 2's method)."""
        tape = tf.GradientTape() if tape is None else tape
        if self.hvd_legacy:  # OptimizerV2's own method
            pairs = patching.call_private(super(), "_compute_gradients", loss, var_list, grad_loss, tape=tape)
        else:
            pairs = super().compute_gradients(loss, var_list, tape=tape)  # type: ignore[misc]  # (as above)
        pairs = list(pairs)
        if not pairs:
            return pairs
        grads, weights = zip(*pairs)
        return list(zip(self.hvd_allreduce(grads, weights), weights))

    def get_gradients(self, loss: Any, params: Any) -> list[Any]:
        grads = super().get_gradients(loss, params)  # type: ignore[misc]  # the Keras class mixed in has it
        return self.hvd_allreduce(grads, params)

    def apply_gradients(self, grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
        helper = self._agg_helper
        if helper is None:
            return super().apply_gradients(  # type: ignore[misc]  # the Keras class mixed in has it
                grads_and_vars, *args, **kwargs)
        grads_and_vars = list(grads_and_vars)
        base: Any = super()  # the Keras 2 optimizer class this is mixed into

        def apply() -> tf.Tensor:
            base.apply_gradients(grads_and_vars, *args, **kwargs)
            return tf.constant(True)

        def count_only() -> tf.Tensor:
            self.iterations.assign_add(1)
            return tf.constant(False)

        tf.cond(helper.is_apply_step(), apply, count_only)
        return self.iterations


class _LegacyMixin(_Keras2Mixin):
    @property
    def variables(self) -> CallableList:
        """The optimizer's variables, as a list that can also be called (Horovod's shim)."""
        return CallableList(super().variables())  # type: ignore[misc]  # the Keras class mixed in has it


class CallableList(list):
    """A list that returns itself when called: ``opt.variables`` and ``opt.variables()`` both work."""

    def __call__(self) -> CallableList:
        return self


def _distributed_class(base: Any, settings: dict[str, Any], legacy: bool) -> Any:
    """The DistributedOptimizer subclass of ``base``, a Keras 2 optimizer class."""
    mixin = _LegacyMixin if legacy else _Keras2Mixin

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        base.__init__(self, *args, **kwargs)
        self.hvd_setup(settings)

    return type(base.__name__, (mixin, base), {"__init__": __init__, "__module__": base.__module__})


def distributed_optimizer(optimizer: Any, name: str | None, settings: dict[str, Any]) -> Any:
    """The DistributedOptimizer of a Keras 2 ``optimizer`` (``settings``: see ``settings()``)."""
    legacy = flavor.keras2_optimizer_kind(optimizer) == "legacy"
    cls = _distributed_class(optimizer.__class__, settings, legacy)
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    return cls.from_config(config)


def wrap_in_place(optimizer: Any, settings: dict[str, Any]) -> Any:
    """Make a (loaded, maybe built) Keras 2 optimizer allreduce its gradients, keeping its state."""
    legacy = flavor.keras2_optimizer_kind(optimizer) == "legacy"
    patching.adopt(optimizer, _distributed_class(optimizer.__class__, settings, legacy), checked=patching.KERAS2,
                   reason="hvd.load_model: the loaded optimizer allreduces, its state (slots, iterations) kept")
    optimizer.hvd_setup(settings)
    return optimizer


def settings(args: dict[str, Any], passes: int, average_aggregated: bool, local_layers: Any) -> dict[str, Any]:
    """What every instance of a DistributedOptimizer class is set up with (``from_config`` copies too)."""
    return {"args": args, "passes": passes, "average_aggregated": average_aggregated,
            "local": local_variable_ids(local_layers, "PartialDistributedOptimizer")}
