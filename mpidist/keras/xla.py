"""``jit_compile`` under mpidist strategies: Keras's side of the step compiled in two parts.

The mechanism is ``mpidist.tensorflow.xla`` (read its docstring first): a step compiled with
XLA runs its forward and backward pass as one XLA function, the gradients' all-reduce outside
XLA, and the optimizer update as a second XLA function. This module connects Keras to it:

- **Optimizers** (Keras 3 and tf_keras): ``apply`` / ``apply_gradients`` first offer their call to
  ``xla.defer_update``, which records it while a split step's forward and backward pass is being
  traced; the optimizer then returns at once and runs later, in the compiled update, with the
  summed gradients. Everywhere else they run unchanged. Patched on every optimizer class of
  Keras that defines the method (Keras 3: ``BaseOptimizer`` and the wrappers that override
  ``apply``, ``LossScaleOptimizer`` and ``MultiOptimizer``; tf_keras: its current and legacy
  optimizers and their loss-scale optimizers), so the outermost call is the one deferred.
- **Keras 3 models** compiled with ``jit_compile=True`` (``TensorFlowTrainer._make_function``):
  Keras would compile its whole step function (``strategy.run`` of the train step and the
  reduction of its outputs) with XLA, collectives included. Under an mpidist strategy the step
  function is built with ``jit_compile=False`` around a ``SplitStep`` of the train (test) step,
  which ``strategy.run`` runs in parts; ``model.jit_compile`` stays True.
- **``jit_compile="auto"``** (Keras 3's default, ``Trainer._resolve_auto_jit_compile``): Keras
  picks XLA on a machine with a GPU when the model supports it, but never under a
  ``tf.distribute`` strategy. Under an mpidist strategy it picks as without a strategy.

tf_keras models compiled with ``jit_compile=True``: tf_keras compiles the per-replica step
(``tf.function(run_step, jit_compile=True)``) and hands it to ``strategy.run``, which splits it
(``xla.maybe_split``). Its step also all-reduces the metric results it returns (``metric.result()``
in a replica context reads the sync-on-read metric variables across replicas):
``Model.get_metrics_result`` hands that to ``xla.defer_output``, which makes it after the compiled
parts. tf_keras never picks XLA by itself.

Every patch acts for models and optimizers under an mpidist strategy of any number of ranks
(XLA cannot compile mpidist's collective even at one rank); anything else is plain Keras.
"""
from __future__ import annotations

import inspect
import weakref
from typing import Any, Callable

from ..tensorflow import xla
from . import patching

_made: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()  # model -> its SplitSteps


def _tf_variables(variables: Any) -> tuple[list[Any], list[str]]:
    """Keras 3 variables as the TensorFlow variables behind them (``.value``), others as they are;
    and their names (a Keras variable's path)."""
    import keras
    variables = list(variables)
    names = [str(getattr(v, "path", None) or getattr(v, "name", "?")) for v in variables]
    return [v.value if isinstance(v, keras.Variable) else v for v in variables], names


def _replayed(grads: list[Any], run: Callable[[list[Any]], Any]) -> Callable[[list[Any]], Any]:
    """``replay(reduced)`` for ``grads`` with Nones: the reduced gradients put back in their places."""
    def replay(reduced: list[Any]) -> Any:
        found = iter(reduced)
        return run([None if g is None else next(found) for g in grads])
    return replay


def _keras3_apply(original: Callable[..., Any]) -> Callable[..., Any]:
    def apply(self: Any, grads: Any, trainable_variables: Any = None) -> Any:
        if not xla.collecting():
            return original(self, grads, trainable_variables)
        grads = list(grads)
        present = [g for g in grads if g is not None]
        if present:
            watched, names = _tf_variables(_watched_keras3(self, trainable_variables))
            if xla.defer_update(present, _replayed(grads, lambda full: original(self, full, trainable_variables)),
                                watched, f"{type(self).__name__}.apply", names):
                return None
        return original(self, grads, trainable_variables)
    return apply


def _watched_keras3(optimizer: Any, trainable_variables: Any) -> list[Any]:
    """The variables a Keras 3 ``apply`` changes: the trained ones and the optimizer's own."""
    if trainable_variables is None:
        trainable_variables = patching.get_private(optimizer, "_trainable_variables")
    return list(trainable_variables) + list(optimizer.variables)


def _make_function(original: Callable[..., Any]) -> Callable[..., Any]:
    def make_function(self: Any, step_function: Any) -> Any:
        if self.run_eagerly or not self.jit_compile or not patching.is_mpidist(self.distribute_strategy):
            return original(self, step_function)
        split = xla.SplitStep(step_function, getattr(step_function, "__name__", "step"))
        _made.setdefault(self, []).append(split)
        self.jit_compile = False  # Keras compiles the step function whole only while this is True
        try:
            return original(self, split)
        finally:
            self.jit_compile = True
    return make_function


def split_steps(model: Any) -> list[Any]:
    """The ``SplitStep`` objects made for a Keras 3 ``model``'s step functions so far, in the order
    made (named after the step: ``train_step``, ``test_step``; ``forward_backward`` and
    ``update_functions()`` are the functions XLA compiles)."""
    return list(_made.get(model, ()))


def _resolve_auto_jit_compile(original: Callable[..., Any]) -> Callable[..., Any]:
    def resolve_auto_jit_compile(self: Any) -> Any:
        strategy = patching.get_private(self, "_distribute_strategy")
        if not patching.is_mpidist(strategy):
            return original(self)
        patching.set_private(self, "_distribute_strategy", None)  # decide as without a strategy
        try:
            return original(self)
        finally:
            patching.set_private(self, "_distribute_strategy", strategy)
    return resolve_auto_jit_compile


def _subclasses(cls: type) -> list[type]:
    found: list[type] = []
    todo: list[type] = [cls]
    while todo:
        subs: list[type] = todo.pop().__subclasses__()
        for sub in subs:
            if sub not in found:
                found.append(sub)
                todo.append(sub)
    return found


def _keras_classes_defining(base: type, name: str, package: str) -> list[type]:
    """``base`` and its subclasses defined in ``package`` that define method ``name`` themselves."""
    return [c for c in [base] + _subclasses(base) if name in vars(c) and c.__module__.startswith(package + ".")]


def install() -> None:
    """The Keras 3 patches (optimizers, model step functions, ``jit_compile="auto"``)."""
    import keras  # noqa: F401  (the optimizer wrappers are defined once keras is imported)
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer
    from keras.src.optimizers.base_optimizer import BaseOptimizer
    from keras.src.trainers.trainer import Trainer
    for cls in _keras_classes_defining(BaseOptimizer, "apply", "keras"):
        patching.patch(cls, "apply", _keras3_apply)
    patching.patch(TensorFlowTrainer, "_make_function", _make_function)
    patching.patch(Trainer, "_resolve_auto_jit_compile", _resolve_auto_jit_compile)


# -- tf_keras (Keras 2) ---------------------------------------------------------------------------

def _keras2_apply_gradients(original: Callable[..., Any]) -> Callable[..., Any]:
    def apply_gradients(self: Any, grads_and_vars: Any, *args: Any, **kwargs: Any) -> Any:
        if not xla.collecting():
            return original(self, grads_and_vars, *args, **kwargs)
        pairs = list(grads_and_vars)
        grads = [g for g, _ in pairs]
        variables = [v for _, v in pairs]
        if _skips_aggregation(original, self, pairs, args, kwargs) or all(g is None for g in grads):
            return original(self, pairs, *args, **kwargs)

        def run(full: list[Any]) -> Any:
            return original(self, list(zip(full, variables)), *args, **kwargs)

        watched = variables + _keras2_optimizer_variables(self)
        if xla.defer_update([g for g in grads if g is not None], _replayed(grads, run), watched,
                            f"{type(self).__name__}.apply_gradients"):
            return self.iterations
        return original(self, pairs, *args, **kwargs)
    return apply_gradients


def _skips_aggregation(original: Callable[..., Any], optimizer: Any, pairs: list[Any], args: tuple,
                       kwargs: dict) -> bool:
    """Whether a tf_keras ``apply_gradients`` call was told not to aggregate (its caller reduced the
    gradients): ``skip_gradients_aggregation=True`` or ``experimental_aggregate_gradients=False``.
    Such an update has no collective: it is compiled in the forward and backward pass, as it is."""
    try:
        bound = inspect.signature(original).bind(optimizer, pairs, *args, **kwargs)
    except TypeError:  # the original raises its own error when called
        return False
    values = dict(bound.arguments)
    values.update(values.pop("kwargs", None) or {})
    return bool(values.get("skip_gradients_aggregation", False)) or \
        values.get("experimental_aggregate_gradients", True) is False


def _keras2_optimizer_variables(optimizer: Any) -> list[Any]:
    from .flavor import optimizer_variables
    try:
        return optimizer_variables(optimizer)
    except (AttributeError, ValueError):  # not built yet: it has none to read after the update
        return []


def _keras2_get_metrics_result(original: Callable[..., Any]) -> Callable[..., Any]:
    def get_metrics_result(self: Any) -> Any:
        return xla.defer_output(lambda: original(self))
    return get_metrics_result


def install_keras2() -> None:
    """The tf_keras patches (its optimizers' ``apply_gradients``; ``Model.get_metrics_result``,
    whose all-reduce of the metric results runs after the compiled parts of a split step)."""
    import tf_keras
    patching.patch(tf_keras.Model, "get_metrics_result", _keras2_get_metrics_result)
    bases = [tf_keras.optimizers.Optimizer, tf_keras.optimizers.legacy.Optimizer]
    classes: list[type] = []
    for base in bases:
        for root in base.__mro__:
            if root.__module__.startswith("tf_keras.") and "apply_gradients" in vars(root) and root not in classes:
                classes.append(root)
        for cls in _keras_classes_defining(base, "apply_gradients", "tf_keras"):
            if cls not in classes:
                classes.append(cls)
    for cls in classes:
        patching.patch(cls, "apply_gradients", _keras2_apply_gradients)
