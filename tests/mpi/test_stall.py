"""Stall reports without storms: a collective that some ranks have not entered, after
``rc.stall_seconds``, gives one report, on the chief, naming the ranks not in it and where they are,
for at most 3 (N - 1) messages in all (counted by every rank's monitor); a long collective that every
rank is inside gives none. (The report under a real mpirun, the abort, and the same count at 8 ranks
on 4 fake nodes, where the job then goes on, aborts or times out: tests/launch/test_stall_jobs.py.)"""
from __future__ import annotations

import logging
import re
import time

import numpy as np
import pytest

import mpidist

pytestmark = pytest.mark.mpi
STALL_SECONDS = 1.0
CAP = 60.0  # a wait for the monitors that would mean a bug (the test then fails on its assertions)


class _Log(logging.Handler):
    """The stall reports (and, at debug level, the monitor's other lines) this rank logs."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.reports: list[str] = []
        self.quiet: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if text.startswith("mpidist: stall:"):
            self.reports.append(text)
        elif "every rank inside it" in text:
            self.quiet.append(text)


@pytest.fixture
def log():
    logger = logging.getLogger("mpidist")
    handler, level = _Log(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


@pytest.fixture
def monitored(rc_settings):
    """A fresh engine (its monitor's message count starts at 0) with a 1 s stall threshold."""
    rc_settings(stall_seconds=STALL_SECONDS, stall_abort_seconds=None)
    engine = mpidist.Engine()
    if engine.pipeline.monitor is None:
        engine.close()
        pytest.skip("no stall monitor: the MPI library does not give MPI_THREAD_MULTIPLE")
    yield engine
    engine.close()


def _wait(condition, cap: float = CAP) -> None:
    deadline = time.monotonic() + cap
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)  # (sleeping releases the GIL: the monitor thread runs)


@pytest.mark.parametrize("late_one", ["last", "chief"])
def test_a_late_rank_gives_one_report_for_linear_messages(comm, monitored, log, late_one):
    engine, monitor = monitored, monitored.pipeline.monitor
    rank, size = engine.rank, engine.size
    late = size - 1 if late_one == "last" else 0
    engine.allreduce(np.ones(2))  # every rank here once
    if rank == late:
        if size == 1:
            time.sleep(2 * STALL_SECONDS)
        elif rank == 0:  # the chief is late (a chief-only evaluation): its monitor still gathers
            _wait(lambda: log.reports)
        else:  # busy in user code until the chief's question has been answered
            _wait(lambda: monitor.messages >= 1)
    total = engine.allreduce(np.full(3, rank + 1.0))
    np.testing.assert_array_equal(total, np.full(3, size * (size + 1) / 2))
    if rank == 0 and size > 1:
        _wait(lambda: log.reports)  # the last answer may reach the chief after the collective ended
    counts = comm.allgather((monitor.messages, list(log.reports)))
    messages = sum(m for m, _ in counts)
    reports = [(r, text) for r, (_, texts) in enumerate(counts) for text in texts]
    if size == 1:
        assert messages == 0 and reports == []  # one rank waits for nobody
        return
    assert 2 * (size - 1) <= messages <= 3 * (size - 1), counts
    assert len(reports) == 1 and reports[0][0] == 0, reports  # one report, on the chief
    text = reports[0][1]
    waiting = 1 if late == 0 else 0
    assert re.match(rf"mpidist: stall: allreduce #\d+ on rank {waiting} has waited \d+ s \(called at .*test_stall.py:"
                    rf"\d+ .*\); ranks not in it: {late}\n", text), text
    assert re.search(rf"\n  rank {late}: last finished allreduce #\d+, at .*test_stall.py:\d+ \(_wait\)", text), text
    assert text.count("\n") == 1, text  # the one late rank's line, no other


def test_a_long_collective_every_rank_is_inside_gives_no_report(comm, monitored, log):
    """Every rank inside the same collective past the threshold (a long one, not a stall): the chief
    gathers once and logs no report."""
    engine, monitor = monitored, monitored.pipeline.monitor
    engine.allreduce(np.ones(2))
    monitor.enter("allreduce")  # what the engine records for a collective, held here past the threshold
    try:
        if engine.size == 1:
            time.sleep(2 * STALL_SECONDS)
        elif engine.rank == 0:
            _wait(lambda: log.quiet)
        else:  # its notice, then its answer
            _wait(lambda: monitor.messages >= 2)
    finally:
        monitor.leave()
    counts = comm.allgather((monitor.messages, list(log.reports), len(log.quiet)))
    assert all(not reports for _, reports, _ in counts), counts
    if engine.size > 1:
        assert [quiet for _, _, quiet in counts] == [1] + [0] * (engine.size - 1), counts
        assert sum(m for m, _, _ in counts) == 3 * (engine.size - 1), counts
    engine.allreduce(np.ones(2))  # the ranks are still in step
