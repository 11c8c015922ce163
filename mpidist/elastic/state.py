"""Training state that survives the loss of ranks: commit in memory, restore, sync.

With one replica per rank every surviving rank holds the whole model, so a commit is a copy in
this process's memory (no file, no network); after ranks die, ``mpidist.elastic.run`` restores
each survivor's last commit and then syncs: the lowest surviving rank's committed state is
broadcast to the others (survivors may have committed different steps if they were in different
places when the death was seen).
"""
from __future__ import annotations

import copy
from typing import Any, Callable


class State:
    """Base class: what a commit is (:meth:`save`/:meth:`load`) is the subclass's choice.

    ``strategy``: the strategy whose engine's communicator is shrunk on a failure (its public
    ``engine``). Every public attribute set on the state (``state.step = 3``, or keyword arguments
    of the constructor) is committed with it.
    """

    # set with object.__setattr__ (public attributes set the usual way are committed ones)
    _strategy: Any
    _committed: Any
    _reset_callbacks: list[Callable[[], None]]
    _commit_hooks: list[Callable[[State], None]]
    commits: int

    def __init__(self, strategy: Any, **kwargs: Any) -> None:
        if not hasattr(strategy, "engine"):
            raise TypeError(f"{type(self).__name__}: `strategy` must be an mpidist strategy (with an `engine`), "
                            f"got {type(strategy).__name__}")
        object.__setattr__(self, "_strategy", strategy)
        object.__setattr__(self, "_committed", None)
        object.__setattr__(self, "_reset_callbacks", [])
        object.__setattr__(self, "_commit_hooks", [])
        object.__setattr__(self, "commits", 0)
        for name, value in kwargs.items():
            setattr(self, name, value)

    # -- what subclasses define -------------------------------------------------------------------
    def save(self) -> Any:
        """A picklable snapshot of the state (taken by commit)."""
        return self.attributes()

    def load(self, snapshot: Any) -> None:
        """Make the state ``snapshot`` again (used by restore and sync)."""
        for name in [n for n in vars(self) if _public(n) and n != "commits"]:
            if name not in snapshot:
                delattr(self, name)
        for name, value in snapshot.items():
            setattr(self, name, copy.deepcopy(value))

    # -- the protocol -----------------------------------------------------------------------------
    @property
    def strategy(self) -> Any:
        return self._strategy

    def engines(self) -> list[Any]:
        """The engines whose communicator a recovery replaces (the strategy's ``engine``)."""
        return [self._strategy.engine]

    def attributes(self) -> dict[str, Any]:
        """Deep copies of the public attributes set on this state."""
        return {n: copy.deepcopy(v) for n, v in vars(self).items() if _public(n) and n != "commits"}

    def commit(self) -> None:
        """Keep the current state in memory as the point to roll back to (local, no communication,
        except what a commit hook such as ``on_preemption``'s does)."""
        object.__setattr__(self, "_committed", self.save())
        object.__setattr__(self, "commits", self.commits + 1)
        for hook in list(self._commit_hooks):
            hook(self)

    def committed(self) -> Any:
        """The last commit (what :meth:`save` returned then), or None before the first one."""
        return self._committed

    def add_commit_hook(self, hook: Callable[[State], None]) -> None:
        """``hook(state)`` runs after each commit (``on_preemption`` uses it; it may communicate)."""
        self._commit_hooks.append(hook)

    def restore(self) -> None:
        """Go back to the last commit (nothing happens before the first one)."""
        if self._committed is not None:
            self.load(copy.deepcopy(self._committed))

    def sync(self) -> None:
        """Every rank gets the lowest rank's state, which becomes everyone's commit (collective over
        the strategy's engine; after a shrink the lowest rank is the lowest surviving one)."""
        comm = self.engines()[0].topology.comm
        snapshot = self._committed if self._committed is not None else self.save()
        if comm.Get_size() > 1:
            snapshot = comm.bcast(snapshot if comm.Get_rank() == 0 else None, root=0)
        self.load(copy.deepcopy(snapshot))
        object.__setattr__(self, "_committed", snapshot)

    def register_reset_callbacks(self, callbacks: list[Callable[[], None]]) -> None:
        """Functions called (no arguments) after each recovery, once the state is synced."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        for callback in self._reset_callbacks:
            callback()


class ObjectState(State):
    """State made of picklable Python values (NumPy arrays, numbers, lists ...), given as keyword
    arguments or set as attributes later; a commit is a deep copy of them."""


def _public(name: str) -> bool:
    return not name.startswith("_")

