"""``python -m mpidist check`` on every rank of the test job (``mpidist.check.main(argv)``, as each rank
of ``mpirun ... python -m mpidist check`` calls it): it passes here and says why each GPU check is
skipped; a broken collective (planted on one rank through monkeypatch) or a check that raises makes
every rank return 1 and the report name the check and the rank; on the host fake of CuPy/NCCL every
GPU path is checked; the TensorFlow check reduces a tensor. (They ran as mpirun jobs of their own
in tests/launch; ULFM under ``mpirun --with-ft ulfm``, a launcher's option, is still tested there.)
"""
from __future__ import annotations

import json
import os
import re
from importlib.metadata import PackageNotFoundError, version

import numpy as np
import pytest
from mpi4py import MPI

import mpidist
from mpidist import check
from mpidist.check import gpu
from mpidist.check.results import Outcome
from mpidist.collectives.gpu import cupy_arrays

pytestmark = pytest.mark.mpi
CHEAP = ["--size", "65536", "--repeat", "2"]  # small timed calls: the checks themselves are unchanged


def run_check(comm, capsys, *argv: str) -> tuple[list[int], str]:
    """Every rank runs ``mpidist check ARGV``: (every rank's exit status; the chief's report). The
    other ranks print nothing of it."""
    code = check.main(list(argv))
    printed = capsys.readouterr().out
    codes, outputs = comm.allgather(code), comm.allgather(printed)
    assert not any("mpidist check" in other for other in outputs[1:]), outputs  # the chief alone prints
    return codes, outputs[0]


def lines(output: str, state: str) -> dict[str, str]:
    """{check name: detail} of the report's lines in ``state`` (OK, SKIPPED, MISSING, BROKEN)."""
    return dict(re.findall(rf"^{state} +([^:]+): (.*)$", output, flags=re.M))


def launcher_name() -> str:
    """The launcher mpidist reports for the ranks of tests/run's mpirun (the MPI library says which)."""
    return "mpirun (Open MPI)" if MPI.get_vendor()[0] == "Open MPI" else "mpiexec (MPICH/Hydra)"


def nodes_text(engine) -> str:
    """How the check describes this job's nodes: one node, or fake nodes of MPIDIST_LOCAL_SIZE ranks."""
    topo = engine.topology
    sizes = "+".join(map(str, topo.node_sizes))
    faked = f" (faked by MPIDIST_LOCAL_SIZE={os.environ['MPIDIST_LOCAL_SIZE']})" if topo.faked_nodes else ""
    return f"{topo.num_nodes} node(s) of {sizes} rank(s){faked}"


@pytest.mark.node_layout  # the launcher line shows the nodes
@pytest.mark.parametrize("tf_config", ["none", "wrong"])
def test_check_passes_here_and_says_why_gpu_checks_are_skipped(comm, eng, capsys, monkeypatch, tf_config):
    size = comm.Get_size()
    if tf_config == "wrong":  # a TF_CONFIG of the user's own, of another number of workers, left set
        workers = 2 if size != 2 else 3
        monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": [f"h{w}:1" for w in range(workers)]},
                                                    "task": {"type": "worker", "index": 0}}))
        config = (f"TF_CONFIG set here disagrees with MPI (it lists {workers} chief/worker task(s), MPI has {size} "
                  "rank(s)): replaced")
    else:
        monkeypatch.delenv("TF_CONFIG", raising=False)
        config = f"TF_CONFIG exported: {size} worker(s), task index = rank"
    codes, output = run_check(comm, capsys, *CHEAP)
    assert codes == [0] * size, output
    ok = lines(output, "OK")
    legacy = os.environ.get("TF_USE_LEGACY_KERAS", "").strip().lower() in ("1", "true", "yes")
    try:
        keras2 = f"tf_keras {version('tf_keras')}"
    except PackageNotFoundError:
        keras2 = "needs `pip install tf_keras`"
    assert ok["mpidist run (what it would resolve)"] == (
        f"horovod -> mpidist.horovod; tf.distribute strategies -> mpidist's; {config}; "
        f"tf.keras: {'Keras 2' if legacy else 'Keras 3'}; --keras 2: {keras2}; GPU: no GPU visible"), output
    for name in ("MPI and launcher", "MPI Allreduce (mpi4py, host)", "allreduce (host)", "broadcast (host)",
                 "allgather (host)", "reduce (host)", "reduce_scatter (host)", "barrier"):
        assert name in ok, (name, output)
    assert f"{size} rank(s) = {size} task(s) of {launcher_name()}; {nodes_text(eng)}" in ok["MPI and launcher"], output
    assert output.count("time: ") >= 8, output  # a timing line per check that ran
    skipped = lines(output, "SKIPPED")
    for name in ("CuPy on GPU", "CUDA-aware MPI", "GPU collectives (every path)", "TensorFlow GPU bridge"):
        assert "no GPU on this node" in skipped.get(name, ""), (name, output)  # skipped, saying why
    assert "not active" in lines(output, "MISSING")["ULFM (elastic training)"], output
    assert "fix: launch with `mpirun --with-ft ulfm" in output
    assert output.count("mpidist check: ") == 1 and output.rstrip().endswith(
        "result: everything present works (exit status 0)"), output


@pytest.mark.mpi(min_size=2)
def test_a_wrong_result_on_one_rank_is_broken_and_every_rank_exits_1(comm, capsys, monkeypatch):
    if comm.Get_rank() == 1:  # rank 1's allgather results are off by one
        original = mpidist.Engine.allgather
        monkeypatch.setattr(mpidist.Engine, "allgather",
                            lambda self, value, **kw: np.asarray(original(self, value, **kw)) + 1)
    codes, output = run_check(comm, capsys, *CHEAP)
    monkeypatch.undo()
    assert codes == [1] * comm.Get_size(), output
    broken = lines(output, "BROKEN")
    assert list(broken) == ["allgather (host)"], output
    assert broken["allgather (host)"].startswith("on rank 1: allgather int32 (rank r gives r + 1 rows): "), output
    assert "elements differ from the host reference" in broken["allgather (host)"], output
    assert "reduce_scatter (host)" in lines(output, "OK"), output  # the checks after it still ran
    assert "result: BROKEN" in output


def test_a_check_that_raises_is_broken_and_says_what_was_raised(comm, capsys, monkeypatch):
    rank = comm.Get_rank()

    def planted(self, value, *a, **kw):
        raise RuntimeError(f"planted failure on rank {rank}")

    monkeypatch.setattr(mpidist.Engine, "reduce_scatter", planted)
    codes, output = run_check(comm, capsys, *CHEAP, "--json")
    monkeypatch.undo()
    assert codes == [1] * comm.Get_size(), output
    report = json.loads(output[output.index("{"):output.rindex("}") + 1])
    states = {c["name"]: c["state"] for c in report["checks"]}
    assert states["reduce_scatter (host)"] == "broken" and report["broken"] is True, report
    detail = next(c["detail"] for c in report["checks"] if c["name"] == "reduce_scatter (host)")
    if comm.Get_size() > 1:  # every rank raised a text of its own: each is named
        assert "rank 0: RuntimeError: planted failure on rank 0" in detail and "rank 1: RuntimeError" in detail, detail
    else:
        assert detail == "RuntimeError: planted failure on rank 0", detail
    assert states["barrier"] == "ok", report


@pytest.mark.node_layout  # the paths taken depend on the nodes
def test_on_the_host_fake_of_cupy_every_gpu_path_is_checked(comm, eng, capsys, monkeypatch):
    import fake_cupy
    monkeypatch.setenv("MPIDIST_CUDA_AWARE_MPI", "yes")
    paths = ["mpi-device", "mpi-staged"] + (["nccl"] if eng.topology.num_nodes == 1 else
                                            ["nccl+mpi", "nccl-copy+mpi"])
    with mpidist.rc.override():  # the settings as a new process reads them from its environment
        mpidist.rc.reset()
        cupy_arrays.forget()
        fake_cupy.install()
        try:
            codes, output = run_check(comm, capsys, *CHEAP, "--skip", "tensorflow")
        finally:
            fake_cupy.uninstall()
            cupy_arrays.forget()
    assert codes == [0] * comm.Get_size(), output
    ok = lines(output, "OK")
    assert "CuPy on GPU" in ok and "CUDA-aware MPI" in ok, output
    found = re.findall(r"^OK +GPU collectives over [^:]+: allreduce path (\S+):", output, flags=re.M)
    assert found == paths, output
    assert lines(output, "SKIPPED")["TensorFlow GPU bridge"] == "--skip tensorflow", output


@pytest.mark.job_sizes(1, reason="the TensorFlow check's own code; reductions of tensors across ranks are "
                                  "tested in test_tf_*.py")
def test_the_tensorflow_check_reduces_a_tensor(comm, capsys, monkeypatch):
    # without a GPU, on a CPU tensor: the TensorFlow check's own code (strategy, reduce, timing)
    pytest.importorskip("tensorflow")

    def cpu_tensorflow(ctx) -> Outcome:
        return gpu.tensorflow_reduce(ctx, "/CPU:0")

    monkeypatch.setattr(check, "CHECKS", [("TensorFlow reduce (CPU tensor)", cpu_tensorflow)])
    codes, output = run_check(comm, capsys, *CHEAP)
    assert codes == [0] * comm.Get_size(), output
    detail = lines(output, "OK")["TensorFlow reduce (CPU tensor)"]
    assert "strategy.reduce of a tensor on /job:localhost/replica:0/task:0/device:CPU:0 equals" in detail, output
