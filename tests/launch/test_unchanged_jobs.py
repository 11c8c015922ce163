"""People's programs, unchanged, under `mpirun -n N python -m mpidist run PROGRAM` (jobs/unchanged/:
written as their authors write them, with no mpidist in them): TensorFlow's Keras tutorial main.py
reading TF_CONFIG, a library that imports horovod.tensorflow itself and trains in a v1 Session,
hvd.elastic.run, a console command of TF 2.1-2.4 spellings under --keras 2, Keras 2 code under
Keras 3 (the hint), horovod.run. Results equal one process (or NumPy's arithmetic) at -n 2 or -n 4;
every error ends the job."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from launching import JOBS

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="TensorFlow is not installed")
UNCHANGED = JOBS / "unchanged"
TIMEOUT = 600
GLOBAL_BATCH = 24  # the tutorial's global batch = per-worker batch x workers: 24 at every size
_reference: dict[str, Path] = {}


def run(mpirun, n, *args, env=None, ok=True):
    environ = {"PYTHONPATH": os.pathsep.join([str(UNCHANGED), os.environ.get("PYTHONPATH", "")]),
               "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})}
    job = mpirun(n, "-m", "mpidist", "run", *args, timeout=TIMEOUT, env=environ)
    if ok:
        assert job.returncode == 0, job.output[-5000:]
    return job


def tutorial_reference(mpirun) -> Path:
    """The tutorial at -n 1 with the whole global batch on its one worker (once per module)."""
    if "tutorial" not in _reference:
        out = Path(tempfile.mkdtemp(prefix="mpidist-unchanged-ref-"))
        run(mpirun, 1, str(UNCHANGED / "main.py"), str(out), str(GLOBAL_BATCH))
        _reference["tutorial"] = out
    return _reference["tutorial"]


# One size for each of the two programs below (they ran at 2 and 4 each): what they add to tests/mpi
# is `mpidist run` of an unchanged program (TF_CONFIG exported per rank, the user's wrong one
# replaced; `import horovod.tensorflow` answered by mpidist in a library), which takes the same path
# at 2 and 4 ranks on one node; the strategy and Horovod's collectives (v1 graphs and Sessions
# included) are checked against one process at -n 1, 2 and 4 in tests/mpi (test_strategies.py,
# test_horovod_collectives.py), the TF_CONFIG comparison at any size in tests/unit/test_launch.py.
def test_keras_tutorial_main_reads_tf_config(mpirun, tmp_path):
    n = 4
    expected = np.load(tutorial_reference(mpirun) / "weights.0.npy")
    # the user also left a TF_CONFIG of their own, for 3 workers: replaced, with a warning
    wrong = {"cluster": {"worker": ["a:1", "b:1", "c:1"]}, "task": {"type": "worker", "index": 0}}
    job = run(mpirun, n, str(UNCHANGED / "main.py"), str(tmp_path), str(GLOBAL_BATCH // n),
              env={"TF_CONFIG": json.dumps(wrong)})
    facts = dict(re.findall(rf"task (\d+) of {n}: (\{{.*\}})", job.output))
    assert sorted(facts) == [str(r) for r in range(n)], job.output[-4000:]
    for line in facts.values():
        fact = json.loads(line)
        assert (fact["replicas"], fact["isinstance"], fact["strategy"]) == (n, True, "mpidist.on_tensorflow")
    assert ("the TF_CONFIG that was set disagrees with MPI (it lists 3 chief/worker task(s), MPI has 4 rank(s); "
            + "; ".join(f"rank {r} is task worker:0 there (replica 0), not replica {r}" for r in (1, 2, 3))
            + ")") in job.output, job.output[-4000:]
    assert f"mpidist run: {UNCHANGED / 'main.py'}: {n} rank(s) on 1 node(s)" in job.output
    weights = [np.load(tmp_path / f"weights.{r}.npy") for r in range(n)]
    for r in range(1, n):
        np.testing.assert_array_equal(weights[r], weights[0], err_msg=f"rank {r} differs from rank 0")
    # one process with the same global batches: float32 sums in another order
    np.testing.assert_allclose(weights[0], expected, rtol=1e-5, atol=1e-6)


def least_squares(x, y, w, steps, learning_rate):
    for _ in range(steps):
        w = w - learning_rate * 2 / len(x) * x.T @ (x @ w - y)
    return w


def test_library_that_imports_horovod_itself_in_a_v1_session(mpirun, tmp_path):
    n = 2  # one size: see above test_keras_tutorial_main_reads_tf_config
    run(mpirun, n, str(UNCHANGED / "run_sim.py"), str(tmp_path))
    rng = np.random.default_rng(7)
    x = rng.normal(size=(48, 5)).astype(np.float32)
    y = (x @ np.arange(1, 6, dtype=np.float32) + 0.1 * rng.normal(size=48)).astype(np.float32)
    start = np.random.default_rng(100).normal(size=5).astype(np.float32)  # rank 0's, broadcast
    expected = least_squares(x.astype(np.float64), y, start, 20, 0.05)
    for r in range(n):
        np.testing.assert_allclose(np.load(tmp_path / f"w.{r}.npy"), expected, rtol=1e-5, atol=1e-5,
                                   err_msg=f"rank {r}")


def test_horovod_elastic_program(mpirun, tmp_path):
    job = run(mpirun, 2, str(UNCHANGED / "hvd_elastic.py"), str(tmp_path))
    assert job.output.count("trained 3 epochs") == 2, job.output[-3000:]
    rng = np.random.default_rng(3)
    x = rng.normal(size=(64, 4)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 3.0, 0.5], np.float32))[:, None]
    expected = least_squares(x.astype(np.float64), y, np.random.default_rng(0).normal(size=(4, 1)), 12, 0.1)
    for r in range(2):
        np.testing.assert_allclose(np.load(tmp_path / f"kernel.{r}.npy"), expected, rtol=1e-5, atol=1e-5)


def console_script(directory: Path) -> Path:
    """A console script as pip writes one for `cli-train = cli_pkg.trainer:main`."""
    bin_dir = directory / "bin"
    bin_dir.mkdir()
    script = bin_dir / "cli-train"
    script.write_text(f"#!{sys.executable}\n# -*- coding: utf-8 -*-\nimport re\nimport sys\n"
                      "from cli_pkg.trainer import main\nif __name__ == '__main__':\n"
                      "    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])\n    sys.exit(main())\n")
    script.chmod(0o755)
    return bin_dir


def test_console_command_of_old_spellings_under_keras_2(mpirun, tmp_path):
    bin_dir = console_script(tmp_path)
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    job = run(mpirun, 2, "--keras", "2", "cli-train", str(tmp_path), "16", env=env)
    assert "tf.keras: Keras 2 (tf_keras)" in job.output, job.output[-3000:]
    lines = re.findall(r"task (\d): (\d+) steps, optimizer from (\w+)", job.output)
    assert sorted(lines) == [("0", "6", "tf_keras"), ("1", "6", "tf_keras")], job.output[-3000:]
    rng = np.random.default_rng(5)
    x = rng.normal(size=(96, 3)).astype(np.float32)
    y = (x @ np.array([0.5, -1.0, 2.0], np.float32)).astype(np.float32)
    w = np.zeros(3)
    for start in range(0, 96, 16):  # six global batches of 16: SGD on each batch's mean loss
        w = least_squares(x[start:start + 16].astype(np.float64), y[start:start + 16], w, 1, 0.1)
    for r in range(2):
        np.testing.assert_allclose(np.load(tmp_path / f"w.{r}.npy"), w, rtol=1e-5, atol=1e-6)


def test_keras_2_code_trains_under_keras_2_and_gets_a_hint_under_keras_3(mpirun):
    job = run(mpirun, 2, "--keras", "2", str(UNCHANGED / "keras2_code.py"))
    assert sorted(re.findall(r"rank (\d): trained with tf_keras", job.output)) == ["0", "1"], job.output[-3000:]
    job = run(mpirun, 2, str(UNCHANGED / "keras2_code.py"), ok=False, env={"TF_USE_LEGACY_KERAS": "0"})
    assert job.returncode != 0, job.output[-3000:]
    assert ("mpidist run: keras2_code.py:15 is Keras 2 code (compile(experimental_run_tf_function=...)), which "
            "Keras 3 rejects; run it under Keras 2: `mpidist run --keras 2 ...`") in job.output, job.output[-3000:]
    assert "runpy" not in job.output  # the traceback starts in the program, as python's does


def probe_lines(output: str) -> list[dict]:
    return sorted((json.loads(line[len("PROBE "):]) for line in output.splitlines() if line.startswith("PROBE ")),
                  key=lambda p: p["task"]["index"])


def test_horovod_run_of_the_job_size_and_of_another(mpirun):
    job = run(mpirun, 2, str(UNCHANGED / "probe.py"), "2", "a", "b")
    probes = probe_lines(job.output)
    assert len(probes) == 2, job.output[-3000:]
    for r, probe in enumerate(probes):
        assert [result[:2] for result in probe["results"]] == [[7, 0], [7, 1]]
        assert (probe["version"], probe["workers"], probe["args"], probe["tensorflow"]) == ("0.28.1", 2, ["a", "b"],
                                                                                           False)
        assert probe["task"] == {"type": "worker", "index": r}
    job = run(mpirun, 2, str(UNCHANGED / "probe.py"), "3", ok=False)
    assert job.returncode != 0
    assert job.output.count("horovod.run: the program asks for 3 processes, but this MPI job has 2 rank(s)") == 2, \
        job.output[-3000:]


def horovodrun(*args: str, timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("SLURM_JOB_ID", None)  # on this host, not in an allocation
    return subprocess.run([sys.executable, "-m", "mpidist", "horovodrun", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=UNCHANGED)


def test_horovodrun_on_one_node():
    proc = horovodrun("-np", "2", "--fusion-threshold-mb", "1", sys.executable, "probe.py", "2", "x")
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert re.search(r"mpidist horovodrun: HOROVOD_FUSION_THRESHOLD=1048576 \S*mpirun -n 2 --bind-to none "
                     r"--map-by slot .*--host localhost:2 -x <\d+ variables> \S*python\S* -m mpidist run probe.py "
                     r"2 x", output), output
    probes = probe_lines(output)
    assert [p["task"]["index"] for p in probes] == [0, 1], output[-3000:]
    assert all(p["fusion"] == "1048576" and p["args"] == ["x"] for p in probes)
    # the job's exit status is the program's
    proc = horovodrun("-np", "2", sys.executable, "-c", "import sys, horovod; sys.exit(3)")
    assert proc.returncode == 3, proc.stdout + proc.stderr


TWO_NODES = Path(__file__).resolve().parents[1] / "two_nodes" / "run"


def test_horovodrun_with_hosts_on_two_nodes():
    """`-H nodea:2,nodeb:2` on two host names of this machine (tests/two_nodes/run: namespaces, an ssh
    stand-in): Open MPI starts a daemon per host and MPI finds two nodes by itself."""
    mpirun = os.environ.get("MPITEST_MPIRUN") or "mpirun"
    reason = subprocess.run([str(TWO_NODES), "--check", mpirun], capture_output=True, text=True)
    if reason.returncode != 0:
        pytest.skip(reason.stdout.strip() or reason.stderr.strip())
    proc = subprocess.run([str(TWO_NODES), "--command", mpirun, sys.executable, "-m", "mpidist", "horovodrun",
                           "-np", "4", "-H", "nodea:2,nodeb:2", "--fusion-threshold-mb", "2", sys.executable,
                           "probe.py", "4", "two"], capture_output=True, text=True, timeout=TIMEOUT, cwd=UNCHANGED)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert "--host nodea:2,nodeb:2" in output and "4 rank(s) on 2 node(s) (2, 2 per node)" in output, output
    probes = probe_lines(output)
    assert [p["task"]["index"] for p in probes] == [0, 1, 2, 3], output[-3000:]
    for p in probes:
        assert p["results"] == [[7, 0, "nodea"], [7, 1, "nodea"], [7, 2, "nodeb"], [7, 3, "nodeb"]], output
        assert p["fusion"] == str(2 << 20), output
