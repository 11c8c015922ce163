"""TensorFlow's PreemptionCheckpointHandler under mpirun (jobs/tf_preemption.py, 3 ranks): a SIGTERM
sent to ONE non-chief rank's process (not to mpirun) mid-training makes every rank save once at the
same run count and the job exit with TensorFlow's code (42) or exit_fn's; launched again on the
same directory, the job restores, continues from the saved count, and ends with the weights of an
uninterrupted run (computed here in NumPy, float64, on the same global batches)."""
from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from launching import JOBS, kill_job, mpirun_command

pytest.importorskip("tensorflow")
SCRIPT = str(JOBS / "tf_preemption.py")
STEPS_PER_EPOCH, GLOBAL_BATCH, LEARNING_RATE = 5, 12, 0.05  # as in the job
KERNEL, BIAS = [[0.1], [-0.2], [0.3]], [0.05]


def global_batch(step: int):  # as in the job
    rng = np.random.default_rng(step)
    x = rng.normal(size=(GLOBAL_BATCH, 3)).astype(np.float32)
    y = (x @ np.array([[1.0], [2.0], [-1.0]], np.float32) + 0.5 + rng.normal(size=(GLOBAL_BATCH, 1))).astype(np.float32)
    return x, y


def uninterrupted(steps: int) -> list[np.ndarray]:
    """SGD on Dense(1) with the mean squared error over each whole global batch: one process."""
    kernel, bias = np.array(KERNEL, np.float64), np.array(BIAS, np.float64)
    for step in range(steps):
        x, y = (a.astype(np.float64) for a in global_batch(step))
        err = x @ kernel + bias - y
        kernel = kernel - LEARNING_RATE * 2 * x.T @ err / GLOBAL_BATCH
        bias = bias - LEARNING_RATE * 2 * err.sum(axis=0) / GLOBAL_BATCH
    return [kernel, bias]


def _environ() -> dict:
    environ = dict(os.environ)
    if os.geteuid() == 0:
        environ.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return environ


def preempt(n: int, args: list[str], signal_rank: int) -> tuple[int, str]:
    """Launch the job, SIGTERM rank ``signal_rank``'s process once every rank has trained two steps,
    return (mpirun's exit status, output)."""
    proc = subprocess.Popen(mpirun_command(n) + [sys.executable, SCRIPT, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=_environ(), start_new_session=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout] + [lines.put(None)], daemon=True).start()
    seen, pids, deadline = [], {}, time.monotonic() + 240
    try:
        while len(pids) < n:
            line = lines.get(timeout=max(1.0, deadline - time.monotonic()))
            assert line is not None, "the job ended before every rank was ready\n" + "".join(seen)[-3000:]
            seen.append(line)
            if line.startswith("READY "):
                rank, pid = line.split()[1:3]
                pids[int(rank)] = int(pid)
        os.kill(pids[signal_rank], signal.SIGTERM)  # one rank's process, as a node's own notice would
        rc = proc.wait(timeout=120)
    except (queue.Empty, subprocess.TimeoutExpired):
        kill_job(proc, marker=SCRIPT)
        pytest.fail("the preempted job did not end\n" + "".join(seen)[-3000:])
    while (line := lines.get(timeout=30)) is not None:
        seen.append(line)
    return rc, "".join(seen)


def relaunch(n: int, args: list[str]) -> tuple[int, str]:
    try:
        out = subprocess.run(mpirun_command(n) + [sys.executable, SCRIPT, *args], capture_output=True, text=True,
                             env=_environ(), timeout=240)
    except subprocess.TimeoutExpired:
        subprocess.run(["pkill", "-9", "-f", SCRIPT], check=False)
        raise
    return out.returncode, out.stdout + out.stderr


def fields(output: str, prefix: str) -> list[dict[str, int]]:
    return [{k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", line)}
            for line in output.splitlines() if line.startswith(prefix + " ")]


def results(output: str) -> list[dict]:
    return [json.loads(line[len("RESULT "):]) for line in output.splitlines() if line.startswith("RESULT ")]


def saved_runs(directory: str) -> int:
    import tensorflow as tf
    path = tf.train.latest_checkpoint(directory)
    return int(tf.train.load_variable(path, "checkpointed_runs/.ATTRIBUTES/VARIABLE_VALUE"))


def check_finished(n: int, output: str, steps: int) -> None:
    got = results(output)
    assert sorted(r["rank"] for r in got) == list(range(n)), output[-3000:]
    want = uninterrupted(steps)
    for r in got:
        assert r["weights"] == got[0]["weights"]  # the same on every rank
        for w, a in zip(want, r["weights"]):
            np.testing.assert_allclose(np.array(a), w, rtol=1e-5, atol=1e-5)


def test_sigterm_to_one_non_chief_rank_saves_everywhere_exits_42_and_a_relaunch_continues(tmp_path):
    n, directory = 3, str(tmp_path / "ckpt")
    rc, output = preempt(n, [directory, str(10 ** 6)], signal_rank=1)
    exits = fields(output, "EXIT")
    assert rc == 42 and "RESULT" not in output, output[-3000:]
    assert sorted(e["rank"] for e in exits) == list(range(n)), output[-3000:]
    runs = exits[0]["runs"]
    # every rank left at the same run count, having saved once (a follower takes the chief's counter)
    assert all(e["runs"] == runs and e["save_counter"] == 1 for e in exits) and runs >= 2, exits
    assert output.count("a termination notice reached rank 1") == 1, output[-3000:]  # the chief's log line
    assert sorted(os.listdir(directory)) == ["checkpoint", "ckpt-1.data-00000-of-00001", "ckpt-1.index"]
    assert saved_runs(directory) == runs
    epochs = runs // STEPS_PER_EPOCH + 2
    rc, output = relaunch(n, [directory, str(epochs)])
    assert rc == 0, output[-3000:]
    assert [s["runs"] for s in fields(output, "START")] == [runs] * n, output[-3000:]
    assert [r["runs"] for r in results(output)] == [epochs * STEPS_PER_EPOCH] * n
    check_finished(n, output, epochs * STEPS_PER_EPOCH)


def test_watch_preemption_scope_save_checkpoint_if_preempted_and_exit_fn(tmp_path):
    n, directory = 3, str(tmp_path / "ckpt")
    rc, output = preempt(n, [directory, str(10 ** 6), "--scope", "--exit-code=7"], signal_rank=2)
    exits = fields(output, "EXIT")
    assert rc == 7 and output.count("EXIT_FN ") == n and "RESULT" not in output, output[-3000:]
    trained = exits[0]["trained_step"]
    assert all(e["runs"] == exits[0]["runs"] and e["trained_step"] == trained and e["save_counter"] == 1
               for e in exits) and trained >= 2, exits
    epochs = trained // STEPS_PER_EPOCH + 2
    rc, output = relaunch(n, [directory, str(epochs), "--scope"])
    assert rc == 0, output[-3000:]
    assert [s["trained_step"] for s in fields(output, "START")] == [trained] * n, output[-3000:]
    check_finished(n, output, epochs * STEPS_PER_EPOCH)
