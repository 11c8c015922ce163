"""Agreement: every rank checks that all ranks run the same collective, before any result is returned.

A collective's signature (kind, op, root, structure, dtypes, shapes, packing and algorithm
settings) is hashed to 62 bits, cached per signature, and exchanged with one 24-byte
non-blocking ``Iallreduce(MIN)`` of ``[h, -h, -speculated]``: every rank learns the min and max of
all hashes at once, so all ranks see a mismatch together. Then, and only then, the ranks exchange
readable descriptions and raise :class:`CollectiveMismatchError` naming what each rank sent. The
exchange is the same MPI call for every kind of collective, so even ranks in different collectives
meet in it.

**Speculation** (the steady state: the same gradients reduced every step). Waiting for the
exchange before moving data costs a full round trip of latency per collective. So when this
rank's signature equals the one agreed on this communicator's previous collective, and that
collective's data steps are known (:attr:`Agreement.last`: its hash and its *recipe*, the list of
flat allreduces it issued), the rank posts the exchange, runs the data steps at once, and only then
waits for the exchange and checks it, before returning anything. Why this is safe:

- ``last`` is the same on every rank: it changes only when an exchange completes, and every rank
  sees the same outcome of every exchange (set to the agreed signature on success, cleared on a
  mismatch), on this communicator, in the same order.
- So ranks that speculate all run the recipe of the same signature, ``last``. If every rank
  speculates, every signature equals ``last``: there is no mismatch. If some do not, their
  signatures differ from ``last`` (equal signatures make equal choices): the exchange reports a
  mismatch, and its third field tells them someone speculated. They then *drain*: issue the same
  data calls (zeros into scratch buffers) so the speculating ranks' calls complete, and everyone
  meets in the description exchange and raises. Nothing stays posted, and the communicator is
  usable afterwards. The speculating ranks' results are dropped.
- The recipe is predicted from the signature (``allreduce.recipe``) when the exchange succeeds, so
  every rank holds it before any data moves, and checked against the steps the call then issued
  (``Caller.issued``): a difference, the same on every rank, turns speculation off for that
  signature rather than leave a replay that would not match.
- Signatures that are not speculated on (recipe None): hierarchical steps, anything but
  allreduce; their exchange is the same call, so they mismatch safely with anything.
- GPU allreduces speculate too: their recipes are recorded as their data steps run (NCCL calls,
  which replay themselves, or flat MPI calls on staged or device buffers, replayed as above);
  collectives/gpu/recipes.py extends this argument to the GPU.

**Failures before the data moves** (:meth:`Agreement.fail`). A rank whose call of a collective
fails before its exchange (an argument, conversion or dtype error, in the engine or in a layer
above it: ``Engine.fail``, ``Engine.guard``) must not simply skip the collective, or the other
ranks would match their call against its next one, and every later collective would be one apart.
So it still takes part in the collective's exchange, with the reserved signature :data:`FAILED`
(-1; real hashes are >= 0), never speculated. For every rank that is the outcome of a mismatch, so
all ranks take the mismatch path together (draining first if some speculated, as above), and in
the description exchange the failing rank sends its error (:class:`Failed`: type and message)
instead of a description. Then every rank raises for this same collective: a failing rank its own
error, every other rank ``CollectiveFailedError`` naming the lowest failing rank and its message
(also of that error's type where it is a built-in or a ``tf.errors`` class: errors.peer_failure).
When every rank failed (the hashes' maximum is FAILED) there is nothing to exchange: each raises
its own error. ``last`` is cleared in both cases, on every rank, so the invariant below holds.
``exchanges`` counts this rank's exchanges: a layer that sees an error can tell from it whether
its collective reached an exchange (then the error is already on every rank) or not (then it must
report the failure). Every path that posts an exchange must count it (:meth:`Agreement.post` and
:meth:`Agreement.bind` do): an uncounted one would make an error raised after its data moved look
like a failure before it, and the extra failed exchange would put the ranks one collective apart.

**Standing by** (:meth:`Agreement.stand_by`, ``Engine.stand_by``: Horovod's ``hvd.join``). A rank
that has nothing more to reduce takes part in the others' next exchange with the reserved signature
:data:`STANDING` (-2, below every other) and neutral values in the other fields,
``[STANDING, int64 max, 0]``: the exchange then tells every rank at once that some rank stands by
(the minimum is STANDING), whether every rank does (the second field is still int64 max), the
highest active signature, and whether an active rank speculated. While no rank stands by, nothing
changes: the exchange is the one every collective makes anyway, so standing by costs the others no
MPI call. When some rank stands by and some do not, every rank clears ``last``, the ranks that did
not speculate drain (the standing ranks know ``last``'s recipe like everyone), and all exchange
descriptions (the standing ranks a :class:`Standing`): a failure or a mismatch among the active
ranks raises on every rank as above; else the active ranks raise :class:`StandingByError` from
their collective (results dropped, nothing outstanding) and ``stand_by`` returns False on the
standing ranks, so the layer above serves them (the active ranks run the collective again). When
every rank stands by, ``stand_by`` returns True on every rank.
"""
from __future__ import annotations

import hashlib
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from ..errors import CollectiveMismatchError, StandingByError, failure_types, peer_failure
from . import deadline

_MASK = (1 << 62) - 1
FAILED = -1  # the reserved signature of a rank whose call failed before its exchange (hashes are >= 0)
STANDING = -2  # the reserved signature of a rank standing by (Agreement.stand_by; below FAILED)
_NEUTRAL = int(np.iinfo(np.int64).max)  # a standing rank's value in the fields it must not change

Recipe = tuple  # ((wire dtype, count, MPI op, non-blocking), ...): the flat allreduces of one collective


def signature_hash(key: tuple, cache: dict[tuple, int]) -> int:
    h = cache.get(key)
    if h is None:
        h = int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=8).digest(), "little") & _MASK
        if len(cache) > 4096:
            cache.clear()
        cache[key] = h
    return h


class Exchange:
    """One posted agreement exchange: its request and buffers (kept alive until it completes)."""

    __slots__ = ("h", "speculated", "send", "recv", "request")

    def __init__(self, comm: MPI.Intracomm, h: int, speculated: bool) -> None:
        self.h, self.speculated = h, speculated
        self.send = _triple(h, speculated)
        self.recv = np.empty(3, dtype=np.int64)
        self.request = comm.Iallreduce(self.send, self.recv, MPI.MIN)


class Failed:
    """What a failing rank sends in the description exchange: its error's types and message."""

    __slots__ = ("types", "message")

    def __init__(self, error: BaseException) -> None:
        self.types, self.message = failure_types(error), str(error)

    def __getstate__(self) -> tuple:
        return self.types, self.message

    def __setstate__(self, state: tuple) -> None:
        self.types, self.message = state

    def __str__(self) -> str:
        return f"failed before the collective: {self.types[0][1] if self.types else 'Exception'}: {self.message}"


class Standing:
    """What a standing rank sends in the description exchange."""

    __slots__ = ()

    def __reduce__(self) -> tuple:
        return (Standing, ())

    def __str__(self) -> str:
        return "stands by (Engine.stand_by: a rank that has joined, hvd.join)"


class Agreement:
    """The agreement state of one communicator (one per pipeline); see the module docstring."""

    def __init__(self, comm: MPI.Intracomm, describe: Callable[[tuple], str]) -> None:
        self.comm = comm
        self.describe = describe
        self.hashes: dict[tuple, int] = {}
        self.last: tuple[int, Recipe | None] | None = None  # (hash, recipe) agreed last on this comm
        self.exchanges = 0  # exchanges this rank has posted on this communicator (see the module docstring)

    def hash(self, key: tuple) -> int:
        return signature_hash(key, self.hashes)

    def speculates(self, h: int) -> bool:
        """Whether a collective of hash ``h`` may move data before its exchange completes."""
        last = self.last
        return last is not None and last[0] == h and last[1] is not None

    def post(self, h: int, speculated: bool) -> Exchange:
        self.exchanges += 1
        return Exchange(self.comm, h, speculated)

    def wait(self, exchange: Exchange, call: Any) -> None:
        """Wait for ``exchange`` to complete, under ``call``'s deadline when there is a call."""
        if call is None:
            exchange.request.Wait()
        else:
            call.wait(exchange.request, self.comm, "Allreduce", (exchange.send, exchange.recv))

    def fail(self, call: Any, where: str, error: BaseException) -> None:
        """This rank's call of ``where`` failed before its exchange: take part in the exchange with
        :data:`FAILED`, then raise ``error`` here and an error naming this rank on every other rank
        (see the module docstring). Always raises."""
        exchange = self.post(FAILED, False)
        self.wait(exchange, call)
        low, neg_high, neg_spec = exchange.recv.tolist()
        last, self.last = self.last, None
        if neg_high == -FAILED and low == FAILED:  # every rank failed (none stands by): each raises its own
            raise error
        if neg_spec < 0:  # ranks that speculated ran the data calls of ``last``: match them
            drain(self.comm, last[1] if last is not None else None, where)
        report(self.comm, None, self.describe, where, error)

    def finish(self, exchange: Exchange, call: Any, key: tuple, where: str,
               recipe: Recipe | Callable[[], Recipe | None] | None) -> None:
        """Wait for ``exchange`` (under ``call``'s deadline, when it has one) and check it: on
        agreement remember (hash, ``recipe``: a callable is called only then, so that its errors,
        equal on every rank for an agreed signature, come after the check); else drain if needed
        and raise on every rank."""
        self.wait(exchange, call)
        self._settle(exchange.recv, exchange.h, exchange.speculated, key, where, recipe)

    def _settle(self, recv: np.ndarray, h: int, speculated: bool, key: tuple, where: str,
                recipe: Recipe | Callable[[], Recipe | None] | None) -> None:
        """The outcome of a completed exchange (``recv``), the same on every rank: see :meth:`finish`."""
        low, neg_high, neg_spec = recv.tolist()
        if low == h and neg_high == -h:
            if callable(recipe):
                self.last = (h, None)
                recipe = recipe()
            self.last = (h, recipe)
            return
        last, self.last = self.last, None
        if neg_spec < 0 and not speculated:
            # ranks that speculated ran the data calls of ``last`` (the same on every rank): match them
            drain(self.comm, last[1] if last is not None else None, where)
        report(self.comm, key, self.describe, where, standing=low == STANDING)

    def stand_by(self, call: Any, where: str) -> bool:
        """Take part in the other ranks' next exchange as a rank standing by (see the module
        docstring): True when every rank stands by; False when the active ranks agree on their
        collective (they raise :class:`StandingByError` from it); a failure or mismatch among them
        raises here too."""
        exchange = self.post(STANDING, False)
        self.wait(exchange, call)
        _, neg_high, neg_spec = exchange.recv.tolist()
        last, self.last = self.last, None
        if neg_high == _NEUTRAL:  # every rank stands by
            return True
        if neg_spec < 0:  # the active ranks speculated: run their data calls (with zeros; their results are dropped)
            drain(self.comm, last[1] if last is not None else None, where)
        report(self.comm, None, self.describe, where, standing=True)
        return False

    def check(self, h: int, call: Any, key: tuple, where: str,
              recipe: Recipe | Callable[[], Recipe | None] | None) -> None:
        """Agree before any data moves (the exchange posted and waited for at once)."""
        self.finish(self.post(h, False), call, key, where, recipe)

    def bind(self, h: int, key: tuple, where: str, recipe: Recipe | None,
             data: Callable[[Any], Any]) -> Callable[[Any], Any]:
        """``data(x)`` (a collective's data steps, no deadline) as a function of ``x`` with the
        agreement of ``key`` around it: before the data, or, on a repeat of the signature last agreed
        (speculating), overlapped with it and checked before returning (the cached fast path's version
        of :meth:`post` + :meth:`finish`, without their objects, with what does not change between
        calls worked out once). A speculated call settles only when something changed (the hashes
        differ: the mismatch report, on every rank; or ``last`` holds another recipe)."""
        comm, label, settle = self.comm, f"{where} (agreement)", self._settle
        first, spec = _triple(h, False), _triple(h, True)
        minimum, empty, int64 = MPI.MIN, np.empty, np.int64

        def agreed(x: Any) -> Any:
            last = self.last
            self.exchanges += 1
            recv = empty(3, dtype=int64)
            if last is None or last[0] != h or last[1] is None:  # not speculated: agree first
                comm.Iallreduce(first, recv, minimum).Wait()
                settle(recv, h, False, key, where, recipe)
                return data(x)
            request = comm.Iallreduce(spec, recv, minimum)
            try:
                result = data(x)
            except BaseException:
                deadline.abandon(request, (spec, recv), label)
                raise
            request.Wait()
            low, neg_high, _ = recv.tolist()
            if low != h or neg_high != -h or last[1] is not recipe:
                settle(recv, h, True, key, where, recipe)  # a mismatch raises here, on every rank
            return result
        return agreed


def abandon(exchange: Exchange, where: str) -> None:
    """The data steps of a speculating collective failed: leave its exchange posted (its buffers alive)."""
    deadline.abandon(exchange.request, (exchange.send, exchange.recv), f"{where} (agreement)")


def drain(comm: MPI.Intracomm, recipe: Recipe | None, where: str) -> None:
    """Issue ``recipe``'s allreduces with zeros, so that ranks which speculated on it can finish."""
    if recipe is None:  # cannot happen while `last` is equal on every rank (see the module docstring)
        raise CollectiveMismatchError(
            f"{where}: ranks issued different collectives while others had already started the previous "
            f"one's data steps, and this rank does not know them; the communicator cannot be recovered")
    replay = getattr(recipe, "replay", None)
    if replay is not None:  # device steps replay themselves (collectives/gpu/recipes.py)
        replay()
        return
    for wire, count, op, nonblocking in recipe:
        send = np.zeros(count, dtype=wire)
        recv = np.empty_like(send)
        if nonblocking:
            comm.Iallreduce(send, recv, op).Wait()
        else:
            comm.Allreduce(send, recv, op)


def report(comm: MPI.Intracomm, key: tuple | None, describe: Callable[[tuple], str], where: str,
           error: BaseException | None = None, *, standing: bool = False) -> None:
    """All ranks saw different hashes: exchange descriptions (a failing rank: its ``error``, as a
    :class:`Failed`; a standing rank, ``key`` None: a :class:`Standing`) and raise, on every rank:
    ``error`` where given; else, when some rank failed, ``CollectiveFailedError`` naming it; else,
    when the ranks that do not stand by issued one collective, nothing on the standing ranks and
    :class:`StandingByError` on the others; else the mismatch. ``standing``: the exchange said that
    some rank stands by (without it, every description must be of a collective)."""
    if error is not None:
        comm.allgather(Failed(error))
        raise error
    if key is None and not standing:
        raise TypeError("report: give the collective's `key` or this rank's `error`")
    descriptions = comm.allgather(Standing() if key is None else describe(key))
    failures = [(rank, d.types, d.message) for rank, d in enumerate(descriptions) if isinstance(d, Failed)]
    if failures:
        raise peer_failure(where, failures)
    waiting = [rank for rank, d in enumerate(descriptions) if isinstance(d, Standing)]
    if standing and len({str(d) for d in descriptions if not isinstance(d, Standing)}) == 1:
        if key is None:
            return
        error = StandingByError(f"{where}: {_ranks(waiting)} stood by (Engine.stand_by: joined, hvd.join) and "
                                f"did not issue this collective; the layer that made them stand by serves them "
                                f"and runs it again")
        error.where, error.ranks = where, waiting
        raise error
    raise CollectiveMismatchError(mismatch_message(where, descriptions))


_triples: tuple[dict[int, np.ndarray], dict[int, np.ndarray]] = ({}, {})  # not speculated, speculated


def _triple(h: int, speculated: bool) -> np.ndarray:
    """The read-only send buffer ``[h, -h, -speculated]``, built once per signature."""
    cache = _triples[speculated]
    triple = cache.get(h)
    if triple is None:
        if len(cache) > 4096:
            cache.clear()
        fields = [STANDING, _NEUTRAL, 0] if h == STANDING else [h, -h, -int(speculated)]
        triple = cache[h] = np.array(fields, dtype=np.int64)
        triple.flags.writeable = False
    return triple


def mismatch_message(where: str, descriptions: list[Any]) -> str:
    groups: dict[str, list[int]] = {}
    for rank, text in enumerate(descriptions):
        groups.setdefault(str(text), []).append(rank)
    joined = " while a rank had joined (stood by)" if any(isinstance(d, Standing) for d in descriptions) else ""
    lines = [f"{where}: ranks issued different collectives{joined} (each rank must issue the same collectives "
             f"in the same order with the same op, root, dtypes, shapes and structure):"]
    for text, ranks in groups.items():
        lines.append(f"  {_ranks(ranks)}: {text}")
    return "\n".join(lines)


def _ranks(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2:
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks))
