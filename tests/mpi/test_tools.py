"""The developer tools of tools/ on every rank of the test job (smoke runs on tiny sizes: no timing is
asserted): each tool's ``main(argv)`` is called in-process, as each rank of ``mpirun ... python -m
tools.X`` calls it. They are not installed with the package: the repository root goes on sys.path.
(They ran as mpirun jobs of their own in tests/launch; tools.tf_sweep, which starts TensorFlow's own
MultiWorkerMirroredStrategy and its gRPC server in the process, still does.)"""
from __future__ import annotations

import importlib
import inspect
import json
import os
import pathlib
import sys

import pytest

import mpidist
from mpidist.collectives import timeline

pytestmark = pytest.mark.mpi
ROOT = pathlib.Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # after the installed packages: `import mpidist` is unchanged
# the TensorFlow tools trace and time the same code at every size: their smoke runs keep the sizes
# they ran at as jobs of their own (each passes at every size; tracing is most of their time)
AT_2 = pytest.mark.job_sizes(2, reason="a TensorFlow tool's smoke run")
TINY = ["--inputs", "16", "--width", "64", "--depth", "3", "--batch", "8"]


def tool(comm, capsys, name: str, *argv: str) -> str:
    """Every rank runs ``python -m tools.NAME ARGV``'s main; the chief's output (it alone prints).
    What a tool sets for its process (mpidist.rc: tools.overlap_timeline turns the timeline on;
    environment variables) ends with it, as at a process's exit."""
    main = importlib.import_module(f"tools.{name}").main
    environ = dict(os.environ)
    with mpidist.rc.override():
        if inspect.signature(main).parameters:
            code = main(list(argv))
        else:  # a main that reads sys.argv itself
            saved = sys.argv
            sys.argv = [f"tools/{name}.py", *argv]
            try:
                code = main()
            finally:
                sys.argv = saved
    assert timeline.recorder() is None  # rc read again: a timeline the tool opened is closed
    for key in set(os.environ) - set(environ):
        del os.environ[key]
    os.environ.update(environ)
    codes, printed = comm.allgather(code), comm.allgather(capsys.readouterr().out)
    assert codes in ([0] * comm.Get_size(), [None] * comm.Get_size()), (codes, printed[0])
    assert not any(printed[1:]), printed  # the chief alone prints
    return printed[0]


def first_json(output: str, opening: str = "{"):
    """The first JSON value of ``output`` starting at ``opening`` (stdout first, then TensorFlow's log)."""
    return json.JSONDecoder().raw_decode(output[output.index(opening):])[0]


def test_sweep_smoke(comm, capsys, shared_dir):
    """The nccl-tests-style sweep runs for every collective and draws its plot (no timing asserted)."""
    png = os.path.join(shared_dir, "sweep.png")
    rows = first_json(tool(comm, capsys, "sweep", "--max", "16KB", "--seconds", "0.05", "--json", "--plot", png), "[")
    assert {r["collective"] for r in rows} == {"allreduce", "allgather", "broadcast", "reduce_scatter"}
    assert {r["bytes"] for r in rows if r["collective"] == "allreduce"} == {4096, 16384}
    for r in rows:
        assert r["mpidist"]["busbw"] > 0 and r["raw"]["busbw"] > 0
    p = comm.Get_size()
    allreduce = next(r for r in rows if r["collective"] == "allreduce")
    factor = 2 * (p - 1) / p if p > 1 else 1.0  # nccl-tests' busbw factor: 1 at p = 2 (and on one rank)
    assert allreduce["mpidist"]["busbw"] == pytest.approx(allreduce["mpidist"]["algbw"] * factor)
    comm.Barrier()
    assert os.path.getsize(png) > 1000  # the chief drew it


@AT_2
def test_tf_bench_smoke(comm, capsys):
    """The TensorFlow bench's input cases (the distributed iterator against tf.data) run end to end."""
    pytest.importorskip("tensorflow")
    results = first_json(tool(comm, capsys, "tf_bench", "--cases", "input", "--no-mwms", "--seconds", "0.05",
                              "--json"))
    rows = results["input step, per-replica batch 32 x 8 (ms)"]
    assert results["ranks"] == comm.Get_size() and rows and all(ms > 0 for ms in rows.values())


@AT_2
def test_tf_bench_token_smoke(comm, capsys):
    pytest.importorskip("tensorflow")
    rows = first_json(tool(comm, capsys, "tf_bench", "--cases", "token", "--no-mwms", "--seconds", "0.05",
                           "--json"))["ordering token, 4 KB, 100 per call (ms)"]
    assert len(rows) == 6 and all(ms > 0 for ms in rows.values())


def test_lockstep_bench_smoke(comm, capsys):
    """The preemption agreement's cost per step (NumPy cases): every case timed, nothing asserted on times."""
    output = tool(comm, capsys, "lockstep_bench", "--seconds", "0.3")
    lines = [line for line in output.splitlines() if "us/step" in line]
    assert [line.split("  ")[0] for line in lines] == ["step alone", "lockstep (persistent)", "lockstep (Iallreduce)",
                                                       "blocking Allreduce"], output


def test_overlap_numpy_smoke(comm, capsys):
    """Every case runs; buckets follow --bucket-bytes; the step after trains the same weights as before."""
    results = first_json(tool(comm, capsys, "overlap_numpy", *TINY, "--bucket-bytes", "8192", "--seconds", "0.05",
                              "--json"))
    assert results["ranks"] == comm.Get_size() and len(results["buckets (MB, backprop order)"]) >= 2
    assert results["weights after == before, bit for bit (same steps)"] is True
    assert all(ms > 0 for ms in results["ms"].values()) and len(results["ms"]) == 5


@AT_2
def test_overlap_bench_smoke(comm, capsys):
    """Every case runs, before (the git revision) and after; buckets follow --bucket-bytes."""
    pytest.importorskip("tensorflow")
    results = first_json(tool(comm, capsys, "overlap_bench", *TINY, "--bucket-bytes", "8192", "--seconds", "0.05",
                              "--json"))
    assert results["ranks"] == comm.Get_size() and len(results["buckets (MB, backprop order)"]) >= 2
    assert all(ms > 0 for ms in results["ms"].values())
    assert "step after (buckets in backprop order)" in results["ms"]


@AT_2
def test_overlap_bench_accumulation_counts_one_reduction_per_update(comm, capsys):
    pytest.importorskip("tensorflow")
    results = first_json(tool(comm, capsys, "overlap_bench", *TINY, "--accumulation", "--seconds", "0.05", "--json"))
    four, one = results["gradient_accumulation_steps=4"], results["gradient_accumulation_steps=1"]
    assert four["applied updates"] * 4 == four["micro-batches"] == one["applied updates"]
    assert four["... per applied update"] == one["... per applied update"] >= 1


@AT_2
def test_overlap_timeline_draws_and_profiles(comm, capsys, shared_dir):
    pytest.importorskip("tensorflow")
    png, profile = os.path.join(shared_dir, "t.png"), os.path.join(shared_dir, "profile.json")
    tool(comm, capsys, "overlap_timeline", *TINY, "--steps", "2", "--out", png,
         "--trace", os.path.join(shared_dir, "trace", "t.json"), "--profile", profile)
    comm.Barrier()
    assert os.path.getsize(png) > 1000
    with open(profile, encoding="utf-8") as f:
        tensors = json.load(f)["tensors"]
    assert len(tensors) == 8 and all(t["ready_ms"] > 0 and t["bytes"] > 0 for t in tensors)


@AT_2
def test_horovod_bench_reports_every_case(comm, capsys):
    pytest.importorskip("tensorflow")
    found = first_json(tool(comm, capsys, "horovod_bench", "--seconds", "0.2", "--json"))
    assert found["ranks"] == comm.Get_size()
    allreduce = found["allreduce 4 KB (ms)"]
    assert set(allreduce) >= {"hvd.allreduce in tf.function (mpidist.horovod)", "raw mpi4py Allreduce (NumPy)"}
    assert all(v > 0 for v in allreduce.values())
    steps = next(v for k, v in found.items() if k.startswith("Keras step"))
    assert len(steps) == 3 and all(v > 0 for v in steps.values())
    assert "Traceback" not in json.dumps(found)


@pytest.mark.job_sizes(1, 2, reason="a TensorFlow tool's smoke run: one rank (plain Keras cases too) and two")
def test_xla_bench_reports_every_case(comm, capsys, shared_dir):
    """``python -m tools.xla_bench`` reports every case (plain Keras ones on one rank; no timing asserted)."""
    pytest.importorskip("tensorflow")
    out = os.path.join(shared_dir, "xla.json")
    output = tool(comm, capsys, "xla_bench", "--models", "mlp", "--steps", "3", "--rounds", "1", "--json", out)
    comm.Barrier()
    with open(out, encoding="utf-8") as f:
        found = json.load(f)
    assert found["ranks"] == comm.Get_size()
    cases = found["results"]["mlp"]
    expected = {"mpidist, jit_compile=False", "mpidist, jit_compile=True"}
    if comm.Get_size() == 1:
        expected |= {"plain Keras, jit_compile=False", "plain Keras, jit_compile=True"}
    assert set(cases) == expected and all(ms > 0 for ms in cases.values())
    assert "| mlp (256) | mpidist, jit_compile=True |" in output
