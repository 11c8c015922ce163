"""Speculative agreement: a repeat of the previous collective's signature moves its data while the
agreement exchange completes (collectives/agreement.py). A mismatch must still raise on every rank
before any result is returned, whichever ranks speculated, and never hang; the communicator must
stay usable. Results must equal a NumPy reference on every path and at every size class.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from reference import make, reduce_all
from test_agreement import raises_everywhere

import mpidist
from mpidist.collectives import timeline

MB = 1 << 20


# -- a mismatch after repeats: on every rank, whichever ranks speculated ---------------------------

CHANGES = {  # what the changing rank does instead of repeating the float32 (N,) SUM
    "shape": lambda engine, x: engine.allreduce(x[:-1]),
    "dtype": lambda engine, x: engine.allreduce(x.astype(np.float64)),
    "op": lambda engine, x: engine.allreduce(x, "max"),
    "collective": lambda engine, x: engine.broadcast(x),
    "nest": lambda engine, x: engine.allreduce([x, x]),
}


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("change", sorted(CHANGES))
@pytest.mark.parametrize("changer", ["first", "last", "all but first"])
@pytest.mark.parametrize("threshold", [0, 1 << 40], ids=["iallreduce", "allreduce"])
def test_mismatch_after_repeats_raises_everywhere_and_the_comm_stays_usable(engine, comm, rc_settings, change,
                                                                           changer, threshold):
    rc_settings(iallreduce_threshold=threshold)  # the speculated data calls: non-blocking or blocking
    x = np.ones(1000, dtype=np.float32)
    for _ in range(3):  # the steady state: every rank speculates on the repeats
        assert engine.allreduce(x)[0] == engine.size
    changes = {"first": engine.rank == 0, "last": engine.rank == engine.size - 1,
               "all but first": engine.rank != 0}[changer]
    call = (lambda: CHANGES[change](engine, x)) if changes else (lambda: engine.allreduce(x))
    raises_everywhere(comm, call, "ranks issued different collectives")
    # usable afterwards, and the repeats (speculating again) still give the right results
    for _ in range(3):
        assert engine.allreduce(x * (engine.rank + 1)).tolist() == [engine.size * (engine.size + 1) / 2] * 1000


@pytest.mark.mpi(min_size=2)
def test_mismatch_on_the_cached_list_path_after_repeats(engine, comm, rc_settings):
    """Two packs (packs of 64 KiB: the leaf of 80 KB travels alone): the ranks that did not speculate
    replay both."""
    rc_settings(bytes_per_pack=64 * 1024)  # automatic packing would fuse both leaves into one pack
    value = [np.ones(20000, dtype=np.float32), np.ones(5, dtype=np.float32)]
    for _ in range(3):
        engine.allreduce(value)
    changed = [value[0], np.ones(6, dtype=np.float32)] if engine.rank == engine.size - 1 else value
    raises_everywhere(comm, lambda: engine.allreduce(changed), "float32(6,)")
    out = engine.allreduce(value)
    assert [o.tolist() for o in out] == [[engine.size] * 20000, [engine.size] * 5]


@pytest.mark.mpi(min_size=2)
def test_mismatch_after_repeats_under_a_deadline(engine, comm):
    """The general path (a deadline: no cached fast path) speculates too, and still raises everywhere."""
    x = np.ones(64, dtype=np.float64)
    for _ in range(3):
        assert engine.allreduce(x, timeout_seconds=30)[0] == engine.size
    y = x[:10] if engine.rank == 0 else x
    raises_everywhere(comm, lambda: engine.allreduce(y, timeout_seconds=30), "float64(10,)", "float64(64,)")
    assert engine.allreduce(x, timeout_seconds=30)[0] == engine.size
    assert engine.broken is None


@pytest.mark.mpi(min_size=2)
def test_threshold_differing_between_ranks_is_a_mismatch(engine, comm, rc_settings):
    """Allreduce and Iallreduce never match each other in MPI: the setting is part of the agreement."""
    rc_settings(iallreduce_threshold=0 if engine.rank == 0 else 1 << 40)
    raises_everywhere(comm, lambda: engine.allreduce(np.ones(4)), "iallreduce_threshold=0")


# -- results equal to the NumPy reference ----------------------------------------------------------

@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("nbytes", [MB, 4 * MB])
def test_results_equal_the_reference_on_every_path(comm, rc_settings, nbytes):
    """1 MB under the Iallreduce threshold and 4 MB over it (2 MB here), through the engine,
    strategy.reduce and the replica context, each repeated (the speculative steady state)."""
    rc_settings(iallreduce_threshold=2 * MB)
    shape = (nbytes // 4,)
    x = make(comm.Get_rank(), np.float32, shape)  # small integers: every summation order is exact
    inputs = [make(r, np.float32, shape) for r in range(comm.Get_size())]
    want = {"sum": reduce_all(inputs, "sum"), "mean": reduce_all(inputs, "mean")}
    with mpidist.rc.override(framework="numpy"):
        strategy = mpidist.MultiWorkerMirroredStrategy()
    engine = strategy.extended.engine
    try:
        paths = {"engine": ("sum", lambda: engine.allreduce(x)),
                 "reduce": ("sum", lambda: strategy.reduce("sum", x, axis=None)),
                 "replica": ("sum", lambda: strategy.run(lambda: mpidist.get_replica_context().all_reduce("sum", x))),
                 "mean": ("mean", lambda: strategy.reduce("mean", x, axis=None)),
                 "deadline": ("sum", lambda: engine.allreduce(x, timeout_seconds=60)),
                 "list": ("sum", lambda: np.concatenate(engine.allreduce([x[:10], x[10:]])))}
        for name, (op, path) in paths.items():
            for _ in range(3):
                got = path()
                assert got.dtype == np.float32, name
                if op == "sum":
                    assert np.array_equal(got, want[op]), name
                else:  # the engine divides in float32, the reference in float64: one rounding apart
                    np.testing.assert_allclose(got, want[op], rtol=1e-6, err_msg=name)
    finally:
        strategy.close()


# -- the speculative path is taken, and shows on the timeline --------------------------------------

@pytest.mark.mpi(min_size=2)
def test_repeats_speculate_and_the_timeline_says_so(comm, tmp_path_factory):
    path = comm.bcast(str(tmp_path_factory.mktemp("spec") / "trace.json") if comm.Get_rank() == 0 else None)
    engine = mpidist.Engine()
    x = np.ones(100, dtype=np.float32)
    try:
        with mpidist.rc.override(timeline=path):
            for _ in range(3):
                assert engine.allreduce(x)[0] == engine.size
            engine.broadcast(x)
            with mpidist.rc.override(iallreduce_threshold=0):  # every flat allreduce: Iallreduce + wait
                assert engine.allreduce(x)[0] == engine.size
        assert timeline.recorder() is None  # reading the setting again closes the file
    finally:
        engine.close()
    with open(timeline.rank_path(path, comm.Get_rank()), encoding="utf-8") as f:
        events = json.load(f)
    spans = [e for e in events if e.get("cat") == "collective"]
    notes = [(e["name"], e["args"].get("agreement")) for e in spans]
    assert [n for n, _ in notes] == ["allreduce"] * 3 + ["broadcast", "allreduce"]
    # the first of a signature, another collective, a changed setting (another signature): no speculation
    assert notes[0][1] is None and notes[3][1] is None and notes[4][1] is None
    assert all(a is not None and a.startswith("speculative") for _, a in notes[1:3])
    transfers = [e["args"]["mpi"] for e in events if e.get("name") == "transfer"]
    assert transfers == ["Allreduce"] * 3 + ["Bcast", "Iallreduce"]


# -- a random walk of repeats, new signatures and mismatches ---------------------------------------

@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("seed", [1, 2])
def test_random_walk_of_repeats_changes_and_mismatches(engine, comm, rc_settings, seed):
    """Every step: all ranks repeat the last call (mostly), or all move to a new one, or one rank
    deviates. Deviations must raise on every rank; every other step must give the exact result."""
    rng = np.random.default_rng(seed)  # the same draws on every rank
    rc_settings(iallreduce_threshold=2048)  # both MPI calls in play: arrays of 256-4096 bytes
    sizes, ops = [64, 300, 1024], ["sum", "max"]
    size, op, as_list = 300, "sum", False
    for step in range(60):
        draw = rng.random()
        if 0.7 <= draw < 0.85:  # all ranks move to a new signature
            size, op, as_list = int(rng.choice(sizes)), str(rng.choice(ops)), bool(rng.random() < 0.3)
        deviant = int(rng.integers(engine.size)) if draw >= 0.85 else None
        how = int(rng.integers(3))
        x = make(engine.rank, np.float32, (size,), seed=step)
        value = [x[:10], x[10:]] if as_list else x

        def call(value=value, op=op):
            if engine.rank != deviant:
                return engine.allreduce(value, op)
            return [lambda: engine.allreduce(x[:-1], op), lambda: engine.allreduce(value, "min"),
                    lambda: engine.broadcast(x)][how]()

        if deviant is not None:
            raises_everywhere(comm, call, "ranks issued different collectives")
            continue
        got = call()
        got = np.concatenate(got) if as_list else got
        want = reduce_all([make(r, np.float32, (size,), seed=step) for r in range(engine.size)], op)
        assert np.array_equal(got, want), (step, size, op, as_list)


@pytest.mark.mpi(min_size=1)
def test_no_speculation_when_the_data_steps_differ_from_the_prediction(engine, monkeypatch):
    """The recipe a rank would replay is predicted before the data moves and checked against the
    steps actually issued; a difference (a new data path the prediction does not know) turns
    speculation off for that signature instead of leaving a wrong replay in place."""
    from mpidist.collectives import allreduce
    x = np.ones(64, dtype=np.float32)
    with mpidist.rc.override(timeout_seconds=60):  # the general path (no cached fast path)
        assert engine.allreduce(x)[0] == engine.size
        h = engine.pipeline.agreement.last[0]
        assert engine.pipeline.agreement.speculates(h)  # predicted == issued
        engine.allreduce(np.ones(3))  # another signature in between: the next call agrees first again
        predicted = allreduce.recipe
        monkeypatch.setattr(allreduce, "recipe", lambda ctx, arrays, op: tuple(
            (wire, count + 1, mop, posted) for wire, count, mop, posted in predicted(ctx, arrays, op)))
        assert engine.allreduce(x)[0] == engine.size
        assert engine.pipeline.agreement.last[0] == h and not engine.pipeline.agreement.speculates(h)
        assert engine.allreduce(x)[0] == engine.size  # still right, agreeing first
