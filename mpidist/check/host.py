"""The checks on host memory: MPI and its launcher's view of nodes and ranks, MPI itself (mpi4py),
every collective of mpidist's engine against a NumPy reference, and ULFM.

Each function runs on every rank and returns this rank's :class:`~mpidist.check.results.Outcome`;
an exception is this rank's ``broken`` outcome (mpidist/check/__init__.py). The calls that check
correctness run under a deadline (``Context.timeout``), so a rank that never comes makes the
others fail instead of wait; the timed calls, made once every rank has proved to be there, are
the default calls (no deadline), as programs make them.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np
from mpi4py import MPI

from .._config import rc
from ..collectives.algorithms import auto_reason, choice
from ..elastic import ulfm
from ..topology import detect_launcher, mpi_library
from .context import (
    DTYPES,
    Context,
    allreduce_bus_factor,
    gate,
    make,
    median_seconds,
    mismatch,
    reference,
    settle,
    timing_line,
)
from .results import Outcome, broken, missing, ok

OPS = ("sum", "prod", "max", "min", "mean")
ULFM_FIX = ("launch with `mpirun --with-ft ulfm --mca mpi_ft_detector true` (inside Slurm: "
            "slurm/elastic.sbatch); srun direct launch has no ULFM")


def launcher_view(ctx: Context) -> Outcome:
    """MPI's ranks and nodes against what the launcher started and where (decided from what every
    rank reports, so the same on every rank)."""
    launcher = detect_launcher()
    topo = ctx.engine.topology
    size = ctx.size
    every = ctx.comm.allgather((MPI.Get_processor_name(), launcher.name, launcher.tasks, launcher.rank,
                                os.environ.get("SLURM_STEP_NUM_NODES"), launcher.hint, launcher.detail))
    hosts = sorted({e[0] for e in every})
    _, name, tasks, _, step_nodes, hint, extra = every[0]
    problems = []
    if tasks > 1 and size == 1:
        problems.append(f"{name} started {tasks} tasks but MPI_COMM_WORLD has size 1: each task is a "
                        f"separate singleton job")
    elif len({(e[1], e[2]) for e in every}) > 1:
        problems.append(f"the ranks disagree on their launcher: {sorted({(e[1], e[2]) for e in every})}")
    elif name != "singleton" and tasks != size:
        problems.append(f"{name} started {tasks} tasks but MPI_COMM_WORLD has size {size}")
    elif name != "singleton" and sorted(e[3] for e in every) != list(range(size)):
        problems.append(f"the launcher's task numbers are {[e[3] for e in every]}, expected each of 0..{size - 1} once")
    if not topo.faked_nodes and topo.num_nodes < len(hosts):
        problems.append(f"MPI groups the ranks into {topo.num_nodes} node(s) (shared memory) but they run on "
                        f"{len(hosts)} hosts ({', '.join(hosts)})")
    if name == "srun" and not topo.faked_nodes and step_nodes and step_nodes.isdigit() \
            and int(step_nodes) != topo.num_nodes:
        problems.append(f"srun placed the step on {step_nodes} node(s) but MPI finds {topo.num_nodes}")
    vendor, version = MPI.get_vendor()
    nodes = f"{topo.num_nodes} node(s) of {'+'.join(map(str, topo.node_sizes))} rank(s)"
    if topo.faked_nodes:
        nodes += f" (faked by MPIDIST_LOCAL_SIZE={os.environ.get('MPIDIST_LOCAL_SIZE', topo.local_size)})"
    detail = (f"{size} rank(s) = {tasks} task(s) of {name}{' ' + extra if extra else ''}; {nodes} on "
              f"{len(hosts)} host(s) ({', '.join(hosts[:4])}{', ...' if len(hosts) > 4 else ''}); {vendor} "
              f"{'.'.join(map(str, version))}, thread level {mpi_library.describe()['thread_level']}")
    if problems:
        return broken("; ".join(problems) + f" [{detail}]", fix=hint or "launch with mpirun or srun --mpi=pmix")
    seconds = median_seconds(ctx.comm.Barrier, ctx.repeat)
    return ok(detail, f"MPI_Barrier: {seconds * 1e3:.3f} ms median", seconds)


def mpi_allreduce(ctx: Context) -> Outcome:
    """MPI alone (mpi4py's Allreduce on NumPy buffers), before anything of mpidist."""
    count = ctx.nbytes // 8
    mine = make(ctx.rank, np.float64, (count,))
    out = np.empty_like(mine)
    ctx.comm.Allreduce(mine, out, op=MPI.SUM)
    wrong = mismatch("MPI_Allreduce of float64 sums", out, reference(ctx.size, np.float64, (count,), "sum"))
    found = settle(ctx, wrong, fix="the MPI library itself computes wrong sums: check its installation "
                                   "(`python -m mpi4py.bench helloworld`, the vendor's tests)")
    if found is not None:
        return found
    seconds = median_seconds(lambda: ctx.comm.Allreduce(mine, out, op=MPI.SUM), ctx.repeat)
    return ok("mpi4py Allreduce on NumPy buffers equals the host reference",
              timing_line("float64 sum", ctx.nbytes, seconds, allreduce_bus_factor(ctx.size)), seconds)


def allreduce(ctx: Context) -> Outcome:
    """Every op and dtype, flat and hierarchical, a nest, and allreduce_async, against NumPy."""
    engine, size, t = ctx.engine, ctx.size, ctx.timeout
    count, wrong = 0, None
    for algorithm in ("flat", "hierarchical"):
        for dtype in DTYPES:
            for op in OPS:
                if op == "mean" and not np.issubdtype(dtype, np.floating):
                    continue
                for shape in ((7,), (3001, 3)):  # a small call and one split into shards
                    got = engine.allreduce(make(ctx.rank, dtype, shape, op), op, algorithm=algorithm, timeout_seconds=t)
                    expected = reference(size, dtype, shape, op)
                    what = f"allreduce {op} {np.dtype(dtype).name} {shape} algorithm={algorithm}"
                    if op == "mean":  # a division: rounding may differ in the last bit
                        if not np.allclose(got, expected, rtol=1e-6, atol=0):
                            wrong = wrong or f"{what}: differs from the host reference beyond 1e-6"
                    else:
                        wrong = wrong or mismatch(what, got, expected)
                    count += 1
    nest = {"a": make(ctx.rank, np.float32, (5,)), "b": [make(ctx.rank, np.int64, (2, 3))]}
    got = engine.allreduce(nest, timeout_seconds=t)
    wrong = wrong or mismatch("allreduce of a nest (a)", got["a"], reference(size, np.float32, (5,), "sum")) or \
        mismatch("allreduce of a nest (b)", got["b"][0], reference(size, np.int64, (2, 3), "sum"))
    pending = [engine.allreduce_async(make(ctx.rank, np.float64, (100,)), timeout_seconds=t) for _ in range(3)]
    for i, p in enumerate(pending):
        wrong = wrong or mismatch(f"allreduce_async #{i}", p.wait(), reference(size, np.float64, (100,), "sum"))
    found = settle(ctx, wrong)
    if found is not None:
        return found
    x = np.ones(ctx.nbytes // 4, dtype=np.float32)
    seconds = median_seconds(lambda: engine.allreduce(x), ctx.repeat)
    return ok(f"{count} calls ({len(OPS)} ops x {len(DTYPES)} dtypes, flat and hierarchical on "
              f"{engine.topology.num_nodes} node(s)), a nest and allreduce_async equal the host reference; "
              f"{_auto_note(engine.topology)}",
              timing_line("float32 sum", ctx.nbytes, seconds, allreduce_bus_factor(size)), seconds)


def _auto_note(topo: Any) -> str:
    """What ``algorithm="auto"`` gives this job's buffers (1 KiB-1 GiB), and the setting it reads."""
    if rc.algorithm != "auto":
        return f"rc.algorithm={rc.algorithm} for every buffer"
    if not topo.multi_node:
        return "auto: flat (one node or one rank per node)"
    shape = choice.shape_of(topo, rc.nics_per_node)
    said = choice.summary(choice.bands(shape, rc.hierarchical_threshold, rc.check_agreement))
    hint = "" if rc.hierarchical_threshold is not None else \
        f"; rc.nics_per_node={rc.nics_per_node}: set MPIDIST_NICS_PER_NODE to the NICs each node uses"
    return f"auto: {said} ({auto_reason(topo)}{hint}; python -m mpidist info shows the costs)"


def broadcast(ctx: Context) -> Outcome:
    engine, t, wrong = ctx.engine, ctx.timeout, None
    for root in sorted({0, ctx.size - 1}):
        for dtype in DTYPES:
            got = engine.broadcast(make(ctx.rank, dtype, (4001,)), root=root, timeout_seconds=t)
            wrong = wrong or mismatch(f"broadcast {np.dtype(dtype).name} root={root}", got, make(root, dtype, (4001,)))
    found = settle(ctx, wrong)
    if found is not None:
        return found
    x = np.ones(ctx.nbytes // 4, dtype=np.float32)
    seconds = median_seconds(lambda: engine.broadcast(x, root=0), ctx.repeat)
    return ok("every dtype from the first and the last rank equals the root's data",
              timing_line("float32 from rank 0", ctx.nbytes, seconds), seconds)


def allgather(ctx: Context) -> Outcome:
    engine, size, t, wrong = ctx.engine, ctx.size, ctx.timeout, None
    for dtype in DTYPES:  # rank r gives r + 1 rows: uneven first axes
        got = engine.allgather(make(ctx.rank, dtype, (ctx.rank + 1, 3)), timeout_seconds=t)
        expected = np.concatenate([make(r, dtype, (r + 1, 3)) for r in range(size)])
        wrong = wrong or mismatch(f"allgather {np.dtype(dtype).name} (rank r gives r + 1 rows)", got, expected)
    found = settle(ctx, wrong)
    if found is not None:
        return found
    x = np.ones(max(ctx.nbytes // 4 // size, 1), dtype=np.float32)
    seconds = median_seconds(lambda: engine.allgather(x), ctx.repeat)
    return ok("every dtype, uneven first axes, in rank order equals the host reference",
              timing_line("float32, the gathered result", x.nbytes * size, seconds), seconds)


def reduce(ctx: Context) -> Outcome:
    engine, size, t, wrong = ctx.engine, ctx.size, ctx.timeout, None
    root = size - 1
    for dtype in DTYPES:
        for op in ("sum", "max"):
            got = engine.reduce(make(ctx.rank, dtype, (2001,), op), op, root=root, timeout_seconds=t)
            what = f"reduce {op} {np.dtype(dtype).name} root={root}"
            if ctx.rank != root:
                if got is not None:
                    wrong = wrong or f"{what}: expected None on a rank that is not the root, got {type(got).__name__}"
            else:
                wrong = wrong or mismatch(what, got, reference(size, dtype, (2001,), op))
    found = settle(ctx, wrong)
    if found is not None:
        return found
    x = np.ones(ctx.nbytes // 4, dtype=np.float32)
    seconds = median_seconds(lambda: engine.reduce(x, root=0), ctx.repeat)
    return ok(f"sum and max of every dtype to rank {root} equal the host reference",
              timing_line("float32 sum to rank 0", ctx.nbytes, seconds), seconds)


def reduce_scatter(ctx: Context) -> Outcome:
    engine, size, t, wrong = ctx.engine, ctx.size, ctx.timeout, None
    rows = 2 * size + 1  # uneven blocks
    for dtype in DTYPES:
        got = engine.reduce_scatter(make(ctx.rank, dtype, (rows, 3)), timeout_seconds=t)
        expected = np.array_split(reference(size, dtype, (rows, 3), "sum"), size)[ctx.rank]
        wrong = wrong or mismatch(f"reduce_scatter sum {np.dtype(dtype).name} ({rows} rows)", got, expected)
    found = settle(ctx, wrong)
    if found is not None:
        return found
    x = np.ones(ctx.nbytes // 4, dtype=np.float32)
    seconds = median_seconds(lambda: engine.reduce_scatter(x), ctx.repeat)
    return ok("sum of every dtype in uneven blocks equals the host reference",
              timing_line("float32 sum", ctx.nbytes, seconds), seconds)


def barrier(ctx: Context) -> Outcome:
    ctx.engine.barrier(timeout_seconds=ctx.timeout)
    seconds = median_seconds(ctx.engine.barrier, ctx.repeat)
    return ok("every rank came", f"barrier: {seconds * 1e3:.3f} ms median", seconds)


def ulfm_check(ctx: Context) -> Outcome:
    """ULFM active (mpidist.elastic survives a rank's death), proved by one fault-tolerant agreement."""
    active, why = ulfm.status()
    absent = gate(ctx, None if active else missing(f"not active: {why}", ULFM_FIX))
    if absent is not None:
        return absent
    comm = ctx.comm.Dup()
    try:
        flag = comm.Agree(1)  # MPIX_Comm_agree: the bitwise AND of every rank's flag
        seconds = median_seconds(lambda: comm.Agree(1), ctx.repeat)
    finally:
        comm.Free()
    if flag != 1:
        return broken(f"MPIX_Comm_agree of 1 on every rank returned {flag}, expected 1",
                      fix="the MPI library's ULFM is broken: check `ompi_info | grep -i 'FT MPI'`")
    return ok(f"{why}; MPIX_Comm_agree works", f"MPIX_Comm_agree: {seconds * 1e3:.3f} ms median", seconds)
