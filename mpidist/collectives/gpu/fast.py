"""Cached fast paths for repeated allreduce calls on CuPy arrays: one array, or a list/tuple of them.

The host's fast path (fastpath.py) caches what cannot change between repeats of the same call;
this is its GPU side. After the general path (dispatch.py) has run an allreduce of device arrays,
the engine's ``FastPaths.remember`` asks :func:`build` for a function that repeats it. Per (op,
dtypes, shapes, device, implementation) everything is worked out once: the path (from the job's
facts), the NCCL communicator, datatypes and ops (NCCL's constants, looked up once), the MPI
ops, packs and page-locked host blocks of the staged path, the agreement's key and hash. A repeat
then does only: the agreement (speculating: agreement.py and recipes.py), the result allocation,
the current stream's pointer and the data calls:

- ``nccl`` (one node): one ``allReduce`` per leaf on the current stream, several leaves in one NCCL
  group (as the general path: device_collectives.py), nothing waited for; MEAN is ``ncclAvg``
  (or a division queued after);
- ``mpi-staged``, and ``nccl+mpi`` where every node has one rank staged: each leaf copied into its
  place in one page-locked block (queued), ONE wait for the stream, one in-place MPI allreduce per
  pack of the host plan, the copies back queued on the stream (the block's event guards its reuse:
  staging.py);
- ``mpi-device``, and ``nccl+mpi`` where every node has one rank on CUDA-aware MPI: packs built on
  the device, one wait for the stream, MPI on device pointers.

The data calls are exactly the recipe the general path recorded for the signature (recipes.py):
:func:`build` declines (None: the general path runs every time) unless they are, and unless the
call qualifies: C-contiguous CuPy arrays of one device, the current device, no zero-size leaf,
rules every leaf's dtype has on the path, flat MPI packs. Hierarchical paths with several ranks per
node are not cached.
"""
from __future__ import annotations

import weakref
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from ..._config import rc
from .. import nest, packing
from ..algorithms import choose, flat
from ..algorithms.flat import posts_allreduce
from ..ops import REDUCTIONS, Op, finish_mean
from ..pipeline import structure_of
from . import facts, nccl, paths
from .paths import Path

_WHERE = "allreduce"


def attach(pipeline: Any, cp: Any) -> None:
    """Register the GPU fast path on the pipeline's FastPaths (once per pipeline)."""
    fast = pipeline.fast
    if fast.attached(cp.ndarray):
        return
    fast.attach_devices(cp.ndarray, cp.cuda.runtime.getDevice,
                        lambda op, red, value, implementation: build(pipeline, cp, red, value, implementation))


def build(pipeline: Any, cp: Any, red: Op, value: Any, implementation: str = "auto") -> Callable | None:
    """The cached function repeating this allreduce of device arrays, or None (module docstring)."""
    single = type(value) is cp.ndarray
    leaves = [value] if single else list(value)
    state = facts.state(pipeline)
    job = state.facts
    if job is None or not _qualifies(cp, leaves):
        return None
    device = leaves[0].data.device_id
    path = paths.choose(implementation, rc.algorithm, job, deadline=False, who=_WHERE)  # as dispatch.py
    topo = pipeline.topology
    if path is Path.NCCL:
        node = state.node_comms.get(device)
        if node is None:
            return None
        made = _nccl(cp, node, leaves, red, single, type(value))
    elif path in (Path.MPI_STAGED, Path.MPI_DEVICE):
        made = _mpi(cp, pipeline, state, leaves, red, single, type(value), path is Path.MPI_DEVICE,
                    lambda dtype, what: nccl.mpi_rule(dtype, red, _WHERE, what), check_flat=True)
    elif path.uses_nccl and topo.num_nodes == topo.size:  # nccl+mpi, every node one rank: MPI alone
        made = _mpi(cp, pipeline, state, leaves, red, single, type(value), paths.cross_node_mpi_on_device(job, False),
                    lambda dtype, what: nccl.nccl_rule(dtype, red, job.nccl_version, _WHERE, what, hierarchical=True),
                    check_flat=False)
    else:
        return None
    if made is None:
        return None
    data, steps = made
    structure = "*" if single else structure_of(nest.flatten(value)[1])
    return pipeline.fast.bound(red, structure, leaves, data, f"gpu:{implementation}", steps)


def _qualifies(cp: Any, leaves: list[Any]) -> bool:
    if not leaves or not all([type(a) is cp.ndarray and a.flags.c_contiguous and a.size for a in leaves]):
        return False
    device = leaves[0].data.device_id
    return all([a.data.device_id == device for a in leaves]) and cp.cuda.runtime.getDevice() == device


# -- NCCL ----------------------------------------------------------------------------------------------

def _nccl(cp: Any, node: nccl.NodeComm, leaves: list[Any], red: Op, single: bool, kind: type
          ) -> tuple[Callable, tuple] | None:
    """One allReduce per leaf, in one group for several (as device_collectives.py issues them)."""
    module = node.module
    plan = []
    for i, a in enumerate(leaves):
        rule = nccl.nccl_rule(a.dtype, red, node.version, _WHERE, f"leaf {i} of `value`")
        if rule is None:  # no NCCL rule (PROD of complex): the general path's MPI fallback
            return None
        wire = rule.wire
        assert rule.nccl_dtype is not None, "an NCCL rule names its NCCL datatype"
        plan.append((a.shape, a.dtype, wire, a.dtype != wire, a.size * rule.factor,
                     getattr(module, rule.nccl_dtype), getattr(module, nccl.OPS[rule.red]), rule.finish_mean,
                     a.size * wire.itemsize))
    steps = tuple(("nccl", dt, count, op, nbytes) for _, _, _, _, count, dt, op, _, nbytes in plan)
    comm, size = node.comm, node.size
    allreduce, empty, current = comm.allReduce, cp.empty, cp.cuda.get_current_stream
    if single and not plan[0][3] and not plan[0][7]:  # the common case, unrolled
        shape, dtype, _, _, count, datatype, op, _, _ = plan[0]

        def one(x: Any) -> Any:
            out = empty(shape, dtype)
            allreduce(x.data.ptr, out.data.ptr, count, datatype, op, current().ptr)
            return out
        return one, steps
    group_start, group_end = module.groupStart, module.groupEnd
    as_dtype, from_wire = packing.as_dtype, packing.from_wire

    def many(value: Any) -> Any:
        leaves_ = (value,) if single else value
        stream = current().ptr
        outs, sends = [], []
        group_start()
        try:
            for x, (shape, _, wire, convert, count, datatype, op, _, _) in zip(leaves_, plan):
                send = as_dtype(x, wire) if convert else x
                out = empty(shape, wire)
                allreduce(send.data.ptr, out.data.ptr, count, datatype, op, stream)
                sends.append(send)  # alive until the group has issued its calls
                outs.append(out)
        finally:
            group_end()
        results = []
        for out, (_, dtype, _, convert, _, _, _, mean, _) in zip(outs, plan):
            if mean:
                finish_mean(out, size, xp=cp)
            results.append(from_wire(out, dtype) if convert else out)
        if single:
            return results[0]
        return results if kind is list else tuple(results)
    return many, steps


# -- MPI: staged, or on device pointers -----------------------------------------------------------------

def _mpi(cp: Any, pipeline: Any, state: Any, leaves: list[Any], red: Op, single: bool, kind: type,
         on_device: bool, rule_of: Callable[[np.dtype, str], Any], check_flat: bool
         ) -> tuple[Callable, tuple] | None:
    """Flat MPI allreduces on the engine's communicator, one per pack of the host plan (as
    transports.MpiTransport, or the hierarchical transport of one-rank nodes, issues them)."""
    topo, size, comm = pipeline.topology, pipeline.size, pipeline.comm
    dtypes = [a.dtype for a in leaves]
    rules = {}
    for i, d in enumerate(dtypes):
        if d not in rules:
            rules[d] = rule_of(d, f"leaf {i} of `value`")
            if rules[d] is None:
                return None
    nbytes = [a.size * rules[d].wire.itemsize for a, d in zip(leaves, dtypes)]
    packs = [[0]] if single else packing.plan(nbytes, dtypes, rc.bytes_per_pack, None)
    threshold = rc.iallreduce_threshold
    layout, steps, total = [], [], 0
    for pack in packs:
        rule = rules[dtypes[pack[0]]]
        count = sum([leaves[i].size for i in pack])
        pack_bytes = count * rule.wire.itemsize
        if check_flat and choose(rc.algorithm, topo, pack_bytes) is not flat:
            return None
        posted = posts_allreduce(pack_bytes, threshold, False)
        mop = REDUCTIONS[rule.red]
        at, bounds = 0, []
        for i in pack:
            bounds.append((i, at, leaves[i].size, leaves[i].shape, dtypes[i], dtypes[i] != rule.wire))
            at += leaves[i].size
        layout.append((total, count, rule.wire, mop, posted, rule.finish_mean, bounds))
        steps.append((rule.wire, count, mop, posted))
        total += -(-pack_bytes // packing.ALIGN) * packing.ALIGN
    if on_device:
        return _mpi_device(cp, comm, size, layout, single, kind), tuple(steps)
    return _mpi_staged(cp, comm, size, state.staging_pool(cp), layout, total, single, kind), tuple(steps)


def _unpack(out: Any, bounds: list, results: list, single_leaf: bool) -> None:
    for i, at, n, shape, dtype, convert in bounds:
        piece = out if single_leaf else out[at:at + n]
        piece = piece.reshape(shape)
        results[i] = packing.from_wire(piece, dtype) if convert else piece


def _mpi_staged(cp: Any, comm: MPI.Intracomm, size: int, staging: Any, layout: list, total: int, single: bool,
                kind: type) -> Callable:
    block = staging.take(total)
    packs = []
    for offset, count, wire, mop, posted, mean, bounds in layout:
        host = block.view((count,), wire, offset)
        places = [(i, host[at:at + n].reshape(shape), wire if convert else None)
                  for i, at, n, shape, _, convert in bounds]
        packs.append((host, count, wire, mop, posted, mean, bounds, places, len(bounds) == 1))
    n_leaves = sum([len(p[6]) for p in packs])
    current, empty, in_place, event = cp.cuda.get_current_stream, cp.empty, MPI.IN_PLACE, block.event

    def staged(value: Any) -> Any:
        leaves = (value,) if single else value
        stream = current()
        if block.stream is not None and block.stream != stream.ptr:  # Block.after, inline
            stream.wait_event(event)
        for pack in packs:
            for i, place, wire in pack[7]:
                x = leaves[i]
                (x if wire is None else packing.as_dtype(x, wire)).get(out=place, stream=stream, blocking=False)
        stream.synchronize()  # the one wait: the leaves' producers and the copies
        results: list[Any] = [None] * n_leaves
        for host, count, wire, mop, posted, mean, bounds, _, alone in packs:
            if posted:
                comm.Iallreduce(in_place, host, mop).Wait()
            else:
                comm.Allreduce(in_place, host, mop)
            if mean:
                finish_mean(host, size)
            out = empty((count,), wire)
            out.set(host, stream=stream)
            _unpack(out, bounds, results, alone)
        event.record(stream)  # Block.mark, inline: the copies back read the block until then
        block.stream = stream.ptr
        if single:
            return results[0]
        return results if kind is list else tuple(results)

    weakref.finalize(staged, staging.give, block)  # the block goes back to the pool with the function
    return staged


def _mpi_device(cp: Any, comm: MPI.Intracomm, size: int, layout: list, single: bool, kind: type) -> Callable:
    current, empty = cp.cuda.get_current_stream, cp.empty
    n_leaves = sum([len(p[6]) for p in layout])

    def on_device(value: Any) -> Any:
        leaves = (value,) if single else value
        sends = []
        for _, _, wire, _, _, _, bounds in layout:
            sends.append(packing.pack([leaves[i] for i, *_ in bounds], wire, xp=cp).reshape(-1))
        current().synchronize()  # MPI reads device memory: the producers must be done
        results: list[Any] = [None] * n_leaves
        for send, (_, count, wire, mop, posted, mean, bounds) in zip(sends, layout):
            out = empty((count,), wire)
            if posted:
                comm.Iallreduce(send, out, mop).Wait()
            else:
                comm.Allreduce(send, out, mop)
            if mean:
                finish_mean(out, size, xp=cp)
            _unpack(out, bounds, results, len(bounds) == 1)
        if single:
            return results[0]
        return results if kind is list else tuple(results)
    return on_device
