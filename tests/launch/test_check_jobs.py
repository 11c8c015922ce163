"""``python -m mpidist check`` under a real mpirun: it passes here and says why each GPU check is
skipped; a broken collective (planted on one rank) or a check that raises makes every rank exit 1
and the report name the check and the rank; on the host fake of CuPy/NCCL every GPU path is
checked; ULFM is found under ``mpirun --with-ft ulfm``.
"""
from __future__ import annotations

import json
import os
from importlib.metadata import version
import re
import shutil
import subprocess
import sys

import pytest

from launching import launcher_name, mpirun_command

CHEAP = ["--size", "65536", "--repeat", "2"]  # small timed calls: the checks themselves are unchanged


def lines(output: str, state: str) -> dict[str, str]:
    """{check name: detail} of the report's lines in ``state`` (OK, SKIPPED, MISSING, BROKEN)."""
    return dict(re.findall(rf"^{state} +([^:]+): (.*)$", output, flags=re.M))


def exits(output: str, n: int) -> list[int]:
    found = sorted(re.findall(r"^EXIT rank=(\d+) code=(\d+)$", output, flags=re.M))
    assert [int(r) for r, _ in found] == list(range(n)), output
    return [int(c) for _, c in found]


@pytest.mark.parametrize("n, local_size", [(2, None), (4, "2")], ids=["n2", "n4-two-fake-nodes"])
def test_check_passes_here_and_says_why_gpu_checks_are_skipped(mpirun, n, local_size):
    # at -n 4 a TF_CONFIG of the user's own (2 workers) is left in the environment
    wrong = '{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 0}}'
    env = {"MPIDIST_LOCAL_SIZE": local_size, "TF_CONFIG": wrong} if local_size else {}
    job = mpirun(n, "-m", "mpidist", "check", *CHEAP, env=env)
    assert job.returncode == 0, job.output
    ok = lines(job.output, "OK")
    tf_config = ("TF_CONFIG set here disagrees with MPI (it lists 2 chief/worker task(s), MPI has 4 rank(s)): replaced"
                 if local_size else "TF_CONFIG exported: 2 worker(s), task index = rank")
    assert ok["mpidist run (what it would resolve)"] == (
        f"horovod -> mpidist.horovod; tf.distribute strategies -> mpidist's; {tf_config}; tf.keras: Keras 3; "
        f"--keras 2: tf_keras {version('tf_keras')}; GPU: no GPU visible"), job.output
    for name in ("MPI and launcher", "MPI Allreduce (mpi4py, host)", "allreduce (host)", "broadcast (host)",
                 "allgather (host)", "reduce (host)", "reduce_scatter (host)", "barrier"):
        assert name in ok, (name, job.output)
    nodes = "2 node(s) of 2+2 rank(s) (faked by MPIDIST_LOCAL_SIZE=2)" if local_size else "1 node(s) of 2 rank(s)"
    assert f"{n} rank(s) = {n} task(s) of {launcher_name()}; {nodes}" in ok["MPI and launcher"], job.output
    assert job.output.count("time: ") >= 8, job.output  # a timing line per check that ran
    skipped = lines(job.output, "SKIPPED")
    for name in ("CuPy on GPU", "CUDA-aware MPI", "GPU collectives (every path)", "TensorFlow GPU bridge"):
        assert "no GPU on this node" in skipped.get(name, ""), (name, job.output)  # skipped, saying why
    assert "not active" in lines(job.output, "MISSING")["ULFM (elastic training)"], job.output
    assert "fix: launch with `mpirun --with-ft ulfm" in job.output
    assert job.output.count("mpidist check: ") == 1 and job.output.rstrip().endswith(
        "result: everything present works (exit status 0)"), job.output  # the chief alone prints


def test_a_wrong_result_on_one_rank_is_broken_and_every_rank_exits_1(mpirun):
    job = mpirun(3, "check_planted.py", "wrong-allgather", *CHEAP)
    assert job.returncode != 0 and exits(job.output, 3) == [1, 1, 1], job.output
    broken = lines(job.output, "BROKEN")
    assert list(broken) == ["allgather (host)"], job.output
    assert broken["allgather (host)"].startswith("on rank 1: allgather int32 (rank r gives r + 1 rows): "), job.output
    assert "elements differ from the host reference" in broken["allgather (host)"], job.output
    assert "reduce_scatter (host)" in lines(job.output, "OK"), job.output  # the checks after it still ran
    assert "result: BROKEN" in job.output


def test_a_check_that_raises_is_broken_and_says_what_was_raised(mpirun):
    job = mpirun(2, "check_planted.py", "raise-reduce-scatter", *CHEAP, "--json")
    assert exits(job.output, 2) == [1, 1], job.output
    report = json.loads(job.output[job.output.index("{"):job.output.rindex("}") + 1])
    states = {c["name"]: c["state"] for c in report["checks"]}
    assert states["reduce_scatter (host)"] == "broken" and report["broken"] is True, report
    detail = next(c["detail"] for c in report["checks"] if c["name"] == "reduce_scatter (host)")
    assert "rank 0: RuntimeError: planted failure on rank 0" in detail and "rank 1: RuntimeError" in detail, detail
    assert states["barrier"] == "ok", report


@pytest.mark.parametrize("n, local_size, paths", [
    (2, None, ["mpi-device", "mpi-staged", "nccl"]),
    (4, "2", ["mpi-device", "mpi-staged", "nccl+mpi", "nccl-copy+mpi"]),
], ids=["n2", "n4-two-fake-nodes"])
def test_on_the_host_fake_of_cupy_every_gpu_path_is_checked(mpirun, n, local_size, paths):
    env = {"MPIDIST_CUDA_AWARE_MPI": "yes", **({"MPIDIST_LOCAL_SIZE": local_size} if local_size else {})}
    job = mpirun(n, "check_planted.py", "fake-gpu", *CHEAP, "--skip", "tensorflow", env=env, timeout=240)
    assert exits(job.output, n) == [0] * n, job.output
    ok = lines(job.output, "OK")
    assert "CuPy on GPU" in ok and "CUDA-aware MPI" in ok, job.output
    found = re.findall(r"^OK +GPU collectives over [^:]+: allreduce path (\S+):", job.output, flags=re.M)
    assert found == paths, job.output
    assert lines(job.output, "SKIPPED")["TensorFlow GPU bridge"] == "--skip tensorflow", job.output


def test_the_tensorflow_check_reduces_a_tensor(mpirun):
    # without a GPU, on a CPU tensor: the TensorFlow check's own code (strategy, reduce, timing);
    # one rank, since importing TensorFlow is most of the cost (reductions of tensors across ranks
    # are tested in tests/mpi/test_tf_*.py)
    job = mpirun(1, "check_planted.py", "tensorflow-cpu", *CHEAP, timeout=240)
    assert exits(job.output, 1) == [0], job.output
    detail = lines(job.output, "OK")["TensorFlow reduce (CPU tensor)"]
    assert "strategy.reduce of a tensor on /job:localhost/replica:0/task:0/device:CPU:0 equals" in detail, job.output


def test_ulfm_is_found_under_mpirun_with_ft_ulfm():
    out = subprocess.run([shutil.which("ompi_info") or "ompi_info"], capture_output=True, text=True).stdout \
        if shutil.which("ompi_info") else ""
    if "FT MPI support: yes" not in out:
        pytest.skip("no Open MPI with ULFM here (ompi_info: FT MPI support is not yes)")
    env = dict(os.environ)
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = mpirun_command(2) + ["--with-ft", "ulfm", "--mca", "mpi_ft_detector", "true", sys.executable, "-m",
                               "mpidist", "check", *CHEAP, "--skip", "host,gpu,cupy,cuda,tensorflow,barrier"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    detail = lines(output, "OK")["ULFM (elastic training)"]
    assert detail == "active (mpirun --with-ft ulfm, failure detector on); MPIX_Comm_agree works", output
