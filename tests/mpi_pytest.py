"""Run pytest on every rank of an MPI job (used by tests/run).

Rank 0 reports to the terminal; rank N writes to tests/.logs/<label>.rank<N>.log, which is
printed if that rank fails. Exit 5 (no tests collected) is a failure, as any non-zero exit. When a rank has finished, it waits up to GRACE seconds for the
others (non-blocking barrier); if they do not arrive, it aborts the job so that no rank is left
waiting in a collective forever.
"""
from __future__ import annotations

import os
import sys
import time

from mpi4py import MPI
import pytest

GRACE = float(os.environ.get("MPITEST_GRACE", "60"))


def main() -> int:
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    label = os.environ.get("MPITEST_LABEL", f"n{comm.Get_size()}")
    log = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".logs", f"{label}.rank{rank}.log")
    terminal = os.dup(2)
    if rank:
        os.makedirs(os.path.dirname(log), exist_ok=True)
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    code = int(pytest.main(sys.argv[1:] + ["-p", "no:cacheprovider"]))
    sys.stdout.flush()
    sys.stderr.flush()
    if code == pytest.ExitCode.NO_TESTS_COLLECTED and rank == 0:  # a wrong path or selection: not a pass
        os.write(terminal, f"rank {rank}: no tests were collected (pytest exit {code}): a failure\n".encode())
    if rank and code:
        with open(log, "rb") as f:
            os.write(terminal, f"\n--- rank {rank} failed (exit {code}); its log {log}:\n".encode() + f.read())
    request = comm.Ibarrier()
    deadline = time.monotonic() + GRACE
    while not request.Test():
        if time.monotonic() > deadline:
            os.write(terminal, f"rank {rank}: other ranks did not finish within {GRACE:g} s; "
                               f"aborting the job\n".encode())
            comm.Abort(code or 1)
        time.sleep(0.01)
    return code


if __name__ == "__main__":
    sys.exit(main())
