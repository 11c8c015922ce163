"""The command line on every rank of the test job: ``python -m mpidist X`` is ``mpidist.__main__.main([X,
...])``, called here in-process as each rank of ``mpirun ... python -m mpidist X`` would: info (one
table from the chief), a tiny bench, soak, MPIDIST_TIMELINE and ``timeline merge``, and the bench
modes that moved to tools/. (They ran as mpirun jobs of their own in tests/launch; nothing here ends
the job or needs a process to itself.)"""
from __future__ import annotations

import json
import os
import re

import pytest
from mpi4py import MPI

import mpidist
from mpidist.__main__ import main
from mpidist.collectives import timeline

pytestmark = pytest.mark.mpi


def cli(comm, capsys, *argv: str) -> tuple[list[int], str]:
    """Every rank runs ``mpidist ARGV``: (every rank's exit status, in rank order; what every rank
    printed, stdout and stderr, rank 0's first)."""
    code = main(list(argv))
    out = capsys.readouterr()
    codes = comm.allgather(code)
    return codes, "".join(comm.allgather(out.out + out.err))


def on_chief(comm, fn):
    """``fn()`` on rank 0; its result on every rank, or what it raised raised on every rank."""
    result, raised = None, None
    if comm.Get_rank() == 0:
        try:
            result = fn()
        except Exception as exc:  # raised again on every rank below
            raised = exc
    result, failure = comm.bcast((result, None if raised is None else f"{type(raised).__name__}: {raised}"), root=0)
    if raised is not None:
        raise raised
    if failure is not None:
        raise AssertionError(f"on rank 0: {failure}")
    return result


def launcher_name() -> str:
    """The name ``mpidist info`` reports for the ranks of tests/run's mpirun (tests/launch/launching.py
    asks mpirun itself; here the MPI library tells which launcher started the job)."""
    return "mpirun (Open MPI)" if MPI.get_vendor()[0] == "Open MPI" else "mpiexec (MPICH/Hydra)"


@pytest.mark.node_layout  # the table shows the nodes
def test_info_prints_one_table_from_the_chief(comm, capsys):
    codes, output = cli(comm, capsys, "info")
    size = comm.Get_size()
    assert codes == [0] * size, output
    assert output.count("MPI           ") == 1  # chief only
    local = mpidist.rc.local_size or size  # tests/run: one node, or fake nodes of MPIDIST_LOCAL_SIZE ranks
    rows = re.findall(r"^\s+(\d+) +(\d+) +(\d+)/(\d+) ", output, flags=re.M)
    assert rows == [(str(r), str(r // local), str(r % local), str(local)) for r in range(size)], output
    assert f"launcher      {launcher_name()} ({size} tasks" in output, output
    assert ("faked by MPIDIST_LOCAL_SIZE" in output) == bool(mpidist.rc.local_size), output


@pytest.mark.node_layout  # what auto gives depends on the nodes
def test_info_shows_what_each_size_gets_and_why(comm, capsys):
    """The algorithm lines: under auto on several nodes, one row per size band with the pick and both
    predicted costs, the pick the engine makes for that size; on one node, why there is nothing to pick."""
    from mpidist.collectives.algorithms import auto_name
    topo = mpidist.topology.Topology(comm)
    try:
        codes, output = cli(comm, capsys, "info")
        assert codes == [0] * comm.Get_size(), output
        rows = re.findall(r"^ +(\d+) (B|KiB|MiB|GiB) +(flat|hierarchical) +([\d.]+) (µs|ms) +([\d.]+) (µs|ms)$",
                          output, flags=re.M)
        if topo.multi_node:
            assert "algorithm     auto: cost model, " in output, output
            assert len(rows) == 11, output  # 1 KiB ... 1 GiB
            units = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
            for number, unit, name, *_ in rows:
                assert name == auto_name(topo, int(number) * units[unit]), output
        else:
            assert "algorithm     auto: one node or one rank per node" in output and not rows, output
    finally:
        topo.free()


def test_info_json(comm, capsys):
    codes, output = cli(comm, capsys, "info", "--json")
    assert codes == [0] * comm.Get_size(), output
    report = json.loads(output[output.index("{"):])
    assert report["world_size"] == comm.Get_size() and [r["rank"] for r in report["ranks"]] == list(
        range(comm.Get_size()))
    assert report["mpi"]["thread_level"] in ("single", "funneled", "serialized", "multiple")


def test_bench_smoke(comm, capsys):
    """The bench runs end to end at a tiny size (a smoke test: no timing is asserted)."""
    codes, output = cli(comm, capsys, "bench", "--sizes", "4KB,300KB", "--nest", "10", "--seconds", "0.2", "--json")
    assert codes == [0] * comm.Get_size(), output
    rows = json.loads(output[output.index("["):])
    assert [r["case"] for r in rows] == ["allreduce 4 KB", "allreduce 300 KB", "10 x 4 KB nest"]
    assert all(r["raw"] > 0 and r["mpidist"] > 0 for r in rows)


def test_bench_fusion_smoke(comm, capsys):
    """`bench fusion` runs end to end on a small gradient set, every case's result checked against the
    sum before timing (a smoke test: no timing is asserted)."""
    codes, output = cli(comm, capsys, "bench", "fusion", "--model", "small", "--seconds", "0.1", "--json")
    assert codes == [0] * comm.Get_size(), output
    row = json.loads(output[output.index("{"):])
    assert row["model"] == "small" and row["tensors"] == 1000 and row["ranks"] == comm.Get_size()
    assert set(row["median"]) == {"raw fused", "raw fused, Iallreduce", "raw per tensor", "reduce", "replica"}
    assert row["ratio"]["raw fused, Iallreduce"] == 1.0 and all(t > 0 for t in row["median"].values())


def test_soak_smoke(comm, capsys):
    """A short soak: random collectives, every result checked exactly on every rank."""
    codes, output = cli(comm, capsys, "soak", "--collectives", "150", "--max-bytes", "600KB", "--json")
    assert codes == [0] * comm.Get_size(), output
    result = json.loads(output[output.index("{"):])
    assert result["wrong_results"] == 0 and result["collectives"] == 150 and result["ranks"] == comm.Get_size()


def test_timeline_from_the_environment_and_merge(comm, capsys, monkeypatch, shared_dir):
    """MPIDIST_TIMELINE writes one trace per rank; `timeline merge` joins them for a trace viewer."""
    directory = os.path.join(shared_dir, "tl")
    monkeypatch.setenv("MPIDIST_TIMELINE", os.path.join(directory, "trace.json"))
    with mpidist.rc.override():  # the settings as a new process reads them from its environment
        mpidist.rc.reset()
        codes, output = cli(comm, capsys, "bench", "--sizes", "4KB", "--nest", "3", "--seconds", "0.05")
    assert timeline.recorder() is None  # the setting read again: the trace is closed, as at a process's exit
    assert codes == [0] * comm.Get_size(), output
    comm.Barrier()
    size = comm.Get_size()
    assert sorted(os.listdir(directory)) == sorted(f"trace.rank{r}.json" for r in range(size))
    merged = os.path.join(shared_dir, "merged.json")

    def merge() -> tuple[int, str, list]:  # `mpidist timeline merge`: one process, not a job
        code = main(["timeline", "merge", merged, os.path.join(directory, "trace.rank*.json")])
        with open(merged, encoding="utf-8") as f:
            return code, capsys.readouterr().out, json.load(f)["traceEvents"]

    code, printed, events = on_chief(comm, merge)
    assert code == 0 and f"wrote {merged}" in printed, printed
    spans = [e for e in events if e.get("cat") == "collective"]
    assert {e["pid"] for e in spans} == set(range(size))
    # every rank recorded the same collectives, in the same order
    by_rank = [[(e["name"], e["args"]["leaves"]) for e in spans if e["pid"] == r] for r in range(size)]
    assert all(ranks == by_rank[0] for ranks in by_rank) and ("allreduce", 3) in by_rank[0]


def test_moved_bench_modes_point_at_the_tools(comm, capsys):
    """`bench sweep` and friends moved to tools/: the old command says where, and fails."""
    codes, output = cli(comm, capsys, "bench", "sweep")
    assert all(code != 0 for code in codes) and "python -m tools.sweep" in output, output


def test_bench_paths_rejects_a_missing_checkout(comm, capsys, tmp_path_factory):
    """`--before` must name a checkout (the smoke run of `bench paths`, which loads that checkout's
    mpidist into its processes, is tests/launch/test_bench_paths_job.py)."""
    empty = str(tmp_path_factory.mktemp("not-a-checkout"))
    with pytest.raises(FileNotFoundError, match="`--before` must name a checkout"):
        main(["bench", "paths", "--sizes", "4KB", "--before", empty])
