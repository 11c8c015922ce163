"""The data steps of a GPU allreduce, as the agreement needs them to speculate (agreement.py).

On the host, a collective whose signature repeats the one agreed last posts its agreement exchange
and moves its data at once, checking the exchange before returning; ranks that did not speculate
and find a mismatch *replay* the speculating ranks' data steps (the agreed signature's *recipe*) so
that those complete, and every rank raises. GPU allreduces speculate too, so the NCCL call is
enqueued without waiting for a round trip; their recipes are recorded here.

A GPU allreduce's recipe is what its data steps issued, recorded while they ran (:func:`begin`,
:func:`end`) and attached to the signature just agreed (:func:`adopt`), when the steps are all of
one replayable kind:

- NCCL ``allReduce`` calls on the node's communicator (the ``nccl`` path, one node):
  a :class:`DeviceRecipe`, which replays itself with zeros on that communicator;
- flat MPI ``Allreduce`` calls on the engine's communicator (``mpi-staged``, ``mpi-device``, and
  ``nccl+mpi`` where every node has one rank): the host's recipe form, ``(wire dtype, count,
  MPI op, non-blocking)``, replayed with host zeros (MPI matches calls, not where buffers live).

Anything else (the hierarchical paths with several ranks per node mix NCCL and MPI on two
communicators; other NCCL calls; a deadline) has no recipe and is never speculated on.

Why speculation stays safe on the GPU (the host's argument is in agreement.py):

- ``last`` stays equal on every rank. A recipe is adopted only right after an exchange that
  agreed on its signature, from steps that are a function of what the ranks agreed on (the
  signature, the options in it, the path from the job's facts, which every rank shares); a later
  call of the same signature that issued other steps drops the recipe, on every rank alike.
- A speculating rank only *enqueues* its NCCL calls on its stream, then waits on the host for the
  exchange: it never waits for the GPU before the exchange has completed, so a peer that is in
  another collective cannot block it there (an NCCL kernel waiting for its peers holds the GPU's
  stream, not the host).
- On a mismatch, the ranks that did not speculate replay the recipe: the same NCCL calls in the same
  order on the same node communicator, with zeros. So the speculating ranks' kernels complete, every
  rank's NCCL communicator has seen the same sequence of calls (it stays usable), and everyone
  raises CollectiveMismatchError. A speculating rank's result may still be in flight on its stream;
  it is never returned: the host raises first.
- A recipe holds the NCCL communicator of the device its steps ran on: a rank that runs the same
  signature on another GPU later (several GPUs per rank, changing ``cupy.cuda.Device``) and then
  meets a mismatch would replay on the first one; give such signatures their own engine.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

_UINT8 = np.dtype(np.uint8)


class DeviceRecipe(tuple):
    """NCCL steps ``("nccl", datatype, count, op, nbytes)`` on one node communicator; compares as the
    tuple of its steps."""

    node: Any  # the NodeComm the steps ran on
    cp: Any    # the CuPy module

    def __new__(cls, steps: Any, node: Any, cp: Any) -> DeviceRecipe:
        recipe = super().__new__(cls, steps)
        recipe.node, recipe.cp = node, cp
        return recipe

    def replay(self) -> None:
        """Issue the steps with zeros (one NCCL group, on this thread's current stream of the
        communicator's device), so that ranks that speculated on them can complete."""
        cp, node = self.cp, self.node
        with cp.cuda.Device(node.device):
            stream = cp.cuda.get_current_stream()
            kept = []  # alive until the group has issued its calls
            node.module.groupStart()
            try:
                for _, datatype, count, op, nbytes in self:
                    buf = cp.zeros(max(int(nbytes), 1), dtype=_UINT8)
                    kept.append(buf)
                    node.comm.allReduce(buf.data.ptr, buf.data.ptr, count, datatype, op, stream.ptr)
            finally:
                node.module.groupEnd()


def nccl_steps(calls: list[tuple]) -> tuple | None:
    """``NodeComm.issued`` entries as DeviceRecipe steps, or None if any is not an allReduce."""
    steps = []
    for name, nbytes, args in calls:
        if name != "allReduce":
            return None
        _, _, count, datatype, op, _ = args
        steps.append(("nccl", int(datatype), int(count), int(op), int(nbytes)))
    return tuple(steps)


def mpi_steps(issued: list[tuple], comm: Any) -> tuple | None:
    """``Caller.issued`` entries in the host recipe form, or None if any is not a flat Allreduce
    on ``comm`` (the engine's communicator)."""
    steps = []
    for on, name, args, nonblocking in issued:
        if on is not comm or name != "Allreduce" or len(args) != 3:
            return None
        send = args[1] if args[0] is MPI.IN_PLACE else args[0]
        steps.append((np.dtype(send.dtype), int(send.size), args[2], bool(nonblocking)))
    return tuple(steps)


def begin(ctx: Any, node: Any) -> None:
    """Record the data steps of the collective about to run (``ctx``: its pipeline.Call)."""
    ctx.call.issued = []
    if node is not None:
        node.issued = []


def end(ctx: Any, node: Any, cp: Any) -> tuple | None:
    """Stop recording; the recipe of what was issued, or None (see the module docstring)."""
    mpi, ctx.call.issued = ctx.call.issued, None
    calls: list = []
    if node is not None:
        calls, node.issued = node.issued or [], None
    if calls and not mpi:
        steps = nccl_steps(calls)
        return None if steps is None else DeviceRecipe(steps, node, cp)
    if mpi and not calls:
        return mpi_steps(mpi, ctx.topo.comm)
    return None


def adopt(agreement: Any, recipe: tuple | None) -> None:
    """Attach ``recipe`` to the signature the agreement has just agreed on (``agreement.last``), or
    drop the one attached if the steps issued differ from it: the same on every rank (see above)."""
    last = agreement.last
    if last is None:
        return
    if last[1] is None:
        if recipe:
            agreement.last = (last[0], recipe)
    elif last[1] != recipe:
        agreement.last = (last[0], None)
