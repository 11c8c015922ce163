"""``python -m mpidist check`` in one process: the verdict rules (the worst rank's state, the ranks
named), the report, the exit status when a planted check is broken, --skip, the host reference."""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpidist
from mpidist import check
from mpidist.check import context, results
from mpidist.check.results import Outcome, broken, combine, missing, ok, skipped


def test_the_worst_state_of_any_rank_wins_and_names_the_ranks():
    v = combine("allgather", [ok("fine", "t0", 0.1), broken("off by one", fix="f"), ok("fine", "t2", 0.3)])
    assert (v.state, v.fix, v.timing) == ("broken", "f", None)
    assert v.detail == "on rank 1: off by one (the other ranks: fine)"
    v = combine("ULFM", [missing("not active", "use mpirun"), skipped("n/a"), missing("not active", "use mpirun")])
    assert (v.state, v.detail) == ("missing", "on ranks 0, 2: not active (the other ranks: n/a)")


def test_ok_everywhere_keeps_one_text_and_the_slowest_ranks_timing():
    v = combine("allreduce", [ok("equal", "1 ms", 0.001), ok("equal", "3 ms", 0.003), ok("equal", "2 ms", 0.002)])
    assert (v.state, v.detail, v.timing) == ("ok", "equal", "3 ms; slowest rank 1")
    assert combine("x", [ok("equal", "1 ms", 0.001)]).timing == "1 ms"  # one rank: no "slowest"
    v = combine("CuPy", [ok("GPU 0"), ok("GPU 1")])
    assert v.detail == "rank 0: GPU 0; rank 1: GPU 1"  # texts that differ: each rank's


def test_an_outcome_state_must_be_known():
    with pytest.raises(ValueError, match=r"Outcome: `state` must be one of ok, skipped, missing, broken, got 'fine'"):
        Outcome("fine", "x")


def test_report_lists_what_works_what_is_missing_with_the_fix_and_why_checks_were_skipped():
    verdicts = [combine("barrier", [ok("came", "barrier: 1 ms", 0.001)]),
                combine("ULFM", [missing("not active", "mpirun --with-ft ulfm")]),
                combine("CuPy", [skipped("no GPU on this node")])]
    assert [results.format_verdict(v) for v in verdicts] == [
        "OK       barrier: came\n         time: barrier: 1 ms",
        "MISSING  ULFM: not active\n         fix: mpirun --with-ft ulfm",
        "SKIPPED  CuPy: no GPU on this node"]
    summary = results.format_summary(verdicts)
    assert "works (1): barrier" in summary and "  ULFM: mpirun --with-ft ulfm" in summary
    assert "  CuPy: no GPU on this node" in summary and summary.endswith("(exit status 0)")
    assert not results.failed(verdicts)
    verdicts.append(combine("allgather", [broken("wrong", fix="reinstall")]))
    assert results.failed(verdicts) and "BROKEN (1):\n  allgather: reinstall" in results.format_summary(verdicts)


@pytest.fixture
def ctx():
    engine = mpidist.Engine(MPI.COMM_SELF)
    yield context.Context(MPI.COMM_SELF.Dup(), engine, nbytes=4096, repeat=1, timeout=30)
    engine.close()


def test_run_gives_a_verdict_per_check_and_a_raising_check_is_broken(ctx):
    def raises(_):
        raise RuntimeError("planted\nsecond line")
    seen = []
    verdicts = check.run(ctx, [("fine", lambda c: ok("yes")), ("raises", raises),
                               ("paths", lambda c: [("path a", ok("a")), ("path b", skipped("no b"))])], emit=seen.append)
    assert [(v.name, v.state) for v in verdicts] == [("fine", "ok"), ("raises", "broken"), ("path a", "ok"),
                                                     ("path b", "skipped")]
    assert verdicts[1].detail == "RuntimeError: planted" and seen == verdicts
    assert results.failed(verdicts)


def test_main_exits_1_when_a_planted_check_is_broken_and_0_otherwise(monkeypatch, capsys):
    monkeypatch.setattr(check, "CHECKS", [("planted", lambda c: broken("wrong on purpose", fix="none"))])
    assert check.main(["--size", "4096", "--repeat", "1"]) == 1
    out = capsys.readouterr().out
    assert "BROKEN   planted: wrong on purpose" in out and "result: BROKEN" in out
    monkeypatch.setattr(check, "CHECKS", [("fine", lambda c: ok("yes"))])
    assert check.main(["--json"]) == 0
    assert '"broken": false' in capsys.readouterr().out


def test_skip_replaces_the_checks_it_names():
    chosen = dict(check.selected("tensorflow, CUDA"))
    assert list(chosen) == [name for name, _ in check.CHECKS]
    assert chosen["TensorFlow GPU bridge"](None) == skipped("--skip tensorflow")
    assert chosen["CUDA-aware MPI"](None) == skipped("--skip cuda")
    assert chosen["barrier"] is dict(check.CHECKS)["barrier"]


@pytest.mark.parametrize("argv", [["--size", "8"], ["--repeat", "0"], ["--timeout", "0"]])
def test_main_refuses_wrong_options(argv):
    with pytest.raises(SystemExit) as exc:
        check.main(argv)
    assert exc.value.code == 2


def test_the_host_reference_is_exact_and_a_mismatch_says_where():
    for op in ("sum", "prod", "max", "min"):
        expected = context.reference(3, np.int32, (5, 2), op)
        every = [context.make(r, np.int32, (5, 2), op) for r in range(3)]
        assert np.array_equal(expected, {"sum": sum, "prod": np.prod, "max": np.max, "min": np.min}[op](
            every, **({} if op == "sum" else {"axis": 0})))
    assert set(np.unique(context.make(4, np.float32, (30,), "prod"))) == {-1.0, 1.0}
    good = context.make(2, np.float64, (4,))
    assert context.mismatch("x", good.copy(), good) is None
    bad = good.copy()
    bad[2] += 1
    assert context.mismatch("x", bad, good) == (f"x: 1 of 4 elements differ from the host reference, first at flat "
                                                f"index 2: expected {good[2]!r}, got {bad[2]!r}")
    assert context.mismatch("x", good[:3], good) == "x: expected shape (4,), got (3,)"
    assert context.mismatch("x", good.astype(np.float32), good) == "x: expected dtype float64, got float32"


def test_the_host_checks_pass_in_one_process(ctx):
    from mpidist.check import host
    for fn in (host.mpi_allreduce, host.allreduce, host.broadcast, host.allgather, host.reduce, host.reduce_scatter,
               host.barrier):
        outcome = fn(ctx)
        assert outcome.state == "ok" and outcome.timing, (fn.__name__, outcome)
    assert host.ulfm_check(ctx).state == "missing"  # no `mpirun --with-ft ulfm` here
