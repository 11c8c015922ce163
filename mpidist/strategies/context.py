"""Which strategy is current, and whether code runs in a replica or cross-replica context.

A thread-local stack as in TensorFlow: ``strategy.scope()`` pushes a cross-replica context,
``strategy.run(fn)`` a replica context, ``ReplicaContext.merge_call`` a cross-replica context again.
Outside any scope the default strategy (one replica, this rank alone: default.py, which also holds
``get_strategy`` and ``get_replica_context``, the two functions that fall back to it) is current.
When TensorFlow is loaded and no mpidist (NumPy) strategy is active, the module functions answer
what ``tf.distribute`` answers, so they also see mpidist's TensorFlow strategies.
"""
from __future__ import annotations

import sys
import threading
from typing import Any, Callable

from ..cross_device import ReduceOp, as_reduce_op, hints_and_options

_state = threading.local()
_global_default: list[Any] = []   # experimental_set_strategy(s): the strategy current everywhere


def _stack() -> list[tuple[Any, ReplicaContext | None]]:
    stack = getattr(_state, "stack", None)
    if stack is None:
        stack = _state.stack = []
    return stack


def push(strategy: Any, replica: ReplicaContext | None) -> None:
    _stack().append((strategy, replica))


def pop() -> None:
    _stack().pop()


def tf_distribute() -> Any:
    """``tf.distribute`` when the program has imported TensorFlow, else None (never imports it)."""
    tf = sys.modules.get("tensorflow")
    return getattr(tf, "distribute", None)


def top() -> tuple[Any, ReplicaContext | None] | None:
    """(strategy, replica context or None) of the innermost scope, or the strategy set with
    ``experimental_set_strategy``; None outside both."""
    stack = _stack()
    if stack:
        return stack[-1]
    if _global_default:
        return (_global_default[0], None)
    return None


def has_strategy() -> bool:
    """Whether a non-default strategy is current."""
    if top() is not None:
        return True
    tfd = tf_distribute()
    return bool(tfd is not None and tfd.has_strategy())


def in_cross_replica_context() -> bool:
    current = top()
    if current is None:
        tfd = tf_distribute()
        return bool(tfd is not None and tfd.in_cross_replica_context())
    return current[1] is None


def experimental_set_strategy(strategy: Any) -> None:
    """Make ``strategy`` current everywhere (None: back to the default), like entering its scope
    for good. Cannot be called inside a scope."""
    if _stack():
        raise RuntimeError("experimental_set_strategy: must not be called inside a `with strategy.scope()` block")
    _global_default.clear()
    if strategy is not None:
        _global_default.append(strategy)


def get_loss_reduction() -> ReduceOp:
    """The ReduceOp matching the loss reduction: MEAN (losses are averaged over the global batch)."""
    return ReduceOp.MEAN


class ReplicaContext:
    """The context of one replica (this rank) inside ``strategy.run``."""

    def __init__(self, strategy: Any, replica_id_in_sync_group: int) -> None:
        self._strategy = strategy
        self._replica_id = replica_id_in_sync_group

    @property
    def strategy(self) -> Any:
        return self._strategy

    @property
    def replica_id_in_sync_group(self) -> int:
        return self._replica_id

    @property
    def num_replicas_in_sync(self) -> int:
        return self._strategy.num_replicas_in_sync

    @property
    def devices(self) -> tuple[str, ...]:
        return (self._strategy.extended.worker_devices[0],)

    def all_reduce(self, reduce_op: Any, value: Any, options: Any = None, experimental_hints: Any = None) -> Any:
        """Reduce a nest across replicas in one logical collective."""
        where = "ReplicaContext.all_reduce"
        op = as_reduce_op(reduce_op, where)
        extended = self._strategy.extended
        call = extended.call_options(hints_and_options(options, experimental_hints, where), where)
        return extended.all_reduce(op, value, call)

    def all_gather(self, value: Any, axis: int, options: Any = None, experimental_hints: Any = None) -> Any:
        """Concatenate every replica's value along ``axis`` (sizes along it may differ)."""
        where = "ReplicaContext.all_gather"
        extended = self._strategy.extended
        call = extended.call_options(hints_and_options(options, experimental_hints, where), where)
        return extended.gather(value, axis, call, where)

    def merge_call(self, merge_fn: Callable[..., Any], args: tuple = (), kwargs: dict | None = None) -> Any:
        """Call ``merge_fn(strategy, *args, **kwargs)`` in the cross-replica context."""
        push(self._strategy, None)
        try:
            return merge_fn(self._strategy, *args, **(kwargs or {}))
        finally:
            pop()

    def __repr__(self) -> str:
        return f"ReplicaContext(replica_id_in_sync_group={self._replica_id}, num_replicas_in_sync=" \
               f"{self.num_replicas_in_sync})"
