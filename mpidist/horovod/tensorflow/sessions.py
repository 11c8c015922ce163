"""Horovod collectives in ``tf.compat.v1`` graphs: one order on every rank, chosen per ``Session.run``.

In a v1 graph nothing orders two ops that do not depend on each other, and a ``Session.run`` runs
only the ops its fetches need. Chaining every collective to the one created before it (what
mpidist did first) orders them, but then fetching a collective also runs every earlier one, with
its inputs: placeholders nobody feeds, N²/2 collectives for N fetched one by one. So here a
collective op does no communication itself:

- its op (``submit``, a stateful ``tf.numpy_function``) gets its input arrays. When every collective
  the run needs before it is done (the common case: a training step's one grouped allreduce of its
  gradients, or collectives arriving in order), it runs the collective at once, in the op, and
  returns the results (the *direct* path: no thread, no queue, one Python call per collective).
  Otherwise it hands the arrays to the run's worker thread and returns at once;
- a ``tf.cond`` on the op's first output takes the results from the op (direct) or from a
  ``FIFOQueue`` dequeue (queued). A dequeue waits asynchronously: it holds none of TensorFlow's
  inter-op threads, so any number of queued collectives may wait at once (a Python op that waited
  would hold one, and a few of them would stop the step). A direct collective holds one thread
  while its peers arrive, but only the next collective in order ever runs directly, so at most one
  thread per rank is held, and nothing the step still needs is behind it;
- ``Session.run`` and the Session's callables (``_make_callable_from_options``, behind
  ``make_callable`` and tf_keras's v1 graph functions; wrapped at ``hvd.init()``)
  work out before the step which collectives its fetches need: the ops reached from the fetches
  through inputs and control inputs, fed tensors cut, in creation order (a topological order: no
  collective needs one made after it). Every rank builds the same graph and fetches the same
  things, so every rank gets the same list. Collectives that arrive out of that order wait for the
  run's worker thread (started on the first one: a run whose collectives all arrive in order has
  none), which runs them in order, each once its inputs have arrived, and enqueues each result
  through the same session.

Errors: a collective that raises (on every rank: ``Engine.guard``) is the last one of the step on
every rank: its status goes through the queue, the check after the dequeue raises it, TensorFlow
abandons the step, and nothing later runs. When a step fails elsewhere, results nobody dequeued are
drained before ``run`` returns, so the next step starts clean. A collective inside control flow v1
(it could run zero or many times per step) is refused when it is built; a collective run outside
``Session.run`` and the Session's callables (``partial_run``) raises instead of waiting. Runs of
one graph that need collectives take turns (one at a time per graph).
"""
from __future__ import annotations

import functools
import logging
import threading
import weakref
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import tensorflow as tf

from ...tensorflow import patching
from ...tensorflow.collectives import in_v1_control_flow, wrap_session_callables

_THREAD = "mpidist-v1-collectives"  # the name of the thread that runs a step's collectives
RAISED = 2  # the status output of a collective whose body raised: the check re-raises it
_MAX_PLANS = 1024  # plans kept per graph by the runs' own fetches (a program fetching ever new lists: forgotten)

Body = Callable[..., list[Any]]  # the input arrays -> the outputs

_log = logging.getLogger("mpidist")


class _Collective:
    """One collective of a graph: its body, and the ops that carry its result (built with it)."""

    def __init__(self, index: int, body: Body, types: Sequence[tf.DType], queue: Any) -> None:
        self.index = index
        self.body = body
        self.types = list(types)
        self.placeholders = [tf.compat.v1.placeholder(t) for t in types]
        self.enqueue = queue.enqueue(self.placeholders)
        self.size = queue.size()
        self.drain = queue.dequeue()
        self.error: BaseException | None = None
        self._enqueuers: weakref.WeakKeyDictionary[Any, Callable[..., Any]] = weakref.WeakKeyDictionary()

    def enqueuer(self, session: Any) -> Callable[..., Any]:
        """``session``'s callable that enqueues this collective's outputs (made once per session)."""
        made = self._enqueuers.get(session)
        if made is None:
            made = self._enqueuers[session] = _ORIGINAL_MAKE_CALLABLE(session, self.enqueue, self.placeholders)
        return made

    def outputs(self, arrays: list[np.ndarray]) -> list[Any]:
        """The body's outputs (results, status, message); a raise is kept for ``reraise``."""
        try:
            return self.body(*arrays)
        except Exception as error:  # pylint: disable=broad-except  # re-raised in the step by reraise
            self.error = error
            return [np.zeros([0], t.as_numpy_dtype) for t in self.types[:-2]] + [np.int32(RAISED), b""]

    def reraise(self, status: np.ndarray) -> np.int32:
        """The body of the op that raises this collective's error in the step (the exception the body
        raised; TensorFlow maps it as for any ``numpy_function``)."""
        error, self.error = self.error, None
        if int(status) == RAISED and error is not None:
            raise error
        return np.int32(0)


class _Step:
    """The collectives one run needs, in creation order: each runs directly in its op when it is the
    next one, else on a worker thread (started when first needed) once its turn comes."""

    def __init__(self, session: Any, plan: list[_Collective]) -> None:
        self._session = session
        self._plan = plan
        self._position = {c.index: k for k, c in enumerate(plan)}
        self._next = 0  # the plan position of the next collective to run
        self._busy = False  # a collective is running (directly or on the thread)
        self._inputs: dict[int, list[np.ndarray]] = {}
        self._cond = threading.Condition()
        self._over = False
        self._enqueued: list[_Collective] = []
        self._thread: threading.Thread | None = None

    def submit(self, index: int, arrays: list[np.ndarray]) -> list[Any] | None:
        """The collective's outputs when it ran here (its turn had come), None when it was queued."""
        with self._cond:
            position = self._position.get(index)
            if position is None or self._over or position < self._next:
                raise RuntimeError(
                    "mpidist.horovod: a tf.compat.v1 collective ran that this Session.run did not plan "
                    "(run through Session.run or Session.make_callable; partial_run is not supported)")
            if position == self._next and not self._busy:
                self._busy = True
            else:
                self._inputs[index] = arrays
                if self._thread is None:
                    self._thread = threading.Thread(target=self._loop, name=_THREAD, daemon=True)
                    self._thread.start()
                self._cond.notify_all()
                return None
        outs = self._plan[position].outputs(arrays)
        self._done(outs)
        return outs

    def _done(self, outs: list[Any]) -> None:
        with self._cond:
            self._next += 1
            self._busy = False
            if int(outs[-2]) != 0:  # raised on every rank: the last collective of this step
                self._over = True
            self._cond.notify_all()

    def _turn(self) -> tuple[_Collective, list[np.ndarray]] | None:
        """The next collective and its inputs once they are here (None: the step is over)."""
        with self._cond:
            while not self._over and self._next < len(self._plan):
                collective = self._plan[self._next]
                if not self._busy and collective.index in self._inputs:
                    self._busy = True
                    return collective, self._inputs.pop(collective.index)
                self._cond.wait()
            return None

    def _loop(self) -> None:
        while True:
            found = self._turn()
            if found is None:  # every collective ran, or the step ended without them (an error elsewhere)
                return
            collective, arrays = found
            outs = collective.outputs(arrays)
            collective.enqueuer(self._session)(*outs)
            self._enqueued.append(collective)
            self._done(outs)

    def finish(self, failed: bool) -> None:
        """After the step: stop the thread; after a failed step, drop results nobody dequeued."""
        with self._cond:
            self._over = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
        if failed:
            try:
                for collective in self._enqueued:
                    if _ORIGINAL_RUN(self._session, collective.size) > 0:
                        _ORIGINAL_RUN(self._session, collective.drain)
            except (tf.errors.OpError, RuntimeError) as error:  # a closed session: the step's own error stands
                _log.debug("mpidist.horovod: results of a failed step not drained: %s", error)


class _Graph:
    """The v1 collectives of one graph and the step running them."""

    def __init__(self) -> None:
        self.by_op: dict[str, _Collective] = {}  # the submit op's name -> its collective
        self.by_index: dict[int, _Collective] = {}
        self.plans: dict[Any, list[_Collective]] = {}
        self.quick: dict[tuple, list[_Collective]] = {}  # plans by the run's own fetches and fed keys
        self.turn = threading.Lock()
        self.step: _Step | None = None
        self.owner: int | None = None  # the thread whose run the step is

    def submit(self, index: int, *arrays: np.ndarray) -> list[Any]:
        """The body of a collective's op: 1 and its outputs when it ran at once, else 0 and stand-ins
        (its results then come through its queue)."""
        step = self.step
        if step is None:
            raise RuntimeError("mpidist.horovod: a tf.compat.v1 collective ran outside Session.run / "
                               "Session.make_callable (partial_run is not supported)")
        outs = step.submit(index, list(arrays))
        if outs is not None:
            return [np.int32(1), *outs]
        collective = self.by_index[index]
        return [np.int32(0)] + [np.zeros([0], t.as_numpy_dtype) for t in collective.types[:-2]] + \
            [np.int32(0), b""]

    def plan(self, graph: tf.Graph, fetches: Any, fed: Any) -> list[_Collective]:
        """The collectives a run of ``fetches`` with ``fed`` fed needs, in creation order: looked up
        by the objects themselves when they are hashable (a training loop's every run after the
        first: no graph lookups), else worked out from their graph elements' names."""
        quick = (fetches if not isinstance(fetches, list) else tuple(fetches), tuple(fed), len(self.by_op))
        try:
            found = self.quick.get(quick)
        except TypeError:  # a dict or nested list among the fetches: the graph elements' key below
            return self._plan(graph, fetches, fed)
        if found is None:
            found = self._plan(graph, fetches, fed)
            if len(self.quick) > _MAX_PLANS:
                self.quick.clear()
            try:
                self.quick[quick] = found
            except TypeError:  # (hashable, but compared with another key to a tensor: not kept)
                pass
        return found

    def _plan(self, graph: tf.Graph, fetches: Any, fed: Any) -> list[_Collective]:
        targets = [_element(graph, x, True) for x in _leaves(fetches)]
        cut = {_element(graph, x, False).name for x in _leaves(fed)}
        key = (tuple(t.name for t in targets), frozenset(cut), len(self.by_op))
        if key not in self.plans:
            seen: set[str] = set()
            stack = [t if isinstance(t, tf.Operation) else t.op for t in targets]
            found = []
            while stack:
                op = stack.pop()
                if op.name in seen:
                    continue
                seen.add(op.name)
                if op.name in self.by_op:
                    found.append(self.by_op[op.name])
                stack.extend(t.op for t in op.inputs if t.name not in cut)
                stack.extend(op.control_inputs)
            self.plans[key] = sorted(found, key=lambda c: c.index)
        return self.plans[key]

    def ordered(self, session: Any, fetches: Any, fed: Any, call: Callable[[], Any]) -> Any:
        """``call()`` (the session's run) with this graph's collectives run in order beside it."""
        if self.owner == threading.get_ident() or threading.current_thread().name == _THREAD:
            return call()  # a run inside one being ordered (make_callable's own), or the step's enqueues
        try:
            plan = self.plan(session.graph, fetches, fed)
        except (TypeError, ValueError, KeyError):  # not a graph element: TensorFlow's own error says so
            return call()
        if not plan:
            return call()
        with self.turn:
            self.step = step = _Step(session, plan)
            self.owner = threading.get_ident()
            failed = True
            try:
                result = call()
                failed = False
                return result
            finally:
                self.step = self.owner = None
                step.finish(failed)


_ATTRIBUTE = "_mpidist_v1_collectives"  # a graph's _Graph, kept on the graph (its ops refer to the graph)
_ORIGINAL_RUN: Callable[..., Any] = tf.compat.v1.Session.run
_ORIGINAL_MAKE_CALLABLE: Callable[..., Any] = tf.compat.v1.Session.make_callable  # our enqueue callables


def collective(name: str, body: Body, tensors: Sequence[tf.Tensor], types: Sequence[tf.DType],
               where: str) -> tuple[list[tf.Tensor], Callable[[np.ndarray], np.int32]]:
    """A collective op in the current v1 graph: ``body(*arrays)`` returns its outputs ``types``
    (results, then an int32 status and a string message). Returns the outputs and the body of the
    op that re-raises the body's exception where the status is ``RAISED``."""
    install()  # hvd.init() has (a second call does nothing)
    graph = tf.compat.v1.get_default_graph()
    state = getattr(graph, _ATTRIBUTE, None)
    if state is None:
        state = _Graph()
        setattr(graph, _ATTRIBUTE, state)
    index = len(state.by_op)
    submitted = tf.numpy_function(functools.partial(state.submit, index), list(tensors), [tf.int32, *types],
                                  stateful=True, name=name)
    if in_v1_control_flow(submitted[0].op):
        raise NotImplementedError(
            f"{where}: a Horovod collective inside tf.compat.v1 control flow (control flow v1, after "
            f"tf.compat.v1.disable_control_flow_v2() or disable_v2_behavior()) is not supported: it may run "
            f"zero or many times in a step, and mpidist orders a step's collectives before it starts; "
            f"keep control flow v2 (TensorFlow 2's default) or move the collective out of the cond/loop")
    queue = tf.queue.FIFOQueue(1, list(types))
    entry = _Collective(index, body, types, queue)
    ran_here, direct = submitted[0], submitted[1:]
    outs = select(tf.equal(ran_here, 1), direct, lambda: list(queue.dequeue()))
    state.by_op[submitted[0].op.name] = entry
    state.by_index[index] = entry
    return list(outs), entry.reraise


def select(pred: tf.Tensor, when_true: Sequence[tf.Tensor], when_false: Callable[[], Sequence[tf.Tensor]]
           ) -> list[tf.Tensor]:
    """``when_true`` where ``pred`` holds, else what ``when_false()`` builds (run only then), in a v1
    graph: TensorFlow's Switch and Merge. ``tf.cond`` here is a functional If, which cost ~0.9 ms per
    run in a Session (measured: a training step of 0.5 ms took 1.5 ms with one), Switch/Merge ~0."""
    true_side = [tf.raw_ops.Switch(data=t, pred=pred)[1] for t in when_true]
    gate = tf.identity(tf.raw_ops.Switch(data=pred, pred=pred)[0])  # dead unless pred is false: so is all after it
    with tf.control_dependencies([gate]):
        false_side = list(when_false())
    return [tf.raw_ops.Merge(inputs=[t, f])[0] for t, f in zip(true_side, false_side)]


def install() -> None:
    """Wrap ``Session.run`` and the Session's callables (at ``hvd.init()``, through the patch registry:
    once, thread-safe): runs of graphs without mpidist v1 collectives go straight through."""
    for cls in (tf.compat.v1.Session, tf.compat.v1.InteractiveSession):
        patching.patch(cls, "run", _ordered_run, checked=patching.TENSORFLOW,
                       reason="hvd collectives in a tf.compat.v1 graph run in one order on every rank")
    wrap_session_callables(_callables_ordered,
                           reason="hvd collectives in a v1 graph run in one order in make_callable's callables")


def _ordered_run(original: Callable[..., Any]) -> Callable[..., Any]:
    """``Session.run`` whose runs of a graph with mpidist v1 collectives run them in order."""
    def run(self: Any, fetches: Any, feed_dict: Any = None, options: Any = None, run_metadata: Any = None) -> Any:
        state = getattr(self.graph, _ATTRIBUTE, None)
        call = functools.partial(original, self, fetches, feed_dict, options, run_metadata)
        if state is None:
            return call()
        return state.ordered(self, fetches, list(feed_dict or ()), call)
    return run


def _callables_ordered(original: Callable[..., Any]) -> Callable[..., Any]:
    """``Session._make_callable_from_options`` whose callables run their collectives in order: what
    ``make_callable`` and tf_keras's v1 graph functions call (fetches and feeds by name)."""
    @functools.wraps(original)
    def make(self: Any, callable_options: Any) -> Any:
        made = original(self, callable_options)
        state = getattr(self.graph, _ATTRIBUTE, None)
        if state is None:
            return made
        fetches = list(callable_options.fetch) + list(callable_options.target)
        fed = list(callable_options.feed)

        @functools.wraps(made)
        def ordered(*args: Any, **kwargs: Any) -> Any:
            return state.ordered(self, fetches, fed, functools.partial(made, *args, **kwargs))
        return ordered
    return make


def _leaves(structure: Any) -> Iterator[Any]:
    """The fetches (or fed keys) of a run, as Session.run takes them: nested lists, tuples and dicts;
    a SparseTensor or IndexedSlices is its component tensors."""
    if isinstance(structure, dict):
        for value in structure.values():
            yield from _leaves(value)
    elif isinstance(structure, (list, tuple)):
        for value in structure:
            yield from _leaves(value)
    elif isinstance(structure, tf.SparseTensor):
        yield from (structure.indices, structure.values, structure.dense_shape)
    elif isinstance(structure, tf.IndexedSlices):
        yield from (t for t in (structure.values, structure.indices, structure.dense_shape) if t is not None)
    elif structure is not None:
        yield structure


def _element(graph: tf.Graph, x: Any, allow_operation: bool) -> Any:
    return graph.as_graph_element(x, allow_tensor=True, allow_operation=allow_operation)
