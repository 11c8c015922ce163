"""``python -m tools.gpu_calls [--before PATH] [--fake]``: Python calls per steady-state allreduce of
CuPy arrays (one array of 4 KB, a list of ten), in all and inside mpidist, on this checkout and
optionally another (``--before PATH``: the mpidist at PATH/mpidist, loaded as ``mpidist_before``,
as ``bench paths`` does). Counted with ``sys.setprofile``, not timed: the same on any machine.
``--fake``: on the host fake of CuPy/NCCL of tests/mpi (no GPU needed). Run under mpirun (any -n).
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Callable

REPEATS = 20


def count(fn: Callable[[], Any], roots: tuple[str, ...]) -> tuple[float, float]:
    """(all Python calls, calls inside ``roots``) per call of ``fn``, after warming up."""
    for _ in range(5):
        fn()
    seen = [0, 0]

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            seen[0] += 1
            if frame.f_code.co_filename.startswith(roots):
                seen[1] += 1
    sys.setprofile(profile)
    try:
        for _ in range(REPEATS):
            fn()
    finally:
        sys.setprofile(None)
    return seen[0] / REPEATS, seen[1] / REPEATS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.gpu_calls", description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default=None, metavar="PATH", help="also count the mpidist at PATH/mpidist")
    parser.add_argument("--fake", action="store_true", help="use the host fake of CuPy/NCCL (tests/mpi)")
    args = parser.parse_args(argv)
    if args.fake:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "mpi"))
        import fake_cupy  # type: ignore[import-not-found]  # tests/mpi, on sys.path from the line above
        cp: Any = fake_cupy.install()
    else:
        import cupy
        cp = cupy
    from mpi4py import MPI

    import mpidist
    from mpidist.bench.paths import load_before
    packages = [("this checkout", mpidist)]
    if args.before:
        packages.insert(0, ("before", load_before(args.before)))
    rank = MPI.COMM_WORLD.Get_rank()
    for label, package in packages:
        engine = package.collectives.Engine()
        assert package.__file__ is not None, "a package imported from a checkout has a file"
        root = os.path.dirname(package.__file__) + os.sep
        one = cp.ones(1024, dtype=cp.float32)
        ten = [cp.ones(100 + i, dtype=cp.float32) for i in range(10)]
        for what, value in (("one array", one), ("ten arrays", ten)):
            def call(engine=engine, value=value):
                return engine.allreduce(value)
            total, inside = count(call, (root,))
            if rank == 0:
                print(f"{label:<14} allreduce of {what:<11}: {total:6.1f} Python calls per call, {inside:5.1f} "
                      f"inside mpidist ({package.__name__} at {os.path.dirname(root)})", flush=True)
        engine.close()
    if args.fake:
        fake_cupy.uninstall()
    return 0


if __name__ == "__main__":
    sys.exit(main())
