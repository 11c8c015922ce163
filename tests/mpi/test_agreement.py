"""Ranks that issue different collectives get a clear error on every rank, never a hang."""
from __future__ import annotations

import time

import numpy as np
import pytest

import mpidist
from mpidist.errors import CollectiveMismatchError

pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.two_nodes]


def raises_everywhere(comm, fn, *patterns):
    """``fn`` must raise CollectiveMismatchError on this rank; all ranks check the same."""
    start = time.monotonic()
    with pytest.raises(CollectiveMismatchError) as info:
        fn()
    elapsed = time.monotonic() - start
    message = str(info.value)
    for pattern in patterns:
        assert pattern in message, message
    # every rank raised, with the same report (each names its own call first)
    report = message.split(": ", 1)[1]
    assert comm.allgather(report) == [report] * comm.Get_size()
    assert elapsed < 30  # bounded: no hang (the documented figure is well under a second)
    return message


def test_shape_mismatch(engine, comm):
    x = np.zeros(3 if engine.rank == 0 else 4, dtype=np.float32)
    msg = raises_everywhere(comm, lambda: engine.allreduce(x), "rank 0: allreduce(op=SUM, leaves=[float32(3,)]")
    assert "float32(4,)" in msg
    # the engine is still usable afterwards
    assert engine.allreduce(np.ones(2))[0] == engine.size


def test_dtype_mismatch(engine, comm):
    x = np.zeros(3, dtype=np.float32 if engine.rank else np.float64)
    raises_everywhere(comm, lambda: engine.allreduce(x), "float64(3,)", "float32(3,)")


def test_op_mismatch(engine, comm):
    raises_everywhere(comm, lambda: engine.allreduce(np.ones(2), "max" if engine.rank == 1 else "sum"),
                      "rank 1: allreduce(op=MAX", "op=SUM")


def test_root_mismatch(engine, comm):
    root = 1 if engine.rank == 1 else 0
    raises_everywhere(comm, lambda: engine.broadcast(np.ones(2), root=root), "root=0", "rank 1: broadcast(root=1")


def test_structure_mismatch(engine, comm):
    value = {"a": np.ones(2), "b": np.ones(2)} if engine.rank else [np.ones(2), np.ones(2)]
    raises_everywhere(comm, lambda: engine.allreduce(value), "structure={'a':*,'b':*}")


def test_different_collectives(engine, comm):
    def call():
        if engine.rank == 0:
            return engine.allgather(np.ones(2))
        return engine.allreduce(np.ones(2))
    raises_everywhere(comm, call, "rank 0: allgather(", "allreduce(op=SUM")


def test_settings_mismatch(engine, comm):
    raises_everywhere(comm, lambda: engine.allreduce([np.ones(2)] * 3, num_packs=1 if engine.rank else 2),
                      "num_packs=1", "num_packs=2")


def test_ragged_allgather_is_not_a_mismatch(engine):
    out = engine.allgather(np.ones((engine.rank + 1, 2)))
    assert out.shape == (engine.size * (engine.size + 1) // 2, 2)


def test_agreement_can_be_switched_off(engine):
    with mpidist.rc.override(check_agreement=False):
        assert engine.allreduce(np.ones(3))[0] == engine.size


def test_mismatch_after_cached_calls(engine, comm):
    """Ranks on the cached fast path (repeat calls) still meet and report a mismatch."""
    for _ in range(2):
        engine.allreduce(np.ones(5, dtype=np.float32))
    x = np.ones(5 if engine.rank else 6, dtype=np.float32)  # rank 0 changes shape; others repeat
    raises_everywhere(comm, lambda: engine.allreduce(x), "rank 0: allreduce(op=SUM, leaves=[float32(6,)]")


def test_mismatch_after_cached_list_calls(engine, comm):
    """Ranks on the cached list path meet the general path's agreement and report a mismatch."""
    value = [np.ones(5, dtype=np.float32), np.ones(3, dtype=np.float32)]
    for _ in range(2):
        engine.allreduce(value)
    if engine.rank == 0:
        value = [np.ones(5, dtype=np.float32), np.ones(4, dtype=np.float32)]
    raises_everywhere(comm, lambda: engine.allreduce(value),
                      "rank 0: allreduce(op=SUM, leaves=[float32(5,), float32(4,)]")
