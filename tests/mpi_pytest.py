"""Run pytest on every rank of an MPI job (used by tests/run).

Rank 0 reports to the terminal; rank N writes to tests/.logs/<label>.rank<N>.log, which is
printed if that rank fails. Exit 5 (no tests collected) is a failure, as any non-zero exit. When a
rank has finished, it waits up to GRACE seconds for the others (non-blocking barrier); if they do
not arrive, it aborts the job so that no rank is left waiting in a collective forever.

A failure on a rank other than 0 is written to the terminal as soon as it happens. A test that
runs longer than MPITEST_TEST_TIMEOUT seconds (default 300) is taken as hung: its rank
writes the test's name and every thread's stack to the terminal, appends one line (rank, test, the
innermost mpidist and test frames of the main thread) to MPITEST_HANG_REPORT when that is set
(tests/run puts those lines in its summary, so a hang in CI is named in the last lines it prints),
waits MPITEST_DUMP_GRACE seconds (default 20) so the other ranks stuck with it can do the same,
and aborts the job.
"""
from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
import traceback

from mpi4py import MPI
import pytest

GRACE = float(os.environ.get("MPITEST_GRACE", "60"))
TEST_TIMEOUT = float(os.environ.get("MPITEST_TEST_TIMEOUT", "300"))
DUMP_GRACE = float(os.environ.get("MPITEST_DUMP_GRACE", "20"))


def where(frame) -> str:
    """The innermost frames of ``frame``'s stack in mpidist and in the tests, as ``file:line in f``."""
    found: dict[str, str] = {}
    for summary in reversed(traceback.extract_stack(frame)):
        path = summary.filename.replace(os.sep, "/")
        for part in ("mpidist/", "tests/"):
            if part in path and part not in found:
                found[part] = f"{part}{path.rsplit(part, 1)[1]}:{summary.lineno} in {summary.name}"
    return "; ".join(found[p] for p in ("mpidist/", "tests/") if p in found) or "no mpidist or test frame"


class Watchdog:
    """pytest plugin: a failure on a rank other than 0 printed at once, and the hang report and
    abort described in the module's docstring."""

    def __init__(self, rank: int, terminal: int, limit: float) -> None:
        self.rank, self.terminal, self.limit = rank, terminal, limit

    def pytest_runtest_logreport(self, report):
        """A failure on a rank other than 0 is written to the terminal at once: a rank that failed
        may have left the others in a collective it never entered, and then the job ends by the
        time limit, before that rank's log is printed."""
        if self.rank and report.failed:
            captured = "".join(f"{'-' * 20} {name}\n{text}\n" for name, text in report.sections)
            os.write(self.terminal, f"\n--- rank {self.rank}: {report.nodeid} failed ({report.when}):\n"
                                    f"{report.longreprtext}\n{captured}".encode())

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        if self.limit <= 0:
            yield
            return
        timer = threading.Timer(self.limit, self.expired, args=(item.nodeid,))
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()

    def expired(self, nodeid: str) -> None:
        main = sys._current_frames().get(threading.main_thread().ident)
        line = f"rank {self.rank}: {nodeid} still running after {self.limit:g} s, at " \
               f"{where(main) if main is not None else '?'}"
        os.write(self.terminal, f"\n{line}; every thread's stack:\n".encode())
        faulthandler.dump_traceback(file=self.terminal, all_threads=True)
        report = os.environ.get("MPITEST_HANG_REPORT")
        if report:
            with open(report, "a") as f:
                f.write(line + "\n")
        time.sleep(DUMP_GRACE)
        os.write(self.terminal, f"rank {self.rank}: aborting the job (MPITEST_TEST_TIMEOUT)\n".encode())
        MPI.COMM_WORLD.Abort(1)


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
    plugins = [Watchdog(rank, terminal, TEST_TIMEOUT)]
    code = int(pytest.main(sys.argv[1:] + ["-p", "no:cacheprovider"], plugins=plugins))
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
