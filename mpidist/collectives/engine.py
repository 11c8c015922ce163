"""The collective engine: logical collectives on nests of arrays over one communicator.

Every public call takes the steps of the engine's :class:`~mpidist.collectives.pipeline.Pipeline`,
in the same order on every rank (host buffers here, device buffers in collectives/gpu, repeats of
a plain allreduce on the cached fast path, all through the same pipeline methods):

1. check usable: refuse if an earlier collective on this engine timed out (the communicator
   state is unknown);
2. prepare: flatten the nest, turn leaves into contiguous NumPy arrays (device arrays go to
   collectives/gpu), resolve the per-call options (:class:`~mpidist.collectives.options.CallOptions`:
   the keyword arguments, or ``options=``, over ``mpidist.rc``), validate arguments;
3. agree: one 24-byte Allreduce checks that every rank issues the same collective
   (``rc.check_agreement``; see agreement.py), before the data moves or, on a repeat of the
   previous signature, overlapped with it and checked before anything is returned;
4. run the collective module (allreduce.py, broadcast.py …) pack by pack, each pack with the
   flat or hierarchical algorithm (``algorithm=`` or ``rc.algorithm``; "auto" by topology and size),
   and record it on the timeline (``rc.timeline``);
5. rebuild the nest with results of the same kinds, dtypes and shapes.

With ``timeout_seconds`` (or ``rc.timeout_seconds``; 0 = no deadline) every MPI step is
non-blocking and the whole collective must finish by the deadline, else DeadlineExceededError and
the pipeline is marked broken (see deadline.py).

An error on any rank is an error on every rank, and the next collective works: a call that fails
on one rank before its agreement exchange (step 2: a bad op or root, an array that cannot be
converted, a dtype the collective refuses) still takes part in that exchange with a failed
signature (:meth:`Engine.fail`; agreement.py), so every rank raises for this same collective.
Layers above the engine (Horovod, strategies) report their own checks the same way, with
:meth:`Engine.guard` around the code before their engine call, or :meth:`Engine.fail`.

Everything derived from the communicator lives in the engine's pipeline, so
:meth:`Engine.replace_comm` swaps the communicator in one step.
"""
from __future__ import annotations

import contextlib
from types import ModuleType
from typing import Any, Iterator, NoReturn

import numpy as np
from mpi4py import MPI

from .._config import rc
from ..topology import Topology, abort
from ..validation import check_rank
from . import (
    allgather,
    allreduce,
    arrays,
    broadcast,
    gpu,  # device arrays go to collectives/gpu
    nest,
    progress,
    reduce,
    reduce_scatter,
    timeline,
)
from .ops import parse_op
from .options import CallOptions, Resolved
from .pipeline import Pipeline

_MODULES: dict[str, ModuleType] = {"allreduce": allreduce, "broadcast": broadcast, "allgather": allgather,
                                   "reduce": reduce, "reduce_scatter": reduce_scatter}


class Engine:
    """Collectives over a private clone of ``comm`` (default COMM_WORLD).

    Creating an Engine is collective over ``comm``. ``local_size`` fakes nodes of that many
    consecutive ranks (default ``rc.local_size``). Every method is collective: all ranks of the
    communicator must call it, in the same order, with matching arguments.

    Per-call options: the keyword arguments ``bytes_per_pack``, ``num_packs``, ``algorithm`` and
    ``timeout_seconds``, or ``options=`` a :class:`~mpidist.collectives.options.CallOptions`
    (keyword arguments that are set win over it); what is not set comes from ``mpidist.rc``.
    ``timeout_seconds=0`` means no deadline, even when ``rc.timeout_seconds`` sets one. Options with
    nothing set are a plain call (the cached fast path included).

    The first Engine of the process installs the abort hook (``rc.abort_on_error``: an uncaught
    exception on one rank ends the MPI job instead of leaving the others waiting).
    """

    def __init__(self, comm: MPI.Intracomm | None = None, *, local_size: int | None = None,
                 topology: Topology | None = None) -> None:
        if rc.abort_on_error:
            abort.install()
        self._local_size = local_size
        self.pipeline = Pipeline(topology if topology is not None else Topology(comm, local_size=local_size))

    @property
    def topology(self) -> Topology:
        """The communicators; waits first for asynchronous collectives queued (their communicator)."""
        progress.wait_idle(self.pipeline)
        return self.pipeline.topology

    @property
    def rank(self) -> int:
        return self.pipeline.topology.rank

    @property
    def size(self) -> int:
        return self.pipeline.topology.size

    @property
    def ranks_lost(self) -> bool:
        """Whether a collective found a dead rank (ULFM) and revoked this engine's communicator;
        ``replace_comm`` with the survivors' communicator makes the engine usable again."""
        return self.pipeline.ranks_lost

    @property
    def broken(self) -> str | None:
        """Why this engine refuses collectives, or None while it is usable."""
        return self.pipeline.broken

    def replace_comm(self, comm: MPI.Intracomm, *, local_size: int | None = None, free_old: bool = True) -> None:
        """Run every later collective on ``comm`` instead (collective over ``comm``).

        The one swap point for the communicator: everything derived from the old one (the private
        clone, node and leader communicators, the GPU facts and NCCL communicators, the agreement
        cache, the stall monitor, the timeline track, the fast path's cache) goes with the old
        pipeline, and a new one is built on a clone of ``comm``, usable even when the old one was
        broken by a missed deadline. ``local_size``: fake nodes as in the constructor (default:
        the constructor's). ``free_old``: free the old communicators (only the ranks of the old
        communicator that call replace_comm take part in that; pass False after a failure that
        leaves the old communicator unusable).
        """
        progress.wait_idle(self.pipeline)  # asynchronous collectives queued finish on the old communicator
        topology = Topology(comm, local_size=self._local_size if local_size is None else local_size)
        old, self.pipeline = self.pipeline, Pipeline(topology)
        old.close("the engine's communicator was replaced (Engine.replace_comm)", free=free_old)

    # -- public collectives, all in the same order ------------------------------------------------

    def allreduce(self, value: Any, op: Any = "sum", *, bytes_per_pack: int | None = None,
                  num_packs: int | None = None, algorithm: str | None = None,
                  timeout_seconds: float | None = None, options: CallOptions | None = None) -> Any:
        """Reduce ``value`` (an array, number or nest of them) over all ranks; every rank gets the result."""
        pipeline = self.pipeline
        if pipeline.pending is not None:  # asynchronous collectives queued go first (progress.py)
            pipeline.pending.wait_idle()
        # the cached fast path's implementation key: "auto" for a plain call (nothing set), the call's
        # own when it sets nothing but the implementation for device arrays, None: the general path only
        implementation = None
        if bytes_per_pack is None and num_packs is None and algorithm is None and timeout_seconds is None:
            if options is None or getattr(options, "empty", False) is True:
                implementation = "auto"
            elif getattr(options, "implementation_only", False) is True:
                implementation = options.implementation
        plain = implementation == "auto"
        if implementation is not None and pipeline.broken is None:  # a repeat of an earlier call: fastpath.py
            fast = pipeline.fast.lookup(op, value, implementation)
            if fast is not None:
                try:
                    return fast(value)
                except MPI.Exception as exc:  # a rank died (ULFM): RanksLostError
                    pipeline.raise_if_lost("allreduce", exc)
                    raise
        where = "allreduce"
        try:
            red = parse_op(op, where)
            resolved = self._options(where, plain, bytes_per_pack, num_packs, algorithm, timeout_seconds, options)
        except Exception as exc:  # an argument error on this rank: on every rank (see fail)
            self.fail(where, exc)
        result = self._run(where, value, (red.value, None), dict(op=red), resolved)
        if implementation is not None:
            pipeline.fast.remember(op, red, value, implementation)
        return result

    def allreduce_async(self, value: Any, op: Any = "sum", *, bytes_per_pack: int | None = None,
                        num_packs: int | None = None, algorithm: str | None = None,
                        timeout_seconds: float | None = None, options: CallOptions | None = None) -> progress.Pending:
        """Start :meth:`allreduce` (same arguments, same result) and return at once: a
        :class:`~mpidist.collectives.progress.Pending` whose ``wait()`` returns the result, or raises the
        collective's error. It runs on the engine's progress thread while this one computes; collectives
        run in the order they are started, blocking ones included. ``value``'s arrays must not change
        until it is done."""
        where = "allreduce_async"
        try:  # argument errors here, not at wait(), and on every rank (see fail)
            parse_op(op, where)
            self._options(where, None, bytes_per_pack, num_packs, algorithm, timeout_seconds, options)
        except Exception as exc:
            self.fail(where, exc)
        pipeline = self.pipeline
        pipeline.check_usable(where)
        return progress.worker(pipeline).submit(lambda: self.allreduce(
            value, op, bytes_per_pack=bytes_per_pack, num_packs=num_packs, algorithm=algorithm,
            timeout_seconds=timeout_seconds, options=options), "allreduce", value)

    def broadcast(self, value: Any, root: int = 0, *, bytes_per_pack: int | None = None,
                  num_packs: int | None = None, algorithm: str | None = None,
                  timeout_seconds: float | None = None, options: CallOptions | None = None) -> Any:
        """Every rank gets ``root``'s value. All ranks pass a value of the same structure, dtypes and shapes."""
        where = "broadcast"
        try:
            root = check_rank(root, where, "root", self.size)
            resolved = self._options(where, None, bytes_per_pack, num_packs, algorithm, timeout_seconds, options)
        except Exception as exc:  # an argument error on this rank: on every rank (see fail)
            self.fail(where, exc)
        return self._run(where, value, (None, root), dict(root=root), resolved)

    def allgather(self, value: Any, *, bytes_per_pack: int | None = None, num_packs: int | None = None,
                  algorithm: str | None = None, timeout_seconds: float | None = None,
                  options: CallOptions | None = None) -> Any:
        """Concatenate every rank's value along axis 0 in rank order; axis 0 may differ per rank."""
        where = "allgather"
        try:
            resolved = self._options(where, None, bytes_per_pack, num_packs, algorithm, timeout_seconds, options)
        except Exception as exc:  # an argument error on this rank: on every rank (see fail)
            self.fail(where, exc)
        return self._run(where, value, (None, None), {}, resolved)

    def reduce(self, value: Any, op: Any = "sum", root: int = 0, *, bytes_per_pack: int | None = None,
               num_packs: int | None = None, algorithm: str | None = None,
               timeout_seconds: float | None = None, options: CallOptions | None = None) -> Any:
        """Reduce over all ranks to ``root``; returns the result at the root and None elsewhere."""
        where = "reduce"
        try:
            red = parse_op(op, where)
            root = check_rank(root, where, "root", self.size)
            resolved = self._options(where, None, bytes_per_pack, num_packs, algorithm, timeout_seconds, options)
        except Exception as exc:  # an argument error on this rank: on every rank (see fail)
            self.fail(where, exc)
        return self._run(where, value, (red.value, root), dict(op=red, root=root), resolved)

    def reduce_scatter(self, value: Any, op: Any = "sum", *, bytes_per_pack: int | None = None,
                       num_packs: int | None = None, algorithm: str | None = None,
                       timeout_seconds: float | None = None, options: CallOptions | None = None) -> Any:
        """Reduce over all ranks; rank r keeps block r of axis 0 (blocks as numpy.array_split cuts them)."""
        where = "reduce_scatter"
        try:
            red = parse_op(op, where)
            resolved = self._options(where, None, bytes_per_pack, num_packs, algorithm, timeout_seconds, options)
        except Exception as exc:  # an argument error on this rank: on every rank (see fail)
            self.fail(where, exc)
        return self._run(where, value, (red.value, None), dict(op=red), resolved)

    def barrier(self, *, timeout_seconds: float | None = None, options: CallOptions | None = None) -> None:
        """Wait until every rank has called barrier (under the same deadline rules).

        With ``rc.check_agreement`` the barrier is the agreement exchange itself (an allreduce
        completes nowhere before every rank has entered it), so a rank in another collective, or
        one whose call failed, makes it an error on every rank rather than a mismatched MPI call."""
        where = "barrier"
        pipeline = self.pipeline
        progress.wait_idle(pipeline)
        pipeline.check_usable(where)
        try:
            resolved = self._options(where, None, None, None, None, timeout_seconds, options)
        except Exception as exc:  # an argument error on this rank: on every rank (see fail)
            self.fail(where, exc)
        with pipeline.watched(where):
            try:
                call = pipeline.caller(where, resolved.timeout)
                if rc.check_agreement:
                    key = pipeline.key(where, (None, None), "*", (), "none", 0, None, resolved.timeout is not None)
                    pipeline.agreement.check(pipeline.agreement_hash(key), call, key, where, None)
                else:
                    call.nonblocking(pipeline.comm, "Barrier")
            except MPI.Exception as exc:  # a rank died (ULFM): RanksLostError
                pipeline.raise_if_lost(where, exc)
                raise

    @property
    def stands_by(self) -> bool:
        """Whether :meth:`stand_by` can be used: the agreement exchange carries it
        (``rc.check_agreement``) and there are other ranks."""
        return bool(rc.check_agreement) and self.size > 1

    def stand_by(self) -> bool:
        """Wait, as a rank with nothing to contribute, for the other ranks' next collective (or
        for every rank to stand by). This rank takes part in that collective's agreement exchange
        with a reserved signature (agreement.py, "Standing by"), so the other ranks pay nothing
        while no rank stands by. Returns True when every rank stands by. Returns False when the
        other ranks issued one collective: they raise :class:`~mpidist.errors.StandingByError` from
        it (results dropped, nothing left outstanding), and the caller serves them from here on in
        step (Horovod's ``hvd.join``: joins.py). A failure or a mismatch among the other ranks
        raises here and there. Needs :attr:`stands_by`; deadline: ``rc.timeout_seconds``."""
        where = "stand_by"
        pipeline = self.pipeline
        progress.wait_idle(pipeline)
        pipeline.check_usable(where)
        if not self.stands_by:
            raise RuntimeError(f"Engine.stand_by: needs rc.check_agreement and more than one rank "
                               f"(check Engine.stands_by first), got check_agreement={rc.check_agreement!r}, "
                               f"size={self.size}")
        with pipeline.watched(where):
            try:
                return pipeline.agreement.stand_by(pipeline.caller(where, Resolved.defaults().timeout), where)
            except MPI.Exception as exc:  # a rank died (ULFM): RanksLostError
                pipeline.raise_if_lost(where, exc)
                raise

    def fail(self, where: str, error: BaseException) -> NoReturn:
        """Report that this rank's call of collective ``where`` failed with ``error`` before it
        reached the engine (collective: call it where the collective would have been called).

        This rank still takes part in that collective's agreement exchange, with a failed
        signature, so every rank raises for this same collective and the next one works: this
        rank ``error``, every other rank :class:`~mpidist.errors.CollectiveFailedError` naming this
        rank and its message (also of ``error``'s type where that is a built-in or ``tf.errors``
        class); if every rank failed, each raises its own. Always raises. Layers above the engine
        usually use :meth:`guard` instead, which calls this only for errors that did not reach an
        exchange. Without ``rc.check_agreement``, or on a broken engine, ``error`` is only raised.
        """
        pipeline = self.pipeline
        if pipeline.pending is not None:  # asynchronous collectives queued go first (progress.py)
            pipeline.pending.wait_idle()
        pipeline.fail(where, error, Resolved.defaults().timeout)
        raise error  # not reached: pipeline.fail raises

    @contextlib.contextmanager
    def guard(self, where: str) -> Iterator[None]:
        """Around a layer's code for one collective ``where`` (its checks and conversions, then its
        engine call): an exception raised before this rank reached an agreement exchange of this
        engine is reported with :meth:`fail`, so it is an error on every rank; one raised by or
        after an exchange (already on every rank, or after the data moved) passes unchanged.

        Only the part up to the collective's first engine call is covered: a layer that makes
        several engine calls for one collective and can fail between them guards each part."""
        agreement = self.pipeline.agreement
        mark = agreement.exchanges
        try:
            yield
        except Exception as exc:
            if self.pipeline.agreement is agreement and agreement.exchanges == mark:
                self.fail(where, exc)
            raise

    def close(self) -> None:
        """Free the engine's communicators (collective). The caller's communicator is untouched."""
        self.pipeline.close()

    @property
    def closed(self) -> bool:
        """Whether ``close()`` freed the engine's communicators (through any strategy sharing it)."""
        return self.topology.comm is None

    # -- shared steps --------------------------------------------------------------------------------

    @staticmethod
    def _options(where: str, plain: bool | None, bytes_per_pack: Any, num_packs: Any, algorithm: Any,
                 timeout_seconds: Any, options: CallOptions | None) -> Resolved:
        """The per-call options of one collective, resolved (step 2 of the module docstring)."""
        if plain or ((options is None or getattr(options, "empty", False) is True) and bytes_per_pack is None
                     and num_packs is None and algorithm is None and timeout_seconds is None):
            return Resolved.defaults()  # the hot path
        if options is None:
            return Resolved.from_arguments(where, bytes_per_pack, num_packs, algorithm, timeout_seconds)
        if not isinstance(options, CallOptions):
            raise TypeError(f"{where}: `options` must be a CallOptions or None, got {type(options).__name__}")
        given = CallOptions.checked(where, bytes_per_pack=bytes_per_pack, num_packs=num_packs, algorithm=algorithm,
                                    timeout_seconds=timeout_seconds)
        return options.merged(given).resolve()

    def _run(self, where: str, value: Any, op_root: tuple, params: dict, options: Resolved) -> Any:
        pipeline = self.pipeline
        if pipeline.pending is not None:  # asynchronous collectives queued go first (progress.py)
            pipeline.pending.wait_idle()
        monitor = pipeline.monitor
        mark = pipeline.agreement.exchanges
        try:
            if monitor is None:
                return _collective(pipeline, where, value, op_root, params, options)
            monitor.enter(where)  # pipeline.watched(where), without a generator on the hot path
            try:
                return _collective(pipeline, where, value, op_root, params, options)
            finally:
                monitor.leave()
        except MPI.Exception as exc:  # a rank died (ULFM): RanksLostError on every survivor
            pipeline.raise_if_lost(where, exc)
            raise
        except Exception as exc:
            if pipeline.agreement.exchanges == mark:  # failed before its exchange: on every rank
                pipeline.fail(where, exc, options.timeout)
            raise


def _collective(pipeline: Pipeline, where: str, value: Any, op_root: tuple, params: dict, options: Resolved) -> Any:
    """One collective through ``pipeline`` (the steps of the module docstring); device arrays go to gpu."""
    if pipeline.broken is not None:
        pipeline.check_usable(where)
    module = _MODULES[where]
    rec = timeline.recorder()
    start = rec.now() if rec is not None else 0.0
    if type(value) is np.ndarray and value.flags.c_contiguous and value.dtype.kind in "fiu":
        leaves = host_arrays = [value]  # hot path: one array
        tree, adapters = nest.LEAF, None
    else:
        leaves, tree = nest.flatten(value)
        if gpu.any_device(leaves):  # nests holding device arrays run in collectives/gpu
            return gpu.collective(pipeline, where, module, leaves, tree, op_root, params, options,
                                  rec=rec, start=start)
        host_arrays, adapters = arrays.to_host_all(leaves, where)
    if module.validate is not None:
        module.validate(host_arrays, where)
    results = pipeline.execute(where, module, host_arrays, tree, op_root, options,
                               lambda call: module.run(call, host_arrays, **params), rec=rec, start=start)
    if results is None:
        return None
    if adapters is None:
        return results[0]
    return nest.unflatten(tree, arrays.from_host_all(results, adapters, leaves))
