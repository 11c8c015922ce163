"""broadcast_object, broadcast_object_fn and allgather_object: picklable Python objects.

Objects are pickled (cloudpickle when installed, as Horovod does, else pickle) and travel as
uint8 arrays through the process set's engine. ``session`` is accepted for Horovod's graph-mode
signature and unused: these functions run at once in every mode.
"""
from __future__ import annotations

import io
import pickle
from typing import Any, Callable

import numpy as np

from . import joins
from .process_sets import ProcessSet, global_process_set

try:
    import cloudpickle as _pickler  # type: ignore[import-untyped]  # no type information shipped
except ImportError:  # pragma: no cover - depends on the environment
    _pickler = pickle


def _dumps(obj: Any) -> np.ndarray:
    buf = io.BytesIO()
    _pickler.dump(obj, buf)
    return np.frombuffer(buf.getvalue(), dtype=np.uint8)


def broadcast_object(obj: Any, root_rank: int = 0, session: Any = None, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """``root_rank``'s ``obj`` on every rank (other ranks' ``obj`` is ignored)."""
    engine = process_set.require_engine("broadcast_object")
    with engine.guard("broadcast_object"):  # a pickling error on the root: an error on every rank
        mine = _dumps(obj) if engine.rank == root_rank else None
    data = joins.collective(engine, "broadcast_object", lambda: joins.broadcast_bytes(engine, mine, root_rank))
    if engine.rank == root_rank:
        return obj
    return pickle.loads(data.tobytes())


def broadcast_object_fn(root_rank: int = 0, session: Any = None, name: str | None = None,
                        process_set: ProcessSet = global_process_set) -> Callable[[Any], Any]:
    """A function ``f(obj)`` that broadcasts ``obj`` from ``root_rank`` (Horovod's graph-mode helper)."""
    def broadcast_fn(obj: Any) -> Any:
        return broadcast_object(obj, root_rank, session, name, process_set)
    return broadcast_fn


def allgather_object(obj: Any, session: Any = None, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> list[Any]:
    """Every rank's ``obj``, as a list in rank order."""
    engine = process_set.require_engine("allgather_object")
    with engine.guard("allgather_object"):  # a pickling error on one rank: an error on every rank
        data = _dumps(obj)
    sizes, gathered = joins.collective(engine, "allgather_object", lambda: (
        engine.allgather(np.array([data.size], np.int64)), np.asarray(engine.allgather(data))))
    out, at = [], 0
    for n in np.asarray(sizes).tolist():
        out.append(pickle.loads(gathered[at:at + n].tobytes()))
        at += n
    return out
