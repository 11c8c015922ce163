"""``python -m tools.compression_bench``: float32 allreduce with and without compression on the wire.

Run under mpirun, e.g. ``mpirun -n 2 python -m tools.compression_bench`` (rank 0 prints). For each
size (default 4 MB and 64 MB of float32), in ONE run, blocks of every case interleaved, medians
over blocks (mpidist/bench/timing.py):

- raw mpi4py ``Allreduce`` (and ``Iallreduce`` + ``Wait``) of the float32 buffer;
- mpidist ``Engine.allreduce``, uncompressed, then with ``compression`` float16 and bfloat16
  (mpidist.collectives.compression: Alltoallv + float32 sums + Allgatherv of 16-bit data);
- with ``--alternatives``, the design not taken: the buffer converted to 16 bits, one MPI
  ``Allreduce`` with a user-defined op that sums in float32 inside the callback, converted back.

The engine's agreement is on (the default). Ratios are against raw Allreduce.

Then the conversions alone (every rank at once, no communication): the compression work one rank
does per float32 element of the allreduce, and the link bandwidth per rank below which the bytes
saved (4(n-1)/n per element: half of a ring allreduce's 8(n-1)/n) outweigh it.
"""
from __future__ import annotations

import argparse
import json
import os
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from mpidist.bench.timing import compare, fmt_size, parse_size
from mpidist.collectives import Engine
from mpidist.collectives.compression import codec
from mpidist.collectives.options import CallOptions
from tools import tables


def _user_op(kind: str) -> tuple[MPI.Op, Callable[[np.ndarray], np.ndarray], Callable[[np.ndarray], np.ndarray]]:
    """(MPI op summing 16-bit data in float32, float32 -> 16 bits, 16 bits -> float32), unscaled."""
    if kind == "float16":
        def to32(h: np.ndarray) -> np.ndarray:
            return h.view(np.float16).astype(np.float32)

        def to16(x: np.ndarray, out: np.ndarray) -> None:
            np.copyto(out.view(np.float16), x, casting="same_kind")
    else:
        bf = codec("bfloat16")

        def to32(h: np.ndarray) -> np.ndarray:
            return bf.decode(h, np.empty(h.size, np.float32))

        def to16(x: np.ndarray, out: np.ndarray) -> None:
            bf.encode(x, out)

    def add(inbuf: Any, inoutbuf: Any, datatype: Any) -> None:
        a = np.frombuffer(inbuf, np.uint16)
        b = np.frombuffer(inoutbuf, np.uint16)
        to16(to32(a) + to32(b), b)

    def encode(x: np.ndarray) -> np.ndarray:
        out = np.empty(x.size, np.uint16)
        to16(x, out)
        return out

    return MPI.Op.Create(add, commute=True), encode, to32


def cases(comm: MPI.Intracomm, engine: Engine, nbytes: int, alternatives: bool) -> dict[str, Callable[[], Any]]:
    rng = np.random.default_rng(comm.Get_rank())
    x = rng.standard_normal(nbytes // 4).astype(np.float32)
    out = np.empty_like(x)
    f16, bf16 = CallOptions(compression="float16"), CallOptions(compression="bfloat16")
    found: dict[str, Callable[[], Any]] = {
        "raw Allreduce float32": lambda: comm.Allreduce(x, out),
        "raw Iallreduce+Wait float32": lambda: comm.Iallreduce(x, out).Wait(),
        "mpidist allreduce, no compression": lambda: engine.allreduce(x),
        "mpidist allreduce, compression=float16": lambda: engine.allreduce(x, options=f16),
        "mpidist allreduce, compression=bfloat16": lambda: engine.allreduce(x, options=bf16),
    }
    if alternatives:
        for kind in ("float16", "bfloat16"):
            op, encode, decode = _user_op(kind)
            recv = np.empty(x.size, np.uint16)

            def run(op: MPI.Op = op, encode: Callable = encode, decode: Callable = decode,
                    recv: np.ndarray = recv) -> Any:
                comm.Allreduce(encode(x), recv, op)
                return decode(recv)
            found[f"alternative: {kind} + MPI user op Allreduce"] = run
    return found


def conversion_cost(comm: MPI.Intracomm, kind: str, count: int, rounds: int = 5) -> float:
    """Seconds per element of a ``count``-element allreduce that one rank spends converting, as
    compression.reduce_buffer does: encode and decode-and-add (n-1)/n of it, encode 1/n, decode all.
    Each step timed on ``count`` elements (best of ``rounds``, all ranks at once)."""
    import time
    n = comm.Get_size()
    c = codec(kind)
    x = np.random.default_rng(0).standard_normal(count).astype(np.float32)
    wire = np.empty(c.header + count, np.uint16)
    out = np.zeros(count, np.float32)
    steps = {"encode": lambda: c.encode(x, wire), "accumulate": lambda: c.accumulate(wire, out),
             "decode": lambda: c.decode(wire, out)}
    best = {}
    for name, step in steps.items():
        times = []
        for _ in range(rounds):
            comm.Barrier()
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        best[name] = min(times) / count
    return (n - 1) / n * (best["encode"] + best["accumulate"]) + best["encode"] / n + best["decode"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.compression_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="4MB,64MB", help="comma-separated buffer sizes (default 4MB,64MB)")
    parser.add_argument("--seconds", type=float, default=4.0, help="time per size (default 4)")
    parser.add_argument("--alternatives", action="store_true", help="also time the MPI user-op design")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    comm = MPI.COMM_WORLD
    engine = Engine(comm)
    results: dict[str, Any] = {"ranks": comm.Get_size(), "load": " ".join(f"{x:.2f}" for x in os.getloadavg())}
    for text in args.sizes.split(","):
        nbytes = parse_size(text)
        timed = compare(comm, cases(comm, engine, nbytes, args.alternatives), args.seconds)
        results[fmt_size(nbytes)] = {name: s * 1e3 for name, s in timed.items()}
    n = comm.Get_size()
    count = parse_size(args.sizes.split(",")[-1]) // 4
    results["conversion"] = {}
    for kind in ("float16", "bfloat16"):
        ns = conversion_cost(comm, kind, count) * 1e9
        saved = 4 * (n - 1) / n  # bytes per element
        results["conversion"][kind] = {"ns per element": ns,
                                       "break-even link GB/s per rank": saved / ns if ns and n > 1 else None}
    engine.close()
    if comm.Get_rank() == 0:
        print(json.dumps(results, indent=1) if args.json else _table(results), flush=True)
    return 0


def _table(results: dict) -> str:
    title = (f"compression bench, {results['ranks']} ranks; medians of interleaved blocks, ms per call; "
             f"load average at the start {results['load']}; sizes of float32 data")
    lines = [tables.table(title, results, 48, digits=3, skip=["conversion"], baselines=lambda _, rows: {
        "raw": rows["raw Allreduce float32"], "uncompressed": rows["mpidist allreduce, no compression"]})]
    lines.append("\nconversions alone, per float32 element of the allreduce (every rank at once)")
    for kind, row in results.get("conversion", {}).items():
        even = row["break-even link GB/s per rank"]
        lines.append(f"  {kind:<10}{row['ns per element']:8.2f} ns   compression pays below "
                     + (f"{even:.2f} GB/s ({even * 8:.1f} Gbit/s) per rank" if even else "- (one rank)"))
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
