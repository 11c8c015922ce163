"""``python -m mpidist check``: the first command to run on a new cluster, the way jobs run
(``mpirun -n 4 python -m mpidist check``, ``srun -N2 --ntasks-per-node=4 --mpi=pmix python -m
mpidist check``). It proves what works instead of listing what was built:

1. MPI and its launcher agree on ranks and nodes (no singletons, no nodes merged);
2. MPI itself (mpi4py's Allreduce) and every collective of mpidist on host buffers (every op and
   dtype, flat and hierarchical, uneven shapes) equal a NumPy reference computed on each rank;
3. on GPU nodes: CuPy on each rank's GPU, CUDA-aware MPI on device buffers, mpidist's collectives
   on CuPy arrays on every path this job can take (MPI on device pointers, MPI staged through
   host memory, NCCL, NCCL+MPI across nodes), and TensorFlow GPU tensors through the DLPack bridge
   when TensorFlow sees a GPU;
4. ULFM (mpidist.elastic surviving a rank's death), with one fault-tolerant agreement;
5. what ``mpidist run`` would resolve here (Horovod names, TF_CONFIG, Keras, GPUs), right after the
   launcher's line.

Each check gives a one-line timing (the slowest rank's median). The chief prints each result as it
comes, then what works, what is missing with the one-line fix for each, and what was skipped and
why. The exit status is 1 on every rank when something present is broken (0 otherwise, missing
and skipped included), 2 for a wrong command line. Host collectives run under a deadline
(``--timeout``), so a rank that never comes is reported instead of hanging the job.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
from typing import Any, Callable, Sequence

from mpi4py import MPI

from .._version import __version__
from ..collectives import Engine
from . import gpu, host, launch
from .context import Context, fmt_size
from .results import Outcome, Verdict, broken, combine, failed, format_summary, format_verdict, skipped

Check = Callable[[Context], Any]  # returns an Outcome, or a list of (name, Outcome)
CHECKS: list[tuple[str, Check]] = [
    ("MPI and launcher", host.launcher_view),
    ("mpidist run (what it would resolve)", launch.run_resolution),
    ("MPI Allreduce (mpi4py, host)", host.mpi_allreduce),
    ("allreduce (host)", host.allreduce),
    ("broadcast (host)", host.broadcast),
    ("allgather (host)", host.allgather),
    ("reduce (host)", host.reduce),
    ("reduce_scatter (host)", host.reduce_scatter),
    ("barrier", host.barrier),
    ("CuPy on GPU", gpu.cupy_on_gpu),
    ("CUDA-aware MPI", gpu.cuda_aware_mpi),
    ("GPU collectives", gpu.gpu_paths),
    ("TensorFlow GPU bridge", gpu.tensorflow_bridge),
    ("ULFM (elastic training)", host.ulfm_check),
]


def _outcomes(name: str, check: Check, ctx: Context) -> list[tuple[str, Outcome]]:
    """This rank's outcome(s) of one check; an exception is a broken outcome saying what was raised."""
    try:
        found = check(ctx)
    except Exception as exc:  # whatever broke, on this rank: the verdict says which rank and what
        text = str(exc).strip().splitlines()[0][:500] if str(exc).strip() else ""
        return [(name, broken(f"{type(exc).__name__}: {text}"))]
    return [(name, found)] if isinstance(found, Outcome) else list(found)


def run(ctx: Context, checks: Sequence[tuple[str, Check]] = CHECKS,
        emit: Callable[[Verdict], None] | None = None) -> list[Verdict]:
    """Run ``checks`` on every rank of ``ctx.comm`` (collective); the verdicts, the same on every
    rank. ``emit`` gets each verdict as soon as every rank has its outcome."""
    verdicts = []
    for name, check in checks:
        every = ctx.comm.allgather(_outcomes(name, check, ctx))
        names = list(dict.fromkeys(n for rank in every for n, _ in rank))
        for n in names:
            outcomes = [dict(rank).get(n) or broken(f"did not run on rank {r}") for r, rank in enumerate(every)]
            verdict = combine(n, outcomes)
            verdicts.append(verdict)
            if emit is not None:
                emit(verdict)
    return verdicts


def _skip_check(word: str) -> Any:
    """A check that reports itself skipped by ``--skip word``."""
    return lambda ctx: skipped(f"--skip {word}")


def selected(skip: str) -> list[tuple[str, Check]]:
    """CHECKS, those whose name contains one of the comma-separated words of ``skip`` replaced by a
    check that says it was skipped on request."""
    words = [w.strip().lower() for w in skip.split(",") if w.strip()]
    chosen = []
    for name, check in CHECKS:
        word = next((w for w in words if w in name.lower()), None)
        if word is not None:
            check = _skip_check(word)
        chosen.append((name, check))
    return chosen


def header(ctx: Context) -> list[str]:
    vendor, version = MPI.get_vendor()
    return [f"mpidist check: mpidist {__version__}, Python {platform.python_version()}, {vendor} "
            f"{'.'.join(map(str, version))} ({MPI.Get_library_version().replace(chr(0), '').strip().splitlines()[0]}); "
            f"{ctx.size} rank(s); timings: {fmt_size(ctx.nbytes)} calls, median of {ctx.repeat}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mpidist check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the verdicts as JSON at the end instead")
    parser.add_argument("--size", type=int, default=4 << 20, help="bytes of the timed calls (default 4 MiB)")
    parser.add_argument("--repeat", type=int, default=10, help="timed calls per check, median (default 10)")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds a host collective may take before it counts as broken (default 60)")
    parser.add_argument("--skip", default="", metavar="WORDS",
                        help="comma-separated words: skip the checks whose name contains one (e.g. tensorflow, "
                             "which imports TensorFlow where a GPU is)")
    args = parser.parse_args(argv)
    if args.size < 64 or args.repeat < 1 or args.timeout <= 0:
        parser.error(f"expected --size >= 64, --repeat >= 1, --timeout > 0; "
                     f"got {args.size}, {args.repeat}, {args.timeout}")
    comm = MPI.COMM_WORLD.Dup()
    engine = Engine(MPI.COMM_WORLD)
    ctx = Context(comm, engine, nbytes=args.size // 8 * 8, repeat=args.repeat, timeout=args.timeout)
    chief = ctx.rank == 0

    def emit(v: Verdict) -> None:
        if chief and not args.json:
            print(format_verdict(v), flush=True)

    if chief and not args.json:
        print("\n".join(header(ctx)), flush=True)
    verdicts = run(ctx, selected(args.skip), emit=emit)
    if chief:
        if args.json:
            print(json.dumps({"header": header(ctx), "checks": [v.as_dict() for v in verdicts],
                              "broken": failed(verdicts)}, indent=1), flush=True)
        else:
            print(format_summary(verdicts), flush=True)
    if engine.broken is None:
        engine.close()
    comm.Free()
    return 1 if failed(verdicts) else 0


if __name__ == "__main__":
    sys.exit(main())
