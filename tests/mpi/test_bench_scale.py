"""``mpidist bench scale`` on every rank of the test job: every collective it checks is correct at this
size and layout, and a wrong result on one rank is named, with the rank, and fails the command.
(At 8 ranks on 4 fake nodes as a job of its own: tests/launch/test_bench_scale_job.py.)"""
from __future__ import annotations

import json

import numpy as np
import pytest

from mpidist.bench import scale
from mpidist.collectives import Engine

pytestmark = pytest.mark.mpi


def run(comm, capsys, *argv: str) -> tuple[list[int], dict]:
    """Every rank runs ``bench scale --json ARGV``: every rank's exit status, and the chief's JSON."""
    code = scale.main(["--seconds", "0.05", "--json", *argv])
    out = capsys.readouterr().out
    return comm.allgather(code), comm.bcast(json.loads(out) if comm.Get_rank() == 0 else None, root=0)


def test_every_collective_is_correct_and_the_times_are_reported(comm, capsys):
    codes, result = run(comm, capsys)
    assert codes == [0] * comm.Get_size(), result
    assert result["size"] == comm.Get_size()
    assert result["checks"] == {name: [] for name in scale.CHECKS}, result["errors"]
    assert result["errors"] == {}
    assert set(result["startup_seconds"]) == {"process start to main", "Engine", "strategy"}
    assert all(v is None or v >= 0 for v in result["startup_seconds"].values())
    assert all(v > 0 for v in result["per_call_seconds"].values()), result["per_call_seconds"]


def test_a_wrong_result_on_one_rank_is_named_and_fails_the_command(comm, capsys, monkeypatch):
    late = comm.Get_size() - 1
    genuine = Engine.reduce_scatter

    def off_by_one_on_the_last_rank(self, value, *args, **kwargs):
        result = genuine(self, value, *args, **kwargs)
        return result + np.float32(1) if self.rank == late else result
    monkeypatch.setattr(Engine, "reduce_scatter", off_by_one_on_the_last_rank)
    codes, result = run(comm, capsys)
    assert codes == [1] * comm.Get_size()
    assert result["checks"]["reduce_scatter sum"] == [late]
    assert result["errors"]["reduce_scatter sum"] == "wrong result"
    assert [name for name, ranks in result["checks"].items() if ranks] == ["reduce_scatter sum"]
    assert f"WRONG on ranks [{late}]" in scale.table(result)
