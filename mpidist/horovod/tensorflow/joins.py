"""Horovod's ``join``: ranks that ran out of data stop while the others keep reducing.

Every engine call of the Horovod layer passes through this module. A rank that has joined waits
in ``Engine.stand_by``: it takes part in the agreement exchange of the active ranks' next
collective with a reserved signature (collectives/agreement.py, "Standing by"), the exchange that
every collective makes anyway. So while every rank is active (the usual case) join support costs
nothing: no MPI call, and a repeated step still speculates its agreement. When the exchange shows
a rank standing by, the active ranks' engine call raises ``StandingByError`` (nothing returned,
nothing outstanding) and every rank takes the protocol below, then the active ranks run their
collective again. The protocol starts with a 16-byte control word (an engine allreduce of four
int32 with MIN, so the stall report, the agreement check and deadlines cover it like any
collective):

    [0 if active else 1,  1 if active else 0,  rank if active else size,  -(rank + 1) if just joined else 0]

Without ``rc.check_agreement`` there is no exchange to carry a standing rank, and the ranks
exchange this word before every Horovod collective instead (the cost of join support before
issue 33: one small allreduce per collective; none on a set of one rank).

- Every rank active: the collective runs as it is.
- Some ranks joined, some active: the lowest active rank broadcasts what the collective is (kind,
  op, dtypes, shapes), and one more small allreduce checks that every active rank issued that.
  For an allreduce the joined ranks, looping inside ``join()``, take part with
  the op's identity (zeros for Sum and Average, so Average still divides by the set's size as in
  Horovod; +inf/-inf/1 for Min/Max/Product; a Product is an engine allgather, see
  ``_product_in_rank_order``, on the joined ranks too). Any other collective (allgather, broadcast, alltoall,
  reducescatter, barrier, objects) is refused with CollectiveMismatchError on every rank, the
  joined ones raising from ``join()``, as Horovod refuses them ("not supported with Join").
- No rank active: every rank has joined; ``join()`` returns on every rank the last rank that
  joined (the highest of those that joined in that last exchange: with stand-by, one more small
  allreduce after it).
"""
from __future__ import annotations

import pickle
from typing import Any, Callable

import numpy as np

from ...collectives import Engine
from ...collectives.ops import ReduceOp
from ...errors import CollectiveMismatchError, StandingByError

ALLREDUCE = "allreduce"


def _exchange(engine: Engine, joined: bool, new: bool) -> np.ndarray:
    if joined:
        word = np.array([1, 0, engine.size, -(engine.rank + 1) if new else 0], np.int32)
    else:
        word = np.array([0, 1, engine.rank, 0], np.int32)
    return np.asarray(engine.allreduce(word, ReduceOp.MIN))


def _describe(kind: str, value: Any, op: Any) -> tuple:
    if kind != ALLREDUCE:
        return (kind, None, None)
    if isinstance(value, (list, tuple)):
        return (kind, op, (type(value), [(np.asarray(v).dtype.str, np.shape(v)) for v in value]))
    return (kind, op, (np.asarray(value).dtype.str, np.shape(value)))


def broadcast_bytes(engine: Engine, data: np.ndarray | None, root: int) -> np.ndarray:
    """``root``'s uint8 array ``data`` on every rank (other ranks pass None): two engine
    broadcasts, its length and its bytes (objects.py's object broadcast uses it too)."""
    if engine.rank != root:
        data = np.zeros(0, np.uint8)
    assert data is not None, "broadcast_bytes: the root passes its data"
    length = engine.broadcast(np.array([data.size], np.int64), root=root)
    if engine.rank != root:
        data = np.empty(int(np.asarray(length)[0]), np.uint8)
    return np.asarray(engine.broadcast(data, root=root))


def _share(engine: Engine, root: int, description: tuple | None) -> tuple:
    """``root``'s description on every rank."""
    mine = np.frombuffer(pickle.dumps(description), np.uint8) if engine.rank == root else None
    data = broadcast_bytes(engine, mine, root)
    if engine.rank == root:
        assert description is not None, "the root is an active rank: it describes its collective"
        return description
    return pickle.loads(data.tobytes())


def _agree(engine: Engine, ok: bool, mine: tuple | None, root: int, theirs: tuple) -> None:
    """After a description was shared: every rank checks it issued the same collective (one more
    small allreduce, only while a rank has joined), so a mismatch is an error on every rank."""
    if not np.asarray(engine.allreduce(np.array([int(ok)], np.int32), ReduceOp.MIN))[0]:
        def what(d: tuple) -> str:
            return d[0] if d[2] is None else f"{d[0]} {d[2]}"
        this = "has joined" if mine is None else f"issued {what(mine)}"
        raise CollectiveMismatchError(
            f"hvd.{theirs[0]}: ranks issued different collectives while a rank had joined (hvd.join): "
            f"rank {root} issued {what(theirs)}, this rank {this}")


def refusal(kind: str) -> CollectiveMismatchError:
    hint = " Specify sparse_as_dense=True if using DistributedOptimizer." if kind == "allgather" else ""
    return CollectiveMismatchError(
        f"hvd.{kind}: not supported while a rank has joined (hvd.join): ranks that joined stand in for "
        f"allreduce only, as in Horovod.{hint}")


def _op_name(op: Any) -> str:
    """The engine op's name in lower case ("sum", "prod", ...), from an ``Op`` or a string."""
    return str(getattr(op, "value", op)).lower()


def identity(dtype: np.dtype, op: Any) -> Any:
    """The value a joined rank contributes to a reduction with ``op``."""
    name = _op_name(op)
    if name in ("sum", "mean"):
        return 0
    if name == "prod":
        return 1
    biggest = name == "min"
    if dtype.kind == "b":
        return biggest
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return info.max if biggest else info.min
    return np.inf if biggest else -np.inf


def _stand_in(structure: Any, op: Any) -> Any:
    def one(spec: tuple) -> np.ndarray:
        dtype = np.dtype(spec[0])
        return np.full(spec[1], identity(dtype, op), dtype)
    if isinstance(structure[0], type):  # (list or tuple, specs)
        return structure[0](one(s) for s in structure[1])
    return one(structure)


def admit(engine: Engine, kind: str, value: Any = None, op: Any = None) -> None:
    """Before a collective of this (active) rank, where the engine cannot carry standing ranks
    (not ``engine.stands_by``), or after its engine call found some (``StandingByError``): serve or
    refuse the ranks that have joined."""
    if engine.size == 1:
        return  # no other rank can have joined
    word = _exchange(engine, False, False)
    if word[1] == 1:
        return  # every rank is active
    mine = _describe(kind, value, op)
    theirs = _share(engine, int(word[2]), mine)
    _agree(engine, theirs == mine, mine, int(word[2]), theirs)
    if kind != ALLREDUCE:
        raise refusal(kind)


def allreduce(engine: Engine, value: Any, op: Any) -> Any:
    """``engine.allreduce(value, op)``; ranks that have joined contribute the op's identity."""
    return collective(engine, ALLREDUCE, lambda: _reduce(engine, value, op), value, op)


def _reduce(engine: Engine, value: Any, op: Any) -> Any:
    if _op_name(op) == "prod":
        return _product_in_rank_order(engine, value)
    return engine.allreduce(value, op)


def _product_in_rank_order(engine: Engine, value: Any) -> Any:
    """Product as one process computes it over the ranks' tensors stacked in rank order
    (``tf.reduce_prod(..., axis=0)``, ``np.prod``): ``((x0 * x1) * x2) ...``, rounded in the tensor's
    dtype at each step (float16 too, as Horovod's CPU float16 product). MPI_PROD's order depends on
    the algorithm and the message size, so floating-point products would differ from that in the
    last bit at 3 ranks and more. One engine allgather of every leaf as a row, then the fold here:
    a Product moves ``size`` times the data of a Sum (Horovod programs use it for small tensors)."""
    leaves = list(value) if isinstance(value, (list, tuple)) else [value]
    arrays = [np.asarray(v) for v in leaves]
    rows = engine.allgather([a.reshape(1, -1) for a in arrays])
    out = []
    for a, gathered in zip(arrays, rows):
        gathered = np.asarray(gathered).reshape(engine.size, -1)
        acc = gathered[0].copy()
        for row in gathered[1:]:
            np.multiply(acc, row, out=acc)  # bool: logical and
        out.append(acc.reshape(a.shape))
    return type(value)(out) if isinstance(value, (list, tuple)) else out[0]


def collective(engine: Engine, kind: str, call: Callable[[], Any], value: Any = None, op: Any = None) -> Any:
    """``call()``: the engine collective(s) of one Horovod collective of ``kind`` (an allreduce's
    ``value`` and ``op``); while a rank has joined, an allreduce is served (the joined ranks
    contribute the op's identity) and anything else refused on every rank."""
    if not engine.stands_by:
        admit(engine, kind, value, op)
        return call()
    try:
        return call()
    except StandingByError:  # its first engine call met a rank standing by: nothing ran
        admit(engine, kind, value, op)  # refuses anything but an allreduce, on every rank
        return call()


def join(engine: Engine) -> int:
    """Stand in for this rank's allreduces until every rank has joined; the last rank that joined."""
    if engine.size == 1:
        return engine.rank
    new = True
    while True:
        if engine.stands_by and engine.stand_by():  # every rank stands by: the highest that just joined
            last = engine.allreduce(np.array([-(engine.rank + 1) if new else 0], np.int32), ReduceOp.MIN)
            return -int(np.asarray(last)[0]) - 1
        word = _exchange(engine, True, new)
        new = False
        if word[0] == 1:  # no rank is active any more
            return -int(word[3]) - 1
        theirs = _share(engine, int(word[2]), None)
        _agree(engine, True, None, int(word[2]), theirs)
        kind, op, structure = theirs
        if kind != ALLREDUCE:
            raise refusal(kind)
        _reduce(engine, _stand_in(structure, op), op)
