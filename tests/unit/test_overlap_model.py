"""The overlap model (tools/costmodel/overlap.py): the bucket rule it shares with the TF bridge,
its schedule keeps the collectives' order and never beats max(compute, communication), and its CLI runs. Serial."""
from __future__ import annotations

import json
import pathlib
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from mpidist.collectives import packing  # noqa: E402
from mpidist.collectives.packing import backprop_buckets  # noqa: E402
from tools.costmodel import overlap  # noqa: E402
from tools.costmodel.__main__ import main as costmodel_main  # noqa: E402


@pytest.mark.parametrize("limit", [1, 100, 4096, 1 << 22, 1 << 40])
def test_backprop_buckets_close_before_the_entry_that_would_overflow_them(limit):
    """The one bucket rule (packing.backprop_buckets), which the TF bridge and this model share:
    contiguous index ranges from the end, each closed before the entry that would take it over the
    limit (the engine's pack rule walked backwards): a bucket holds at most ``limit`` bytes unless it
    is one entry, and it plus the next entry would not fit."""
    rng = np.random.default_rng(limit % 1000)
    for _ in range(50):
        sizes = [int(s) for s in rng.integers(1, 5000, size=rng.integers(1, 12))]
        got = backprop_buckets(sizes, limit)
        assert [i for b in reversed(got) for i in b] == list(range(len(sizes)))  # every index once, in order
        for k, b in enumerate(got):
            assert b == list(range(b[0], b[-1] + 1))
            held = sum(sizes[i] for i in b)
            assert held <= limit or len(b) == 1
            if k < len(got) - 1:  # the next bucket's last entry (added next) did not fit
                assert held + sizes[got[k + 1][-1]] > limit
        # the pack rule walked backwards: the engine's plan of the reversed list, where no entry fills a
        # pack by itself (the plan fuses small entries around such a one; a bucket must be contiguous)
        n = len(sizes)
        if max(sizes) < limit:
            assert got == [sorted(n - 1 - j for j in p) for p in packing.plan(sizes[::-1], [0] * n, limit, None)]
        assert backprop_buckets(sizes, None) == [list(range(len(sizes)))]
        assert backprop_buckets(sizes + [None], limit) == [list(range(len(sizes) + 1))]
    assert backprop_buckets([], limit) == []


@pytest.mark.parametrize("ranks", [2, 64, 512])
@pytest.mark.parametrize("preset", ["this-vm", "dgx-h100", "cpu-ib-hdr"])
def test_schedule(ranks, preset):
    p = overlap.simulate(overlap.BUILTIN, ranks, preset)
    starts = [b["start_ms"] for b in p.buckets]
    assert starts == sorted(starts)
    for a, b in zip(p.buckets, p.buckets[1:]):
        assert b["start_ms"] >= a["end_ms"]           # one collective at a time, in order
    for b in p.buckets:
        assert b["start_ms"] >= b["ready_ms"]          # never before its gradients exist
    assert p.floor_ms <= p.after_ms + 1e-9 <= p.before_ms + 1e-9
    # no overlap: the sum (one call costs about what the buckets do)
    assert p.before_ms == pytest.approx(p.compute_ms + p.comm_ms, rel=0.05)


def test_compute_rescaled_and_one_bucket_is_before():
    p = overlap.simulate(overlap.BUILTIN, 64, "dgx-h100", compute_ms=1.0)
    assert p.compute_ms == pytest.approx(1.0)
    whole = overlap.simulate(overlap.BUILTIN, 64, "dgx-h100", bucket_bytes=1 << 40)
    assert len(whole.buckets) == 1 and whole.after_ms == pytest.approx(whole.before_ms)
    with pytest.raises(ValueError, match="algorithm"):
        overlap.simulate(overlap.BUILTIN, 64, algorithm="nope")


def test_cli(capsys):
    assert costmodel_main(["overlap", "--ranks", "64", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"64"} and out["64"]["after / max(compute, comm)"] >= 1.0
