"""The pipeline of one engine: every step a collective takes besides moving its data, and
everything derived from the engine's communicator, in one object.

Every collective, on host buffers (engine.py), device buffers (gpu/dispatch.py) or the cached
fast path (fastpath.py), takes the same steps through the same public methods:

1. :meth:`Pipeline.check_usable`: refuse if an earlier collective timed out (the ranks may be
   inside different collectives) or the engine was closed;
2. prepare: the caller turns its leaves into contiguous arrays and resolves its
   :class:`~mpidist.collectives.options.CallOptions` (this module does not care how);
3. :meth:`Pipeline.execute`: **agree** (one 24-byte allreduce checks that every rank issues the
   same collective, ``rc.check_agreement``; see agreement.py), **run** the collective's data steps
   through a :class:`Call`, **record** it on the timeline (``rc.timeline``). A repeat of the
   previous collective's signature whose data steps are flat allreduces *speculates*: the
   agreement is posted, the data steps run while it completes, and it is checked before anything
   is returned (agreement.py says why a mismatch is still an error on every rank, and no hang);
4. :meth:`Pipeline.mark_broken`: a step that missed its deadline marks the pipeline broken
   (the :class:`~mpidist.collectives.deadline.Caller` of each call does it).

A call that fails before step 3 on some rank (step 2, or a layer above the engine) goes through
:meth:`Pipeline.fail` instead: that rank still takes part in the agreement exchange, with a failed
signature, so the collective raises on every rank and the next one works (agreement.py).

A Pipeline owns what is derived from the communicator: the :class:`~mpidist.topology.Topology`
(the private clone, node and leader communicators), the :class:`~mpidist.collectives.agreement.Agreement`
(hash cache, last agreed signature), the stall
monitor (``rc.stall_seconds``), the timeline track, the fast path's cache and, in
``extensions``, the GPU path's job facts and NCCL communicators (gpu/facts.py), and the progress
thread of asynchronous collectives (``progress``, progress.py; ``pending`` while it has work). So swapping an
engine's communicator is building a new Pipeline (``Engine.replace_comm``), and :meth:`close`
frees all of it.
"""
from __future__ import annotations

import contextlib
from types import ModuleType
from typing import Any, Callable, Iterator

import numpy as np
from mpi4py import MPI

from .._config import rc
from ..errors import CommunicatorBrokenError, DeadlineExceededError, RanksLostError
from ..topology import Topology
from . import agreement, nest, packing, stall, timeline
from .algorithms import auto_reason, choose
from .deadline import Caller
from .fastpath import FastPaths
from .ops import Op
from .options import Resolved


class Call:
    """What one collective's data steps need: its name, topology, MPI caller, packing and algorithm.

    The collective modules (allreduce.py ...) and the GPU transports read ``where``, ``topo``,
    ``call``, ``size``, :meth:`plan` and :meth:`algorithm`; ``notes`` collects extra timeline
    fields (the GPU path writes ``path`` there).
    """

    __slots__ = ("where", "topo", "call", "size", "algorithm_name", "chosen", "bytes_per_pack", "num_packs",
                 "iallreduce_from", "notes", "compression")

    def __init__(self, where: str, topo: Topology, call: Caller, options: Resolved) -> None:
        self.where, self.topo, self.call, self.size = where, topo, call, topo.size
        self.algorithm_name = options.algorithm
        self.chosen: str | None = None  # the algorithm(s) the buffers got, for the timeline: "flat", ...
        self.iallreduce_from = rc.iallreduce_threshold  # flat allreduces from this size: Iallreduce + wait
        self.bytes_per_pack, self.num_packs = options.bytes_per_pack, options.num_packs
        self.notes: dict[str, Any] | None = None
        self.compression = options.compression  # "none", "float16" or "bfloat16" (compression.py)

    def plan(self, nbytes: list[int], groups: list[Any]) -> list[list[int]]:
        return packing.plan(nbytes, groups, self.bytes_per_pack, self.num_packs)

    def algorithm(self, nbytes: int) -> ModuleType:
        module = choose(self.algorithm_name, self.topo, nbytes)
        name = module.NAME
        if self.chosen is None:
            self.chosen = name
        elif name not in self.chosen.split("+"):
            self.chosen += "+" + name
        return module


class Pipeline:
    """The steps and communicator-derived state of one engine; see the module docstring."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.broken: str | None = None  # why collectives are refused, or None while usable
        self.ranks_lost = False  # a rank died (raise_if_lost): the communicator is revoked
        self.monitor = stall.Monitor(topology.comm) if stall.enabled() else None
        self.fast = FastPaths(self)
        # Other packages' per-communicator state, dropped with the pipeline (the GPU path keeps its
        # job facts and NCCL communicators here); values with a close() method are closed by close().
        self.extensions: dict[str, Any] = {}
        self.agreement = agreement.Agreement(topology.comm, self.describe)
        self._track: tuple[Any, int] | None = None  # (timeline recorder, this pipeline's thread id there)
        self.progress: Any = None  # the progress.Worker of asynchronous collectives, made on first use
        self.pending: Any = None  # that worker while it has collectives queued or running (progress.py)

    @property
    def comm(self) -> Any:
        return self.topology.comm

    @property
    def rank(self) -> int:
        return self.topology.rank

    @property
    def size(self) -> int:
        return self.topology.size

    # -- 1. usable? --------------------------------------------------------------------------------

    def check_usable(self, where: str) -> None:
        """Raise CommunicatorBrokenError if this pipeline refuses collectives."""
        if self.broken is not None:
            raise CommunicatorBrokenError(
                f"{where}: this communicator refuses collectives because {self.broken}. "
                f"Its ranks may be inside different collectives; end the job, or give the engine a fresh "
                f"communicator (Engine.replace_comm) or build a new strategy/engine on one.")

    def raise_if_lost(self, where: str, exc: Exception) -> None:
        """Raise RanksLostError if ``exc`` (an MPI.Exception from ``where``) says a rank died.

        ULFM reports a dead peer as MPI_ERR_PROC_FAILED (or _PENDING) to the ranks that talk to it
        and MPI_ERR_REVOKED to the others once the communicator is revoked; so this revokes the
        pipeline's communicators first (every survivor then leaves whatever collective it is in,
        or fails its next one) and refuses later collectives. Other MPI errors: returns.
        """
        if not isinstance(exc, MPI.Exception) or exc.Get_error_class() not in _lost_classes():
            return
        name = {MPI.ERR_REVOKED: "MPI_ERR_REVOKED"}.get(exc.Get_error_class(), "MPI_ERR_PROC_FAILED")
        self.ranks_lost = True
        self.mark_broken(f"a rank of its communicator died ({where} got {name})")
        topo = self.topology
        for comm in (topo.comm, topo.local, topo.cross):
            if comm is not None and comm != MPI.COMM_NULL:
                try:
                    comm.Revoke()
                except MPI.Exception:  # already revoked
                    pass
        raise RanksLostError(f"{where}: a rank of the {topo.size}-rank communicator died ({name}); the "
                             f"communicator is revoked. Recover with mpidist.elastic.run (shrink and go on), "
                             f"or end the job.") from exc

    def mark_broken(self, reason: str) -> None:
        """Refuse every later collective, saying ``reason`` (a missed deadline; close)."""
        self.broken = reason

    @contextlib.contextmanager
    def watched(self, where: str) -> Iterator[None]:
        """The stall monitor's view of this rank: inside collective ``where`` (no-op when off)."""
        monitor = self.monitor
        if monitor is None:
            yield
            return
        monitor.enter(where)
        try:
            yield
        finally:
            monitor.leave()

    def fail(self, where: str, error: BaseException, timeout: float | None = None) -> None:
        """This rank's call of collective ``where`` failed with ``error`` before its agreement
        exchange: take part in the exchange with a failed signature, so that every rank raises for
        this collective (here ``error``; elsewhere CollectiveFailedError naming this rank). Always
        raises. Where no exchange can be trusted to meet the others' (agreement switched off, the
        pipeline broken, or ``error`` itself says the communicator is unusable) ``error`` is only
        raised here. ``timeout``: the deadline of the exchange (None: none)."""
        if not rc.check_agreement or self.broken is not None or isinstance(error, _UNRECOVERABLE) \
                or not isinstance(error, Exception):
            raise error
        call = Caller(where, timeout, self.mark_broken)
        with self.watched(where):
            try:
                self.agreement.fail(call, where, error)
            except MPI.Exception as exc:  # a rank died (ULFM): RanksLostError
                self.raise_if_lost(where, exc)
                raise

    # -- 3. agree, run, record ---------------------------------------------------------------------

    def caller(self, where: str, timeout: float | None) -> Caller:
        """The MPI caller of one collective: blocking, or against the deadline (then it marks broken)."""
        return Caller(where, timeout, self.mark_broken)

    def execute(self, where: str, module: ModuleType, arrays: list[Any], tree: Any, op_root: tuple,
                options: Resolved, run: Callable[[Call], Any], *, rec: Any = None, start: float = 0.0,
                variant: str | None = None) -> Any:
        """Agree on the collective, ``run(call)`` its data steps, record it; returns what run returns.

        ``module``: the collective's module (its ``signature`` of the arrays is agreed on);
        ``arrays``: the prepared leaves; ``tree``: the nest's structure (nest.flatten);
        ``op_root``: (op value or None, root or None); ``variant``: what else ranks must agree on
        (the GPU path's implementation); ``rec``/``start``: the timeline recorder and the
        collective's start mark, when recording.
        """
        call = Caller(where, options.timeout, self.mark_broken)
        ctx = Call(where, self.topology, call, options)
        prepared: float | None = None  # timeline mark: end of prepare, when there is an agreement
        marks: tuple[float, float | None] | None = None  # timeline marks: end of prepare, end of agreement
        exchange = None  # the agreement, posted and not yet checked, when speculating
        if rc.check_agreement:
            key = self.key(where, op_root, structure_of(tree), module.signature(arrays),
                           options.algorithm if variant is None else f"{options.algorithm}|{variant}",
                           options.bytes_per_pack, options.num_packs, options.timeout is not None,
                           options.compression)
            prepared = rec.now() if rec is not None else None
            agreed_on = self.agreement
            h = agreed_on.hash(key)
            if agreed_on.speculates(h):
                exchange = agreed_on.post(h, True)
                ctx.notes = {"agreement": "speculative: overlapped with the data, checked before returning"}
            else:
                recipe = getattr(module, "recipe", None) if variant is None else None  # host allreduce
                agreed_on.check(h, call, key, where, None if recipe is None else
                                lambda: recipe(ctx, arrays, Op(op_root[0])))
                last = agreed_on.last
                if last is not None and last[1] is not None:  # check the prediction against the steps run
                    call.issued = []
        if rec is not None:
            marks = timeline.agreed(rec, prepared, call)
        if exchange is None:
            results = run(ctx)
            last = agreed_on.last if call.issued is not None else None
            if last is not None and module.issued_recipe(ctx, call.issued) != last[1]:
                # the data steps were not the predicted ones (every rank finds the same): never speculate
                # on this signature, since ranks that did not could not replay them
                agreed_on.last = (last[0], None)
        else:
            try:
                results = run(ctx)
            except BaseException:
                agreement.abandon(exchange, where)
                raise
            last = agreed_on.last
            agreed_on.finish(exchange, call, key, where, last[1] if last is not None else None)
        if marks is not None:
            self.record(rec, where, start, marks[0], marks[1], call.steps, arrays, op_root, options.algorithm,
                        ctx.notes, ctx.chosen)
        return results

    @staticmethod
    def key(where: str, op_root: tuple, structure: str, signature: tuple, alg: str, bpp: int,
            npk: int | None, deadline: bool, compression: str = "none") -> tuple:
        """What ranks must agree on (see agreement.py and :meth:`describe`)."""
        # auto's inputs besides the topology (algorithms/choice.py): a fixed threshold, or the NIC count
        fixed = rc.hierarchical_threshold
        auto_inputs = (fixed, rc.nics_per_node if fixed is None else None) if alg.startswith("auto") else None
        return (where, op_root, structure, signature, alg, auto_inputs, bpp, npk, deadline, compression,
                rc.iallreduce_threshold if where == "allreduce" else None)

    def agreement_hash(self, key: tuple) -> int:
        """The agreement hash of ``key`` (cached), for callers that agree with a precomputed hash."""
        return self.agreement.hash(key)

    @staticmethod
    def describe(key: tuple) -> str:
        """A :meth:`key` as text, for mismatch errors; the raw key where a dtype has no NumPy name."""
        try:
            return _describe(key)
        except Exception:  # a dtype NumPy cannot name from its code (bfloat16): show the raw key
            return repr(key)

    def record(self, rec: Any, where: str, start: float, prepared: float, agreed: float | None,
               steps: Any, arrays: list[Any], op_root: tuple, alg: str, notes: dict | None = None,
               chosen: str | None = None) -> None:
        """Write one collective to the timeline (see timeline.py); ``notes``: extra fields; ``chosen``:
        the algorithm(s) ``alg`` ("auto") resolved to for this call's buffers."""
        if self._track is None or self._track[0] is not rec:
            topo = self.topology
            self._track = (rec, rec.engine(f"engine {id(self) & 0xffff:04x}: {topo.size} ranks, "
                                           f"{topo.num_nodes} node(s), rank {topo.rank} here"))
        args: dict[str, Any] = {"leaves": len(arrays), "bytes": sum([a.nbytes for a in arrays]),
                                "algorithm": chosen or alg, "transfers": len(steps.items)}
        if chosen is not None and alg == "auto":
            args["chosen_by"] = "auto: " + auto_reason(self.topology)
        op, root = op_root
        if op is not None:
            args["op"] = Op(op).name
        if root is not None:
            args["root"] = root
        if notes:
            args.update(notes)
        timeline.write_collective(rec, self._track[1], where, start, prepared, agreed, steps, rec.now(), args)

    # -- the end -----------------------------------------------------------------------------------

    def close(self, reason: str = "the engine was closed", *, free: bool = True) -> None:
        """Run the asynchronous collectives queued (progress.py), then refuse further collectives; with
        ``free``, free the communicators (collective)."""
        if self.progress is not None:
            self.progress.close()
        self.mark_broken(reason)
        self.fast.clear()
        if self.monitor is not None:
            self.monitor.close(free=free)
            self.monitor = None
        for extension in self.extensions.values():
            if hasattr(extension, "close"):
                extension.close()
        self.extensions.clear()
        if free:
            self.topology.free()


_UNRECOVERABLE = (CommunicatorBrokenError, RanksLostError, DeadlineExceededError)  # errors fail() only re-raises


def _lost_classes() -> tuple[int, ...]:
    """The MPI error classes that mean a peer died (ULFM); empty where the library lacks them."""
    return tuple(getattr(MPI, n) for n in ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING", "ERR_REVOKED")
                 if isinstance(getattr(MPI, n, None), int))


def structure_of(tree: Any) -> str:
    """The agreement text of a nest's structure ("*" for a single leaf)."""
    return "*" if tree is nest.LEAF else nest.structure_key(tree)


def _describe(key: tuple) -> str:
    where, (op, root), structure, leaves, alg, threshold, bpp, npk, deadline, compression, posted_from = key
    if where == "barrier":
        return f"barrier({'with a deadline' if deadline else 'no deadline'})"
    parts = []
    if op is not None:
        parts.append(f"op={Op(op).name}")
    if root is not None:
        parts.append(f"root={root}")
    shown = [f"{np.dtype(d).name}{tuple(s)}".replace("'?'", "?") for d, s in leaves[:6]]
    if len(leaves) > 6:
        shown.append(f"... {len(leaves)} leaves in all")
    parts.append(f"leaves=[{', '.join(shown)}]")
    if structure not in ("*", "[" + ",".join("*" * len(leaves)) + "]"):
        parts.append(f"structure={structure[:120]}")
    if threshold is not None:
        fixed, nics = threshold
        alg += f"(by cost, nics_per_node={nics})" if fixed is None else f"(hierarchical_threshold={fixed})"
    parts.append(f"algorithm={alg}")
    parts.append(f"bytes_per_pack={bpp}" + (f", num_packs={npk}" if npk is not None else ""))
    parts.append("with a deadline" if deadline else "no deadline")
    if compression != "none":
        parts.append(f"compression={compression}")
    if posted_from is not None:
        parts.append(f"iallreduce_threshold={posted_from}")
    return f"{where}({', '.join(parts)})"
