"""What the two compiled parts of a split step record and replay (the step: xla.py).

While part 1 (``<step>_forward_backward``) is traced, the optimizer patches hand their update to
``defer_update`` (recorded in the ``Trace``, not run) and tf_keras's metric results go through
``defer_output`` (a placeholder traced with local reads); while part 3 (``<step>_update``) replays
an update, ``pre_reduced`` answers the optimizer's own gradient all-reduce with its input. Every
collective that cannot be split off gets ``xla_message``: why, naming the function, and what to
do. The state is per thread (tracing happens in the calling thread).
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator, Sequence

import tensorflow as tf

from ..cross_device.reduce_op import ReduceOp
from . import _tf_private

_state = threading.local()  # stacks: .collecting (part-1 traces), .replaying (part-3 updates), .local_reads


class XlaCollectiveError(tf.errors.UnimplementedError):
    """A collective was traced for XLA (``jit_compile=True``) where mpidist cannot split it off.

    A ``tf.errors.UnimplementedError`` (so AutoGraph re-raises it with its type kept)."""

    def __init__(self, node_def: Any, op: Any, message: str, *args: Any) -> None:
        super().__init__(node_def, op, message, *args)


class Update:
    """One optimizer update recorded in part 1: its gradients and how to run it with others."""

    def __init__(self, gradients: list[Any], replay: Callable[[list[Any]], Any], handles: list[Any],
                 names: list[str], label: str) -> None:
        self.gradients = gradients
        self.replay = replay
        self.handles = handles
        self.names = names
        self.label = label


class Trace:
    """What one trace of part 1 recorded."""

    def __init__(self, graph: Any, step: str) -> None:
        self.graph = graph
        self.step = step
        self.updates: list[Update] = []
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


@contextlib.contextmanager
def recording(graph: Any, step: str) -> Iterator[Trace]:
    """Part 1 of ``step`` is being traced into ``graph``: what it defers goes to the Trace yielded."""
    trace = Trace(graph, step)
    stack = _stack("collecting")
    stack.append(trace)
    try:
        yield trace
    finally:
        stack.pop()


@contextlib.contextmanager
def replaying(step: str, update: Update) -> Iterator[Replay]:
    """Part 3 of ``step`` replays ``update``: its gradient all-reduce is answered by ``pre_reduced``."""
    replay = Replay(step, update)
    stack = _stack("replaying")
    stack.append(replay)
    try:
        yield replay
    finally:
        stack.pop()


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
    trace.updates.append(Update(gradients, replay, handles, names, label))
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


def replaying_update() -> bool:
    """Whether part 3 of a split step is being traced here: the optimizer update being replayed was
    given gradients summed over the replicas already (the same on every rank)."""
    return _top("replaying") is not None and _tf_private.in_xla_context()


def reading_locally() -> bool:
    """Whether a cross-replica read of a sync-on-read variable now gives this replica's value (no
    collective): while ``defer_output`` traces its placeholder."""
    return _top("local_reads") is not None and _tf_private.in_xla_context()


class Replay:
    """Part 3's view of one update being replayed: its one gradient reduction returns its input."""

    def __init__(self, step: str, update: Update) -> None:
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


def output_slots(step: str, out: Any, placeholder: Any) -> list[tuple[int, int]]:
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
