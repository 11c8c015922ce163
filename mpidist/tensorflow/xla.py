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
update (evaluation, prediction) is part 1 alone.

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

import threading
import weakref
from typing import Any, Callable, Sequence

import tensorflow as tf

from ..cross_device.reduce_op import ReduceOp
from . import _tf_private

_no_autograph = tf.autograph.experimental.do_not_convert  # library code: never converted
_state = threading.local()  # .collecting: the part-1 trace in progress; .replaying: the part-3 update


class XlaCollectiveError(tf.errors.UnimplementedError):
    """A collective was traced for XLA (``jit_compile=True``) where mpidist cannot split it off.

    A ``tf.errors.UnimplementedError`` (so AutoGraph re-raises it with its type kept)."""

    def __init__(self, node_def: Any, op: Any, message: str, *args: Any) -> None:
        super().__init__(node_def, op, message, *args)


class _Update:
    """One optimizer update recorded in part 1: its gradients and how to run it with others."""

    def __init__(self, gradients: list[Any], replay: Callable[[list[Any]], Any], handles: list[Any],
                 names: list[str], label: str) -> None:
        self.gradients = gradients
        self.replay = replay
        self.handles = handles
        self.names = names
        self.label = label


class _Trace:
    """What one trace of part 1 recorded."""

    def __init__(self, graph: Any, step: str) -> None:
        self.graph = graph
        self.step = step
        self.updates: list[_Update] = []
        self.mark: int | None = None  # number of ops in the graph when the first update was recorded
        self.update_function: Any = None  # part 3, made on first use
        self.outputs: list[tuple[Callable[[], Any], Any]] = []  # defer_output: (compute, placeholder)
        self.slots: list[list[tuple[int, int]]] = []  # (placeholder leaf, place in the step's flat output)

    def gradients(self) -> list[Any]:
        return [g for u in self.updates for g in u.gradients]

    def check_no_use_after_update(self) -> None:
        """No op made after the first deferred update touches a variable an update changes."""
        if self.mark is None:
            return
        watched = {id(h): (u, n) for u in self.updates for h, n in zip(u.handles, u.names)}
        placeholders = {inner.op.name: watched[id(outer)] for outer, inner in self.graph.captures
                        if id(outer) in watched}
        for op in self.graph.get_operations()[self.mark:]:
            for tensor in op.inputs:
                found = placeholders.get(tensor.op.name)
                if found is not None:
                    update, name = found
                    raise XlaCollectiveError(None, None,
                        f"{self.step}: cannot be compiled with jit_compile=True under an mpidist strategy: after "
                        f"{update.label} (which mpidist runs after the step's compiled forward and backward pass, "
                        f"once the gradients are all-reduced), the step uses variable `{name}`, which that update "
                        f"changes (op `{op.name}` of type {op.type}); compiled in parts it would see the value "
                        f"from before the update. Apply the gradients after everything that uses those "
                        f"variables (e.g. two steps, one per optimizer), or use jit_compile=False")


def _stack(name: str) -> list[Any]:
    stack = getattr(_state, name, None)
    if stack is None:
        stack = []
        setattr(_state, name, stack)
    return stack


def _top(name: str) -> Any:
    stack = _stack(name)
    return stack[-1] if stack else None


def collecting() -> bool:
    """Whether part 1 of a split step is being traced here (``defer_update`` would record): the
    optimizer patches check this first, so that everywhere else they cost one call."""
    return _top("collecting") is not None and _tf_private.in_xla_context()


def defer_update(gradients: Sequence[Any], replay: Callable[[list[Any]], Any], variables: Sequence[Any],
                 label: str, names: Sequence[str] | None = None) -> bool:
    """Called by an optimizer's ``apply`` / ``apply_gradients`` at its entry with the gradients it
    was given (no None), ``replay(reduced)`` that runs it with those gradients summed over the
    replicas, and the (TensorFlow) variables it changes (``names``: how errors name them, else their
    ``name``). True when the update was recorded for part 3 of the
    step being traced (the optimizer must then return without doing anything); False when no
    split step is being traced at this level (the optimizer runs as always)."""
    if not collecting():
        return False
    trace = _top("collecting")
    graph = tf.compat.v1.get_default_graph()
    if graph is not trace.graph:
        raise XlaCollectiveError(None, None,
            f"{label}: called inside control flow (tf.cond, a loop, or a nested tf.function: `{graph.name}`) of "
            f"`{trace.step}`, which is compiled with jit_compile=True under an mpidist strategy. mpidist compiles "
            f"such a step in two parts and runs the optimizer update in the second, after the gradients' "
            f"all-reduce; that can only follow an update made unconditionally. Call {label} at the top level "
            f"of the step, or use jit_compile=False")
    gradients = list(gradients)
    for g in gradients:
        if not isinstance(g, (tf.Tensor, tf.IndexedSlices)):
            raise TypeError(f"{label}: under jit_compile=True with an mpidist strategy the gradients must be "
                            f"tensors or tf.IndexedSlices, got {type(g).__name__}")
    strategy = tf.distribute.get_strategy()
    shown = list(names) if names is not None else [getattr(v, "name", "?") for v in variables]
    handles, names = [], []
    for variable, name in zip(variables, shown):
        for component in strategy.experimental_local_results(variable):
            handle = getattr(component, "handle", None)
            if handle is not None:
                handles.append(handle)
                names.append(name)
    if trace.mark is None:
        trace.mark = len(graph.get_operations())
    trace.updates.append(_Update(gradients, replay, handles, names, label))
    return True


def defer_output(compute: Callable[[], Any]) -> Any:
    """``compute()``, a nest of tensors the step returns (e.g. tf_keras's metric results, which it
    all-reduces every step), made outside XLA. In part 1 of a split step it is traced with the
    cross-replica reads of sync-on-read variables (what the metric results are made of) left
    local, no collective: that placeholder is returned, and the split step replaces it in the
    step's outputs by ``compute()`` made after the compiled parts. Elsewhere: ``compute()``."""
    trace = _top("collecting")
    if trace is None or not _tf_private.in_xla_context():
        return compute()
    stack = _stack("local_reads")
    stack.append(trace)
    try:
        placeholder = compute()
    finally:
        stack.pop()
    trace.outputs.append((compute, placeholder))
    return placeholder


def reading_locally() -> bool:
    """Whether a cross-replica read of a sync-on-read variable now gives this replica's value (no
    collective): while ``defer_output`` traces its placeholder."""
    return _top("local_reads") is not None and _tf_private.in_xla_context()


class _Replay:
    """Part 3's view of one update being replayed: its one gradient reduction returns its input."""

    def __init__(self, step: str, update: _Update) -> None:
        self.step = step
        self.update = update
        self.reductions = 0


def pre_reduced(op: ReduceOp, values: Sequence[Any], where: str) -> list[Any] | None:
    """Inside part 3 of a split step (an update being replayed): the result of the reduction
    ``where`` asks for (``values`` summed over replicas already: SUM is ``values``, MEAN is
    ``values / replicas``), after checking it is that update's one gradient reduction. None
    everywhere else (the caller reduces)."""
    replay = _top("replaying")
    if replay is None or not _tf_private.in_xla_context():
        return None
    update = replay.update
    expected = [(tuple(g.shape.as_list()) if g.shape.rank is not None else None, g.dtype)
                for g in update.gradients]
    got = [(tuple(tf.TensorShape(getattr(v, "shape", None)).as_list())
            if getattr(v, "shape", None) is not None and tf.TensorShape(v.shape).rank is not None else None,
            getattr(v, "dtype", None)) for v in values]
    why = None
    if replay.reductions:
        why = "a second collective"
    elif op not in (ReduceOp.SUM, ReduceOp.MEAN):
        why = f"a {op.value} reduction (only the SUM or MEAN of the gradients can be made before the update)"
    elif len(got) != len(expected) or any(e[1] != g[1] or not _compatible(e[0], g[0]) for e, g in zip(expected, got)):
        why = (f"a reduction of {len(got)} tensors {_describe(got)} where the step's gradients were "
               f"{len(expected)} tensors {_describe(expected)}")
    if why is not None:
        raise XlaCollectiveError(None, None,
            f"{where}: {update.label} makes {why} in the compiled optimizer update of `{replay.step}` "
            f"(jit_compile=True under an mpidist strategy: the update runs after one all-reduce of the "
            f"gradients it was given, in its own XLA function, where no other collective can run). Use "
            f"jit_compile=False for this step")
    replay.reductions += 1
    if op is ReduceOp.SUM:
        return list(values)
    n = tf.distribute.get_strategy().num_replicas_in_sync
    return [tf.IndexedSlices(v.values / n, v.indices, v.dense_shape) if isinstance(v, tf.IndexedSlices)
            else v / tf.cast(n, v.dtype) for v in values]


def _compatible(a: tuple | None, b: tuple | None) -> bool:
    if a is None or b is None:
        return True
    return len(a) == len(b) and all(x is None or y is None or x == y for x, y in zip(a, b))


def _describe(specs: list[tuple]) -> str:
    shown = ", ".join(f"{getattr(d, 'name', d)}{list(s) if s is not None else '[?]'}" for s, d in specs[:4])
    return f"({shown}{', ...' if len(specs) > 4 else ''})"


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
        self._traces: weakref.WeakKeyDictionary[Any, _Trace] = weakref.WeakKeyDictionary()
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
            return self._fn(*args, **kwargs)
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
        trace = _Trace(graph, self.name)
        stack = _stack("collecting")
        stack.append(trace)
        try:
            out = self._call_target(*args, **kwargs)
        finally:
            stack.pop()
        trace.check_no_use_after_update()
        trace.slots = [_slots(self.name, out, placeholder) for _, placeholder in trace.outputs]
        self._traces[graph] = trace
        return out, trace.gradients()

    def _part3(self, trace: _Trace, reduced: list[Any]) -> None:
        stack = _stack("replaying")
        start = 0
        for update in trace.updates:
            part = reduced[start:start + len(update.gradients)]
            start += len(update.gradients)
            replay = _Replay(self.name, update)
            stack.append(replay)
            try:
                update.replay(part)
            finally:
                stack.pop()
            if replay.reductions != 1:
                raise XlaCollectiveError(None, None,
                    f"{self.name}: {update.label} made no all-reduce of its gradients in the compiled optimizer "
                    f"update (jit_compile=True under an mpidist strategy), but mpidist summed them over the "
                    f"replicas before it: an optimizer that does not aggregate gradients (told to skip "
                    f"aggregation) cannot be split this way. Use jit_compile=False for this step")


def _slots(step: str, out: Any, placeholder: Any) -> list[tuple[int, int]]:
    """(leaf of ``placeholder``, its place in the flat output ``out``) for the leaves of a
    ``defer_output`` the step returns; an error if the step computes anything from one (it holds
    this replica's values, not the all-reduced ones the step would see)."""
    where = {id(leaf): i for i, leaf in enumerate(tf.nest.flatten(out))}
    slots = []
    for k, leaf in enumerate(tf.nest.flatten(placeholder)):
        used = [op.name for op in getattr(leaf, "consumers", lambda: [])()]
        if used:
            raise XlaCollectiveError(None, None,
                f"{step}: computes from a value made with a collective (metric results all-reduced over the "
                f"replicas; used by op `{used[0]}`), which mpidist can only make after the step's compiled parts "
                f"(jit_compile=True under an mpidist strategy). Return such values as they are, or use "
                f"jit_compile=False")
        if id(leaf) in where:
            slots.append((k, where[id(leaf)]))
    return slots


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


def xla_message(where: str) -> str:
    """Why a collective (``where``) cannot run in the XLA compilation being traced, and what to do."""
    trace = _top("collecting")
    if trace is not None and _tf_private.in_xla_context():
        return (f"{where}: cannot run inside `{trace.step}`'s forward and backward pass, which mpidist compiles "
                f"with XLA (jit_compile=True under an mpidist strategy): mpidist splits a compiled step only around "
                f"its optimizer update (the gradients' all-reduce runs between the two compiled parts), and XLA "
                f"cannot compile any other collective (they run MPI from a tf.numpy_function). Make this collective "
                f"outside the compiled step, or use jit_compile=False")
    replay = _top("replaying")
    if replay is not None and _tf_private.in_xla_context():
        return (f"{where}: cannot run inside the optimizer update of `{replay.step}` ({replay.update.label}), which "
                f"mpidist compiles with XLA (jit_compile=True under an mpidist strategy): only the all-reduce of "
                f"the update's gradients runs outside XLA, before it (a CentralStorageStrategy update broadcasts "
                f"from the chief, a collective XLA cannot compile). Use jit_compile=False for this step")
    name = _tf_private.xla_function_name()
    return (f"{where}: cannot run inside `{name}`, which is being compiled whole by XLA (jit_compile=True): "
            f"mpidist's collectives run MPI from a tf.numpy_function, which XLA cannot compile. Under an mpidist "
            f"strategy, put jit_compile=True on the function given to strategy.run "
            f"(strategy.run(tf.function(step_fn, jit_compile=True), ...)) or on a Keras model "
            f"(model.compile(jit_compile=True)): mpidist then compiles the step's forward and backward pass and "
            f"its optimizer update with XLA and runs the gradients' all-reduce between them. Otherwise use "
            f"jit_compile=False for `{name}`")
