"""``python -m mpidist bench gpu``: allreduce of CuPy arrays through mpidist against what it replaces.

Two comparisons in one run (bench/timing.py: barrier-started blocks of each case interleaved,
medians; every case ends with a synchronization of the stream, so its time is a complete
collective, and every case's result is checked once before timing):

1. **NCCL, one array** (``--sizes``, default 4 KB to 256 MB): ``raw NCCL`` = CuPy's
   ``NcclCommunicator.allReduce`` over all ranks on the same buffers, against ``Engine.allreduce``.
   Where NCCL cannot join the ranks (two ranks on one GPU before NCCL 2.30, no NCCL), this part is
   refused with NCCL's reason. Bus bandwidth is ``2 (n-1) / n × bytes / time`` (n ranks); with one
   rank nothing crosses a bus, so the algorithm bandwidth ``bytes / time`` is shown instead.
2. **Staged** (``--staged-sizes``, default 4 KB, 1, 16 and 64 MB): a hand-written loop (copy into
   page-locked host memory, ``comm.Allreduce`` in place, copy back) against ``Engine.allreduce``
   on the path it picks (``auto``: ``mpi-staged`` where ranks share a GPU, ``nccl+mpi`` on nodes of
   one rank, ...) and with RING (``mpi-staged``, or ``mpi-device`` on CUDA-aware MPI) when that
   is another path.

``--before PATH`` also times the mpidist of another checkout (``PATH/mpidist``, e.g. the main
branch), loaded in the same processes as ``mpidist_before`` and interleaved with the rest (as
``bench paths`` does), so one run gives the before and after columns on the same machine.
Needs CuPy and a GPU per rank (or shared).
"""
from __future__ import annotations

import argparse
import contextvars
import json
import statistics
from types import ModuleType
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from ..collectives import Engine
from ..collectives.gpu import binding, cupy_arrays, facts
from ..collectives.options import CallOptions
from .paths import load_before
from .timing import fmt_size, paired_ratios, parse_size, samples

NCCL_SIZES = "4KB,64KB,1MB,16MB,256MB"
STAGED_SIZES = "4KB,1MB,16MB,64MB"


def nccl_refusal(cp: Any, comm: MPI.Intracomm) -> str | None:
    """Why raw NCCL cannot join every rank of ``comm`` (as mpidist's job facts decide it, with all
    ranks taken as one node), or None (collective)."""
    device = int(cp.cuda.runtime.getDevice())
    ranks = comm.allgather(facts.local_facts(cp, 0, device))
    return facts.job_facts(ranks, facts.multi_rank_gpu_enabled()).nccl_reason


def _raw_comm(nccl: Any, comm: MPI.Intracomm) -> Any:
    uid = nccl.get_unique_id() if comm.Get_rank() == 0 else None
    return nccl.NcclCommunicator(comm.Get_size(), comm.bcast(uid, root=0), comm.Get_rank())


class Side:
    """One mpidist package's engines (this one, or ``--before``'s): automatic path and RING."""

    def __init__(self, package: ModuleType | None, comm: MPI.Intracomm, label: str) -> None:
        self.label = label
        self.gpu = package.collectives.gpu if package is not None else None
        make = package.collectives.Engine if package is not None else Engine
        self.auto, self.ring = make(comm), make(comm)
        block = getattr(self.gpu, "implementation", None)  # an older package (--before): a context block
        self.ring_block: Any = None
        self.ring_context: contextvars.Context | None = None
        if block is not None:  # RING set once, entered per call (cheap)
            self.ring_block = block("ring")
            self.ring_context = contextvars.copy_context()
            self.ring_context.run(self.ring_block.__enter__)
        options = package.collectives.options.CallOptions if package is not None else CallOptions
        self.ring_options = None if block is not None else options(implementation="ring")  # this one: an option

    def path(self, engine: Any) -> str:
        state = (self.gpu.facts if self.gpu is not None else facts).state(engine)
        return state.last_path.value if state.last_path is not None else "?"

    def close(self) -> None:
        if self.ring_context is not None:
            self.ring_context.run(self.ring_block.__exit__, None, None, None)
        self.auto.close()
        self.ring.close()


def _checked(cases: dict[str, Callable[[], Any]], cp: Any, expected: float, where: str) -> None:
    for name, fn in cases.items():
        if not np.all(cp.asnumpy(fn()) == expected):
            raise RuntimeError(f"python -m mpidist bench gpu: {name} gave a wrong result ({where})")


def _row(case: str, nbytes: int, times: dict[str, list[float]], base: str) -> dict:
    return {"case": case, "size": fmt_size(nbytes), "bytes": nbytes, "rounds": len(times[base]),
            "median": {name: statistics.median(t) for name, t in times.items()},
            "ratio": paired_ratios(times, base)}


def run(sizes: list[int], staged_sizes: list[int], seconds: float, comm: MPI.Intracomm | None = None,
        before: ModuleType | None = None) -> dict:
    """Both comparisons (see the module docstring): ``{"nccl": rows or None, "refused": why,
    "staged": rows, "paths": {case: path}}``."""
    comm = MPI.COMM_WORLD if comm is None else comm
    cp = cupy_arrays.load_cupy()
    sides = [Side(None, comm, "")] + ([Side(before, comm, " before")] if before is not None else [])
    binding.bind_device(sides[0].auto.topology)
    raw_comm = sides[0].auto.topology.comm
    stream, size = cp.cuda.get_current_stream(), comm.Get_size()
    expected = size * (size + 1) / 2
    refused = nccl_refusal(cp, raw_comm)
    out: dict[str, Any] = {"ranks": size, "refused": refused, "nccl": None, "staged": [], "paths": {}}

    def mpidist_case(engine: Any, context: contextvars.Context | None, x: Any,
                     options: Any = None) -> Callable[[], Any]:
        if context is None:
            def call() -> Any:
                result = engine.allreduce(x, options=options)
                stream.synchronize()
                return result
        else:
            def call() -> Any:
                result = context.run(engine.allreduce, x)
                stream.synchronize()
                return result
        return call

    if refused is None:
        nccl = cupy_arrays.load_nccl()
        raw = _raw_comm(nccl, raw_comm)
        out["nccl"] = []
        for nbytes in sizes:
            x = cp.full(nbytes // 4, comm.Get_rank() + 1, dtype=cp.float32)
            buf = cp.empty_like(x)

            def raw_call(x: Any = x, buf: Any = buf) -> Any:
                raw.allReduce(x.data.ptr, buf.data.ptr, x.size, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream.ptr)
                stream.synchronize()
                return buf
            cases: dict[str, Callable[[], Any]] = {"raw NCCL": raw_call}
            for side in sides:
                cases["mpidist" + side.label] = mpidist_case(side.auto, None, x)
            _checked(cases, cp, expected, f"NCCL, {fmt_size(nbytes)}")
            for side in sides:
                out["paths"]["mpidist" + side.label] = side.path(side.auto)
            out["nccl"].append(_row("allreduce", nbytes, samples(comm, cases, seconds), "raw NCCL"))
    for nbytes in staged_sizes:
        x = cp.full(nbytes // 4, comm.Get_rank() + 1, dtype=cp.float32)
        host = cupy_arrays.pinned_empty((x.size,), np.dtype(np.float32))
        back = cp.empty_like(x)

        def loop(x: Any = x, host: np.ndarray = host, back: Any = back) -> Any:
            x.get(out=host)  # waits for the copy
            raw_comm.Allreduce(MPI.IN_PLACE, host, MPI.SUM)
            back.set(host)
            stream.synchronize()
            return back
        cases = {"loop": loop}
        for side in sides:
            cases["auto" + side.label] = mpidist_case(side.auto, None, x)
            cases["ring" + side.label] = mpidist_case(side.ring, side.ring_context, x, side.ring_options)
        _checked(cases, cp, expected, f"staged, {fmt_size(nbytes)}")
        for side in sides:
            out["paths"]["auto" + side.label] = side.path(side.auto)
            out["paths"]["ring" + side.label] = side.path(side.ring)
        if out["paths"]["auto"] == out["paths"]["ring"]:  # the same path twice: time it once
            cases = {name: fn for name, fn in cases.items() if not name.startswith("ring")}
        out["staged"].append(_row("allreduce", nbytes, samples(comm, cases, seconds), "loop"))
    for side in sides:
        side.close()
    return out


def _speed(nbytes: int, seconds: float, ranks: int) -> str:
    if ranks == 1:
        return f"algbw {nbytes / seconds / 1e9:7.2f} GB/s"
    return f"busbw {2 * (ranks - 1) / ranks * nbytes / seconds / 1e9:7.2f} GB/s"


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:10.1f}" if seconds < 1e-2 else f"{seconds * 1e3:8.2f}ms"


def tables(out: dict) -> str:
    """The two comparisons as text tables, with the goals of issue 23 checked."""
    n, paths, lines = out["ranks"], out["paths"], []
    before = any(name.endswith(" before") for name in paths)
    if out["nccl"] is None:
        lines.append(f"mpidist bench gpu: NCCL, one array: refused: {out['refused']}")
    else:
        names = ["raw NCCL"] + (["mpidist before"] if before else []) + ["mpidist"]
        lines.append(f"mpidist bench gpu: allreduce of one float32 CuPy array, {n} rank(s), raw CuPy NCCL vs "
                     f"mpidist (path {paths.get('mpidist')}"
                     + (f"; before: {paths.get('mpidist before')}" if before else "")
                     + "): median µs per call, stream synchronized; mpidist - raw; mpidist's bandwidth")
        lines.append(f"{'size':<8}" + "".join(f"{name:>16}" for name in names) + f"{'- raw':>10}   bandwidth")
        for row in out["nccl"]:
            m = row["median"]
            extra = m["mpidist"] - m["raw NCCL"]
            goal = "" if row["bytes"] > 1 << 20 else ("  (goal <= raw + 10 µs: met)" if extra <= 10e-6
                                                      else "  (goal <= raw + 10 µs: missed)")
            lines.append(f"{row['size']:<8}" + "".join(f"{_us(m[name]):>16}" for name in names)
                         + f"{extra * 1e6:10.1f}   {_speed(row['bytes'], m['mpidist'], n)}{goal}")
    names = [name for name in ("auto before", "auto", "ring before", "ring")
             if name in out["staged"][0]["median"]] if out["staged"] else []
    lines.append("")
    lines.append(f"mpidist bench gpu: staged allreduce of one float32 CuPy array, {n} rank(s): hand-written loop "
                 f"(page-locked copy, comm.Allreduce in place, copy back) vs mpidist; median µs per call "
                 f"(median of time / loop's time per round)")
    lines.append("paths: " + ", ".join(f"{name} = {paths.get(name)}" for name in names))
    lines.append(f"{'size':<8}{'loop':>12}" + "".join(f"{name:>24}" for name in names))
    staged = "auto" if paths.get("auto") != "nccl" else "ring"  # the staged one of mpidist's paths
    for row in out["staged"]:
        m, r = row["median"], row["ratio"]
        cells = "".join(f"{_us(m[name]) + f' ({r[name]:.2f}x)':>24}" for name in names)
        goals = []
        if row["bytes"] == 1 << 20 and staged in r:
            goals.append(f"goal {paths.get(staged)} <= 1.05x loop at 1 MB: "
                         + ("met" if r[staged] <= 1.05 else "missed"))
        if row["bytes"] == 4 << 10 and paths.get("auto") == "nccl+mpi":
            goals.append("goal nccl+mpi <= 150 µs at 4 KB: " + ("met" if m["auto"] <= 150e-6 else "missed"))
        lines.append(f"{row['size']:<8}{_us(m['loop']):>12}{cells}" + ("   " + "; ".join(goals) if goals else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mpidist bench gpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=NCCL_SIZES, help=f"sizes of the NCCL comparison (default {NCCL_SIZES})")
    parser.add_argument("--staged-sizes", default=STAGED_SIZES,
                        help=f"sizes of the staged comparison (default {STAGED_SIZES}; empty: none)")
    parser.add_argument("--seconds", type=float, default=1.0, help="time spent per size (default 1)")
    parser.add_argument("--before", default=None, metavar="PATH",
                        help="also time the mpidist of another checkout (PATH/mpidist), interleaved")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    args = parser.parse_args(argv)
    reason = cupy_arrays.cupy_reason()
    if reason is not None:
        if MPI.COMM_WORLD.Get_rank() == 0:
            print(f"python -m mpidist bench gpu: needs CuPy and a GPU: {reason}", flush=True)
        return 2
    before = load_before(args.before) if args.before else None
    out = run([parse_size(s) for s in args.sizes.split(",") if s.strip()],
              [parse_size(s) for s in args.staged_sizes.split(",") if s.strip()], args.seconds, before=before)
    if MPI.COMM_WORLD.Get_rank() == 0:
        print(json.dumps(out, indent=1) if args.json else tables(out), flush=True)
    return 0
