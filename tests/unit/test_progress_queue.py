"""The progress worker's queue (collectives/progress.py) without MPI collectives: items are plain
functions, so order, errors, waiting and closing are checked exactly, with no timing assumptions."""
from __future__ import annotations

import threading
import types

import pytest

from mpidist.collectives import progress


def _pipeline():
    return types.SimpleNamespace(rank=0, pending=None, progress=None)


def test_items_run_in_submission_order_on_one_other_thread():
    pipeline = _pipeline()
    worker = progress.worker(pipeline)
    assert progress.worker(pipeline) is worker and not worker.alive  # started by the first submission
    release, seen = threading.Event(), []
    first = worker.submit(release.wait, "held")
    assert pipeline.pending is worker and worker.busy
    started = [worker.submit(lambda k=k: seen.append((k, threading.get_ident())) or k, f"item {k}") for k in range(50)]
    assert not any(p.done() for p in started)
    release.set()
    assert [p.wait() for p in started] == list(range(50))
    assert first.wait() is True
    assert [k for k, _ in seen] == list(range(50))
    assert {t for _, t in seen} != {threading.get_ident()} and len({t for _, t in seen}) == 1
    progress.wait_idle(pipeline)
    assert pipeline.pending is None and not worker.busy
    worker.close()
    assert not worker.alive


def test_an_error_is_raised_at_wait_and_the_next_item_runs():
    pipeline = _pipeline()
    worker = progress.worker(pipeline)

    def fail():
        raise KeyError("boom")
    bad, good = worker.submit(fail, "bad"), worker.submit(lambda: 7, "good")
    with pytest.raises(KeyError, match="boom"):
        bad.wait()
    assert good.wait() == 7 and "failed" in repr(bad) and "done" in repr(good)
    worker.close()


def test_close_runs_what_is_queued_then_refuses():
    pipeline = _pipeline()
    worker = progress.worker(pipeline)
    release = threading.Event()
    held = worker.submit(release.wait, "held")
    rest = [worker.submit(lambda k=k: k, "item") for k in range(5)]
    closer = threading.Thread(target=worker.close)
    closer.start()
    release.set()
    closer.join()
    assert held.wait() is True and [p.wait(timeout=0) for p in rest] == list(range(5))
    with pytest.raises(RuntimeError, match="item: the engine's progress thread was stopped"):
        worker.submit(lambda: 0, "item")


def test_wait_timeout():
    pipeline = _pipeline()
    worker = progress.worker(pipeline)
    release = threading.Event()
    held = worker.submit(release.wait, "held")
    with pytest.raises(TimeoutError, match="Pending.wait: held has not finished after 0 s"):
        held.wait(timeout=0)
    for bad in (-1, "1", True):
        with pytest.raises(ValueError, match="Pending.wait: `timeout` must be None or a number >= 0"):
            held.wait(timeout=bad)
    release.set()
    assert held.wait(timeout=None) is True
    worker.close()


def test_without_thread_multiple_items_run_at_submission(monkeypatch):
    monkeypatch.setattr(progress, "threads_supported", lambda: False)
    pipeline = _pipeline()
    worker = progress.worker(pipeline)
    here = threading.get_ident()
    pending = worker.submit(threading.get_ident, "here")
    assert pending.done() and pending.wait() == here and not worker.alive and pipeline.pending is None
