"""The timeline (rc.timeline / MPIDIST_TIMELINE): one trace per rank, every collective with its phases."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

import mpidist
from mpidist.collectives import timeline


def _record(comm, directory, body):
    """Run ``body(engine)`` with the timeline on; return this rank's events."""
    engine = mpidist.Engine(comm)
    try:
        with mpidist.rc.override(timeline=os.path.join(directory, "trace.json")):
            body(engine)
            path = timeline.recorder().path
        # leaving the override closes the file once the setting is read again
        assert timeline.recorder() is None
    finally:
        engine.close()
    assert path == os.path.join(directory, f"trace.rank{comm.rank}.json")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _collectives(events):
    return [e for e in events if e.get("cat") == "collective"]


def _phases_of(events, span):
    start, end = span["ts"], span["ts"] + span["dur"]
    return [e for e in events if e.get("cat") == "phase" and e["tid"] == span["tid"]
            and e["ts"] >= start - 0.01 and e["ts"] + e["dur"] <= end + 0.01]


def test_every_collective_is_one_span_with_its_phases(comm, shared_dir):
    x = np.arange(1000, dtype=np.float32)
    nest = {"a": x, "b": [np.ones(3, np.int64), np.full(7, 2.0)]}

    def body(engine):
        engine.allreduce(x)
        engine.allreduce(x)          # a repeat: would take the cached fast path without the timeline
        engine.allreduce(nest, op="mean")
        engine.broadcast(x, root=comm.size - 1)
        engine.allgather(x[: comm.rank + 1])
        engine.reduce(x, root=0)
        engine.reduce_scatter(x)

    events = _record(comm, shared_dir, body)
    spans = _collectives(events)
    assert [s["name"] for s in spans] == ["allreduce", "allreduce", "allreduce", "broadcast", "allgather",
                                          "reduce", "reduce_scatter"]
    assert spans[0]["args"]["bytes"] == x.nbytes and spans[0]["args"]["op"] == "SUM"
    assert spans[2]["args"]["leaves"] == 3 and spans[2]["args"]["op"] == "MEAN"
    assert spans[3]["args"]["root"] == comm.size - 1
    assert all(s["pid"] == comm.rank for s in events)
    for span in spans:
        phases = _phases_of(events, span)
        names = [p["name"] for p in phases]
        assert names[0] == "prepare" and names[1] == "agreement", names
        transfers = [p for p in phases if p["name"] == "transfer"]
        assert len(transfers) == span["args"]["transfers"] >= 1
        assert all(p["args"]["ranks"] in (comm.size, *range(1, comm.size + 1)) for p in transfers)
        # phases follow each other without overlap, inside the collective's span
        for a, b in zip(phases, phases[1:]):
            assert a["ts"] + a["dur"] <= b["ts"] + 0.01
    # the nest's three dtypes travel in three packs
    nest_transfers = [p for p in _phases_of(events, spans[2]) if p["name"] == "transfer"]
    assert sum(p["args"]["bytes"] for p in nest_transfers) >= x.nbytes + 3 * 8 + 7 * 8
    # the process and the engine's track are named
    meta = {e["name"]: e["args"] for e in events if e["ph"] == "M" and e["tid"] in (0, spans[0]["tid"])}
    assert meta["process_name"]["name"].startswith(f"rank {comm.rank} ")
    assert f"{comm.size} ranks" in meta["thread_name"]["name"]


@pytest.mark.node_layout  # the steps depend on the nodes
def test_hierarchical_steps_are_named(comm, shared_dir):
    """With the hierarchical algorithm the node and leaders steps show as separate transfers."""
    x = np.ones(4096, dtype=np.float32)
    seen = {}

    def body(engine):
        topo = engine.topology
        seen.update(nodes=topo.num_nodes, local_size=topo.local_size, leader=topo.local_rank == 0)
        engine.allreduce(x, algorithm="hierarchical")

    events = _record(comm, shared_dir, body)
    span, = _collectives(events)
    steps = [(p["args"]["mpi"], p["args"]["ranks"]) for p in _phases_of(events, span) if p["name"] == "transfer"]
    # reduce inside the node, allreduce among the node leaders (leaders only), broadcast inside the node
    expected = [("Reduce", seen["local_size"])]
    if seen["leader"] and seen["nodes"] > 1:
        expected.append(("Allreduce", seen["nodes"]))
    expected.append(("Bcast", seen["local_size"]))
    assert steps == expected


def test_results_do_not_change_and_off_means_no_file(comm, shared_dir):
    x = np.arange(10, dtype=np.float64) + comm.rank
    results = {}

    def body(engine):
        results["on"] = engine.allreduce(x)

    _record(comm, shared_dir, body)
    engine = mpidist.Engine(comm)
    try:
        assert timeline.recorder() is None
        np.testing.assert_array_equal(results["on"], engine.allreduce(x))
    finally:
        engine.close()
    comm.Barrier()
    assert sorted(os.listdir(shared_dir)) == sorted(f"trace.rank{r}.json" for r in range(comm.size))
