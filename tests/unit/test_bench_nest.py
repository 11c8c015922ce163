"""The benches' nest rows (one process: an MPI world of one) and their timing rules: a case without
settings leaves ``mpidist.rc`` untouched, so the engine's cached calls survive from block to block."""
from __future__ import annotations

import numpy as np
from mpi4py import MPI

import mpidist
from mpidist.bench import paths, summary, timing
from mpidist.collectives import Engine


def test_blocks_without_settings_keep_the_engines_cached_calls():
    engine = Engine(local_size=1)
    leaves = [np.ones(4, np.float32) for _ in range(3)]
    engine.allreduce(leaves)
    generation = mpidist.rc.generation
    timing.samples(MPI.COMM_WORLD, {"a": lambda: engine.allreduce(leaves)}, 0.01)
    assert mpidist.rc.generation == generation  # no settings change: the cache entry is still valid
    assert engine.pipeline.fast.lookup("sum", leaves) is not None

    def off():
        return engine.allreduce(leaves)
    off.settings = {"check_agreement": False}  # type: ignore[attr-defined]
    timing.samples(MPI.COMM_WORLD, {"a": lambda: engine.allreduce(leaves), "off": off}, 0.01)
    assert engine.pipeline.fast.lookup("sum", leaves) is not None  # rebuilt after the block with settings
    engine.close()


def test_summary_nest_row_times_every_path_against_hand_packed_raw():
    rows = summary.run([], 3, 0.02)
    (row,) = rows
    assert row["case"] == "3 x 4 KB nest"
    assert sorted(row["per raw"]) == ["mpidist", "replica all_reduce", "strategy.reduce"]
    assert all(row[name] > 0 for name in ("raw", "raw, separate calls", "mpidist", "strategy.reduce",
                                          "replica all_reduce"))
    assert "time / hand-fused raw" in summary.table(rows, 1)


def test_paths_nest_row():
    (row,) = paths.run([], 0.02, None, nest=3)
    assert row["size"] == "3x4KB" and row["bytes"] == 3 * 4096
    assert sorted(row["median"]) == sorted(["raw Allreduce", "raw Iallreduce", "engine", "reduce", "replica"])
    assert row["ratio"]["raw Allreduce"] == 1.0
