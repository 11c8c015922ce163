"""Moving contiguous device buffers: one transport per path, each with the same methods as the
host algorithms (``allreduce``, ``bcast``, ``reduce``, ``allgatherv``, ``reduce_scatter``), plus
``rule`` (how a dtype is reduced on it; None: not at all, use the fallback) and ``group``.

Stream discipline: every device operation is enqueued on the caller's current CuPy stream; before
MPI reads device memory the stream is waited for (:meth:`Env.wait`, which honours the deadline);
NCCL results are ordered on the stream and need no wait. Staging copies device buffers into
page-locked host blocks kept between collectives (staging.py): :func:`stage_to_host` queues the
copy and waits for the stream (the step's one wait), :func:`lend` gives MPI a block to write into,
:func:`stage_to_device` queues the copy back without waiting (the result is ordered on the
stream); the host algorithms (flat or hierarchical, as ``rc.algorithm`` picks) run on the blocks.
"""
from __future__ import annotations

import contextlib
import time
from typing import Any

import numpy as np

from ...errors import deadline_exceeded
from ..algorithms import flat
from ..ops import REDUCTIONS, Op
from . import nccl
from .nccl import Rule
from .staging import Block, Staging

_NAP = 1e-4


class Env:
    """One collective's shared state: CuPy, the engine's call context, the caller's stream, the
    transport chosen for the path and the MPI transport for what NCCL cannot reduce."""

    def __init__(self, cp: Any, ctx: Any, staging: Staging | None = None) -> None:
        self.cp, self.ctx = cp, ctx
        self.stream = cp.cuda.get_current_stream()
        self.size, self.rank = ctx.topo.size, ctx.topo.rank
        self.node: nccl.NodeComm | None = None
        self.primary: Any = None
        self.fallback: Any = None
        self.staging = staging if staging is not None else Staging(cp)
        self.lent: dict[int, Block] = {}  # id(host view) -> its block, until release()

    def release(self) -> None:
        """Give the page-locked blocks of this collective back (their copies back may be pending:
        each block's event says when they are done)."""
        for block in self.lent.values():
            self.staging.give(block)
        self.lent.clear()

    def rule(self, dtype: np.dtype, op: Op, what: str) -> tuple[Any, Rule]:
        """(transport, rule) for reducing ``dtype``: the path's own, else the MPI fallback's."""
        rule = self.primary.rule(dtype, op, what)
        if rule is not None:
            return self.primary, rule
        return self.fallback, self.fallback.rule(dtype, op, what)

    def wait(self) -> None:
        """Wait until the stream's work is done; past the deadline, abort NCCL and raise."""
        call = self.ctx.call
        if call.deadline is None:
            self.stream.synchronize()
            return
        while not self.stream.done:
            if time.monotonic() >= call.deadline:
                if self.node is not None:
                    self.node.abort()
                call.on_expire(f"{call.what} did not finish within timeout_seconds={call.timeout:g}")
                raise deadline_exceeded(
                    f"{call.what}: not finished within timeout_seconds={call.timeout:g}: the GPU work of this "
                    f"collective (NCCL) has not completed, so at least one rank of this node has not reached "
                    f"it. This communicator now refuses further collectives.")
            time.sleep(_NAP)


def lend(env: Env, array: Any, *, host_writes: bool = True) -> np.ndarray:
    """A page-locked host buffer of ``array``'s shape and dtype for this collective. ``host_writes``:
    the host writes it before any wait for the stream (MPI receiving into it), so the host first
    waits for the block's last copy, if one is pending; else the stream's later work waits for it."""
    block = env.staging.take(array.nbytes)
    host = block.view(array.shape, array.dtype)
    if host_writes:
        block.settle()
    else:
        block.after(env.stream)
    env.lent[id(host)] = block
    return host


def stage_to_host(env: Env, array: Any) -> np.ndarray:
    """A page-locked host copy of a device array: the copy is queued on the stream, then the host
    waits for the stream (deadline-aware): the step's one wait."""
    host = lend(env, array, host_writes=False)
    array.get(out=host, stream=env.stream, blocking=False)
    env.wait()
    return host


def stage_to_device(env: Env, host: np.ndarray, array: Any) -> None:
    """Queue the copy of ``host`` (from :func:`lend` or :func:`stage_to_host`) into ``array`` on the
    stream, without waiting: the block's event guards it until the copy has run."""
    array.set(host, stream=env.stream)
    env.lent[id(host)].mark(env.stream)


def _host_like(env: Env, array: Any) -> np.ndarray:
    """A host buffer for MPI to write: taken before :func:`stage_to_host`'s wait, which then covers
    the block's pending copy (on the same stream), so the host need not wait for it separately."""
    return lend(env, array, host_writes=False)


class MpiTransport:
    """MPI on the engine's communicator: on device pointers (CUDA-aware) or staged."""

    per_leaf = False  # reductions pack leaves (device_collectives.py)

    def __init__(self, env: Env, device: bool) -> None:
        self.env, self.device = env, device
        self.name = "mpi-device" if device else "mpi-staged"

    def rule(self, dtype: np.dtype, op: Op, what: str) -> Rule:
        return nccl.mpi_rule(dtype, op, self.env.ctx.where, what)

    def group(self) -> Any:
        return contextlib.nullcontext()

    def allreduce(self, send: Any, recv: Any, rule: Rule) -> None:
        ctx, mop = self.env.ctx, REDUCTIONS[rule.red]
        if self.device:  # flat and hierarchical allreduce touch only these two buffers
            self.env.wait()
            ctx.algorithm(send.nbytes).allreduce(ctx, send, recv, mop)
            return
        hrecv = _host_like(self.env, recv)
        hsend = stage_to_host(self.env, send)
        ctx.algorithm(send.nbytes).allreduce(ctx, hsend, hrecv, mop)
        stage_to_device(self.env, hrecv, recv)

    def bcast(self, buf: Any, root: int) -> None:
        ctx = self.env.ctx
        if self.device:
            self.env.wait()
            ctx.algorithm(buf.nbytes).bcast(ctx, buf, root)
            return
        host = stage_to_host(self.env, buf) if self.env.rank == root else lend(self.env, buf)
        ctx.algorithm(buf.nbytes).bcast(ctx, host, root)
        if self.env.rank != root:
            stage_to_device(self.env, host, buf)

    def reduce(self, send: Any, recv: Any | None, rule: Rule, root: int) -> None:
        ctx, mop = self.env.ctx, REDUCTIONS[rule.red]
        if self.device:  # the host algorithms' hierarchical reduce uses host temporaries: flat here
            self.env.wait()
            flat.reduce(ctx, send, recv, mop, root)
            return
        hrecv = _host_like(self.env, recv) if recv is not None else None
        ctx.algorithm(send.nbytes).reduce(ctx, stage_to_host(self.env, send), hrecv, mop, root)
        if hrecv is not None:  # None exactly where recv is
            stage_to_device(self.env, hrecv, recv)

    def allgatherv(self, send: Any, recv: Any, counts: np.ndarray) -> None:
        ctx = self.env.ctx
        if self.device:
            self.env.wait()
            flat.allgatherv(ctx, send, recv, counts)
            return
        hrecv = _host_like(self.env, recv)
        ctx.algorithm(recv.nbytes).allgatherv(ctx, stage_to_host(self.env, send), hrecv, counts)
        stage_to_device(self.env, hrecv, recv)

    def reduce_scatter(self, send: Any, recv: Any, counts: list[int], rule: Rule) -> None:
        ctx, mop = self.env.ctx, REDUCTIONS[rule.red]
        if self.device:
            self.env.wait()
            flat.reduce_scatter(ctx, send, recv, counts, mop)
            return
        hrecv = _host_like(self.env, recv)
        ctx.algorithm(send.nbytes).reduce_scatter(ctx, stage_to_host(self.env, send), hrecv, counts, mop)
        stage_to_device(self.env, hrecv, recv)


class NcclTransport:
    """NCCL over one node that holds every rank of the engine (node rank = engine rank)."""

    name = "nccl"
    per_leaf = True  # reductions issue one NCCL call per leaf, in one group (device_collectives.py)

    def __init__(self, env: Env, node: nccl.NodeComm) -> None:
        self.env, self.node = env, node

    def rule(self, dtype: np.dtype, op: Op, what: str) -> Rule | None:
        return nccl.nccl_rule(dtype, op, self.node.version, self.env.ctx.where, what)

    def group(self) -> Any:
        return self.node.group()

    def allreduce(self, send: Any, recv: Any, rule: Rule) -> None:
        self.node.allreduce(send, recv, rule, self.env.stream)

    def bcast(self, buf: Any, root: int) -> None:
        self.node.broadcast(buf, root, self.env.stream)

    def reduce(self, send: Any, recv: Any | None, rule: Rule, root: int) -> None:
        self.node.reduce(send, recv, rule, root, self.env.stream)

    def allgatherv(self, send: Any, recv: Any, counts: np.ndarray) -> None:
        counts_ = [int(c) for c in counts]
        stream, base = self.env.stream, recv.data.ptr
        if len(set(counts_)) == 1:
            self.node.allgather(send, recv, stream)
            return
        displs = flat.displacements(counts_)
        with self.node.group():  # allgatherv as one broadcast per rank, launched together
            for r, (c, d) in enumerate(zip(counts_, displs)):
                if c:
                    src = send.data.ptr if r == self.env.rank else base + d
                    self.node.broadcast_bytes(src, base + d, c, r, stream)

    def reduce_scatter(self, send: Any, recv: Any, counts: list[int], rule: Rule) -> None:
        cp = self.env.cp
        if len(set(counts)) == 1:
            self.node.reduce_scatter(send, recv, rule, self.env.stream)
            return
        # Unequal blocks: pad every block to the largest; padded slots only meet padded slots.
        m, displs = max(counts), flat.displacements(counts)
        padded = cp.zeros(m * len(counts), dtype=rule.wire)
        for r, (c, d) in enumerate(zip(counts, displs)):
            padded[r * m:r * m + c] = send[d:d + c]
        block = cp.empty(m, dtype=rule.wire)
        self.node.reduce_scatter(padded, block, rule, self.env.stream)
        recv[...] = block[:counts[self.env.rank]]
