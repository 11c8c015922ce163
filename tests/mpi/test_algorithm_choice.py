"""``algorithm="auto"`` picks flat or hierarchical per buffer by the cost model (choice.py): results equal
NumPy whichever it picks, every rank picks the same, the timeline names the pick, and a rank whose
inputs to the rule differ is reported on every rank."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

import mpidist
from mpidist.collectives import algorithms, timeline
from mpidist.errors import CollectiveMismatchError
from reference import assert_same, make, reduce_all

pytestmark = [pytest.mark.mpi, pytest.mark.node_layout]

# buffers of 4 B ... 4 MB (float32 elements)
COUNTS = [1, 1000, 65_536, 300_001, 1 << 20]
# the model with its defaults, more NICs, no agreement, and the fixed rule (0: always hierarchical
# on multi-node jobs; 64 KiB: some buffers each way)
SETTINGS = [dict(), dict(nics_per_node=8), dict(check_agreement=False), dict(hierarchical_threshold=0),
            dict(hierarchical_threshold=64 << 10)]


def _run_traced(comm, directory, settings, body):
    """``body(engine)`` on a fresh engine with the timeline on; this rank's collective spans."""
    engine = mpidist.Engine(comm)
    try:
        with mpidist.rc.override(timeline=os.path.join(directory, "trace.json"), **settings):
            body(engine)
            path = timeline.recorder().path
        assert timeline.recorder() is None  # reading the setting again closes the file
    finally:
        engine.close()
    with open(path, encoding="utf-8") as f:
        return [e for e in json.load(f) if e.get("cat") == "collective"]


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()) or "model")
def test_auto_equals_numpy_and_names_its_choice(comm, shared_dir, settings):
    results, expected_names, seen = {}, [], {}

    def body(engine):
        seen["multi_node"] = engine.topology.multi_node
        for count in COUNTS:
            expected_names.append(algorithms.auto_name(engine.topology, count * 4))
            results[count] = engine.allreduce(make(engine.rank, np.float32, (count,)), "sum")

    spans = _run_traced(comm, shared_dir, settings, body)
    for count in COUNTS:
        assert_same(results[count], reduce_all([make(r, np.float32, (count,)) for r in range(comm.size)], "sum"))
    got = [s["args"]["algorithm"] for s in spans]
    assert got == expected_names
    assert all(s["args"]["chosen_by"].startswith("auto: ") for s in spans)
    assert comm.allgather(got) == [got] * comm.size  # every rank chose the same
    if settings.get("hierarchical_threshold") == 0:  # the fixed rule from 0 bytes: hierarchical where it can be
        assert set(got) == {"hierarchical" if seen["multi_node"] else "flat"}


def test_explicit_algorithm_wins_and_is_recorded(comm, shared_dir):
    x = make(comm.rank, np.float64, (5000,))
    results = {}

    def body(engine):
        for name in ("flat", "hierarchical"):
            results[name] = engine.allreduce(x, "sum", algorithm=name)

    spans = _run_traced(comm, shared_dir, dict(hierarchical_threshold=0), body)
    assert [s["args"]["algorithm"] for s in spans] == ["flat", "hierarchical"]
    assert not any("chosen_by" in s["args"] for s in spans)
    expected = reduce_all([make(r, np.float64, (5000,)) for r in range(comm.size)], "sum")
    for name in ("flat", "hierarchical"):
        assert_same(results[name], expected)


@pytest.mark.parametrize("name,mine,others,match", [
    ("nics_per_node", 2, 1, r"algorithm=auto\(by cost, nics_per_node=2\)"),
    ("hierarchical_threshold", 1 << 20, None, r"algorithm=auto\(hierarchical_threshold=1048576\)"),
])
def test_a_rank_with_other_inputs_to_auto_is_reported_everywhere(comm, engine, name, mine, others, match):
    """The settings auto's choice reads are agreed on: a rank that differs fails on every rank, with
    its value in the message (at one rank there is nobody to differ from: the call succeeds)."""
    x = make(comm.rank, np.float32, (300_001,))
    expected = reduce_all([make(r, np.float32, (300_001,)) for r in range(comm.size)], "sum")
    with mpidist.rc.override(**{name: mine if comm.rank == 0 else others}):
        if comm.size == 1:
            assert_same(engine.allreduce(x, "sum"), expected)
            return
        with pytest.raises(CollectiveMismatchError, match=match):
            engine.allreduce(x, "sum")
    assert_same(engine.allreduce(x, "sum"), expected)  # the job goes on in step
