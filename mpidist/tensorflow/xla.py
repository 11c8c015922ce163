"""XLA-compiled training steps under mpidist strategies: the step compiled in two parts, the
gradients' all-reduce between them.

XLA compiles a whole function, and an MPI collective (a ``tf.numpy_function``) cannot be part
of it. A data-parallel training step needs one collective in its middle: the sum of its
gradients over the replicas, which the optimizer makes when it applies them. So a step that
should be compiled runs as three parts, each traced once per input signature:

1. **forward_backward**, compiled by XLA: the step function itself, traced up to and past its
   optimizer update, except that the update is not run there. The optimizer's ``apply`` /
   ``apply_gradients`` call is recorded instead (``defer_update``: the optimizer patches of
   ``mpidist.keras.xla`` call it at their entry) and the gradients it was given become extra
   outputs of the function. What the step returns (loss, metric results) is computed here too.
2. **the all-reduce** (SUM) of every recorded gradient, outside XLA: one call of the replica
   context's ``all_reduce`` for all of them (one engine call, packed as the strategy's options
   say; ``tf.IndexedSlices`` all-gathered as everywhere else).
3. **update**, compiled by XLA: the recorded optimizer calls, replayed in order with the reduced
   gradients (learning-rate schedule, loss scaling, gradient accumulation, weight decay and the
   slot updates all run inside). The optimizer still asks for its gradients' all-reduce there;
   that request returns its input (``pre_reduced``): the gradients were summed in part 2, and
   what an optimizer does to them before it sums them (unscaling by the loss scale, averaging
   accumulated steps) is linear and the same on every replica, so summing first gives the same
   sum. Only clipping is not linear: here it acts on the summed gradient, what Keras 2 and
   Horovod do (Keras 3 clips each replica's part first).

Which steps: a function given to ``strategy.run`` that is a ``tf.function(jit_compile=True)``
(``split`` makes its ``SplitStep``; tf_keras's ``model.compile(jit_compile=True)`` hands
``strategy.run`` such a function), and Keras 3 models compiled with ``jit_compile=True``
(``mpidist.keras.xla`` turns off Keras's own compilation of the whole step and passes
``strategy.run`` a ``SplitStep`` of the train step instead). A step without an optimizer
update (evaluation, prediction) is part 1 alone. A value the step returns that is made with a
collective (tf_keras's metric results, all-reduced every step) goes through ``defer_output``: a
placeholder in part 1, made after part 3. What the parts record, replay and check is in
xla_record.py.

What cannot be split is an error at trace time (``XlaCollectiveError``) naming the function and
what to do, never a silent change of results:

- a collective in part 1 other than the deferred optimizer update (an ``all_reduce`` of the loss,
  a synchronized batch norm): it would need a third XLA function; compute it outside the
  compiled step or use ``jit_compile=False``;
- an optimizer update inside control flow of the step (``tf.cond``, a loop, a nested
  ``tf.function``): part 2 could not be made to run only when it runs;
- a read or write, in part 1 after an optimizer update, of a variable that update changes (a GAN
  step whose second forward pass uses the discriminator just updated): part 1 would read the
  values from before the update;
- in part 3, a collective other than one reduction of the update's gradients (same number,
  shapes and dtypes), or none at all (an optimizer told not to aggregate was given gradients the
  step reduced itself: part 1 holds that collective and has failed already);
- ``strategy.run`` inside a function that is itself compiled with ``jit_compile=True`` (what
  Keras 3 does without ``mpidist.keras``): XLA owns that whole function, nothing inside can be
  split off; put ``jit_compile=True`` on the function given to ``strategy.run`` instead.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable

import tensorflow as tf

from ..cross_device.reduce_op import ReduceOp
from . import _tf_private, xla_record
from .xla_record import XlaCollectiveError, collecting, defer_output, defer_update

__all__ = ["SplitStep", "split", "split_steps", "maybe_split", "is_jit_function", "XlaCollectiveError",
           "collecting", "defer_update", "defer_output"]

_no_autograph = tf.autograph.experimental.do_not_convert  # library code: never converted


class SplitStep:
    """A step function (run in a replica context of an mpidist strategy) compiled by XLA in two
    parts around its gradients' all-reduce (the module docstring).

    ``fn`` is the Python step function; ``name`` names it in errors and names its two compiled
    parts ``<name>_forward_backward`` and ``<name>_update``; ``autograph`` converts ``fn`` as
    ``tf.function`` would; ``input_signature`` and ``reduce_retracing`` are passed to part 1."""

    def __init__(self, fn: Callable[..., Any], name: str, autograph: bool = False, input_signature: Any = None,
                 reduce_retracing: bool = True) -> None:
        self._fn = fn
        self._target: Callable[..., Any] | None = None
        self._autograph = autograph
        self.name = name
        self._traces: weakref.WeakKeyDictionary[Any, xla_record.Trace] = weakref.WeakKeyDictionary()
        self.forward_backward = tf.function(_named(self._part1, f"{name}_forward_backward"), jit_compile=True,
                                            autograph=False, input_signature=input_signature,
                                            reduce_retracing=reduce_retracing)

    @property
    def python_function(self) -> Callable[..., Any]:
        return self._fn

    def update_functions(self) -> list[Any]:
        """Part 3 of every trace so far that recorded an optimizer update (``tf.function`` objects
        compiled with XLA; ``experimental_get_compiler_ir`` shows what XLA compiles)."""
        return [t.update_function for t in list(self._traces.values()) if t.update_function is not None]

    def _call_target(self, *args: Any, **kwargs: Any) -> Any:
        if self._target is None:
            self._target = tf.autograph.to_graph(self._fn) if self._autograph else self._fn
        return self._target(*args, **kwargs)

    @_no_autograph
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _tf_private.in_xla_context():  # already inside a function XLA compiles whole: nothing to split
            return self._call_target(*args, **kwargs)
        context = tf.distribute.get_replica_context()
        if context is None:
            raise RuntimeError(f"{self.name}: a step compiled in parts (jit_compile=True under an mpidist "
                               f"strategy) must run in a replica context (strategy.run), not in cross-replica "
                               f"context")
        out, gradients = self.forward_backward(*args, **kwargs)
        trace = self._traces[self.forward_backward.get_concrete_function(*args, **kwargs).graph]
        if trace.updates:
            reduced = context.all_reduce(ReduceOp.SUM.value, list(gradients))
            if trace.update_function is None:
                trace.update_function = tf.function(
                    _named(lambda *g: self._part3(trace, list(g)), f"{self.name}_update"), jit_compile=True,
                    autograph=False)
            trace.update_function(*reduced)
        if not trace.outputs:
            return out
        flat = tf.nest.flatten(out)
        for (compute, _), slots in zip(trace.outputs, trace.slots):  # after the update, as in the step
            values = tf.nest.flatten(compute())
            for k, slot in slots:
                flat[slot] = values[k]
        return tf.nest.pack_sequence_as(out, flat)

    def _part1(self, *args: Any, **kwargs: Any) -> tuple[Any, list[Any]]:
        graph = tf.compat.v1.get_default_graph()
        with xla_record.recording(graph, self.name) as trace:
            out = self._call_target(*args, **kwargs)
        trace.check_no_use_after_update()
        trace.slots = [xla_record.output_slots(self.name, out, placeholder) for _, placeholder in trace.outputs]
        self._traces[graph] = trace
        return out, trace.gradients()

    def _part3(self, trace: xla_record.Trace, reduced: list[Any]) -> None:
        start = 0
        for update in trace.updates:
            part = reduced[start:start + len(update.gradients)]
            start += len(update.gradients)
            with xla_record.replaying(self.name, update) as replay:
                update.replay(part)
            if replay.reductions != 1:
                raise XlaCollectiveError(None, None,
                    f"{self.name}: {update.label} made no all-reduce of its gradients in the compiled optimizer "
                    f"update (jit_compile=True under an mpidist strategy), but mpidist summed them over the "
                    f"replicas before it: an optimizer that does not aggregate gradients (told to skip "
                    f"aggregation) cannot be split this way. Use jit_compile=False for this step")


def _named(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    """``fn`` under the name ``name`` (what ``tf.function`` names its graphs, and XLA its modules, by)."""
    def named(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)
    named.__name__ = named.__qualname__ = name
    return named


_splits: weakref.WeakKeyDictionary[Any, SplitStep] = weakref.WeakKeyDictionary()


def is_jit_function(fn: Any) -> bool:
    """Whether ``fn`` is a ``tf.function`` made with ``jit_compile=True``."""
    if not isinstance(fn, tf.types.experimental.PolymorphicFunction):
        return False
    spec = getattr(fn, "function_spec", None)
    return bool(getattr(spec, "jit_compile", False))


def split(fn: Any) -> SplitStep:
    """The ``SplitStep`` of ``tf.function(jit_compile=True)`` function ``fn`` (one per function)."""
    found = _splits.get(fn)
    if found is None:
        name = str(getattr(fn, "__name__", None) or getattr(fn.python_function, "__name__", "step"))
        found = _splits[fn] = SplitStep(fn.python_function, name, autograph=_tf_private.function_autograph(fn),
                                        input_signature=fn.input_signature)
    return found


def split_steps() -> list[SplitStep]:
    """The ``SplitStep`` of every live ``tf.function(jit_compile=True)`` that ``strategy.run`` has
    split (``forward_backward`` and ``update_functions()`` are what XLA compiles)."""
    return list(_splits.values())


def maybe_split(fn: Any) -> Any:
    """What ``strategy.run`` calls for ``fn``: its ``SplitStep`` when ``fn`` is a
    ``tf.function(jit_compile=True)`` called outside any XLA compilation, else ``fn``."""
    if is_jit_function(fn) and not _tf_private.in_xla_context():
        return split(fn)
    return fn
