"""Elastic training under ULFM: ranks SIGKILLed mid-loop, the survivors shrink, roll back and finish.

Each job runs under ``mpirun --with-ft ulfm --mca mpi_ft_detector true`` and a timeout (a hang
fails the test). The checks: the killed ranks die, every survivor prints its result, the results
are identical, and each training segment (from a (re)start of ``train`` to the next) equals a
replay of the gradients of the ranks that took part in it, from the state it started from; so the
final value equals the reference computed from the last committed state with the survivors.
The jobs end with ``mpidist.elastic.shutdown()``: without it the survivors sometimes hung inside
``MPI_Finalize`` (Open MPI's fence over the dead ranks) after printing their results.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from elastic_segments import check_survivors, replay, results
from launching import JOBS, kill_job, mpirun_command

ULFM_FLAGS = ["--with-ft", "ulfm", "--mca", "mpi_ft_detector", "true"]


def _ulfm_unavailable() -> str | None:
    info = shutil.which("ompi_info")
    if info is None:
        return "ompi_info not found: not Open MPI, so no ULFM"
    out = subprocess.run([info], capture_output=True, text=True).stdout
    if "FT MPI support: yes" not in out:
        return "this Open MPI was built without ULFM (ompi_info: FT MPI support is not yes)"
    from mpi4py import MPI  # noqa: import only to look at the API
    if not hasattr(MPI.Comm, "Shrink"):
        return "mpi4py < 4 has no Comm.Shrink"
    return None


pytestmark = pytest.mark.skipif(_ulfm_unavailable() is not None, reason=str(_ulfm_unavailable()))


def run_ulfm(n: int, script: str, *args: str, timeout: float = 180, env: dict | None = None):
    environ = dict(os.environ, **(env or {}))
    if os.geteuid() == 0:
        environ.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = mpirun_command(n) + ULFM_FLAGS + [sys.executable, str(JOBS / script), *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environ,
                            start_new_session=True)
    start = time.monotonic()
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # mpirun, and ranks that ignore SIGTERM
        out, err = proc.communicate(timeout=30)
        kill_job(proc, marker=str(JOBS / script))
        where = "after every survivor printed its result (at job exit)" if "RESULT" in out else "before the results"
        pytest.fail(f"the ULFM job hung {where}; killed after {timeout} s\n{(out + err)[-4000:]}")
    return proc.returncode, out + err, time.monotonic() - start


def check_numpy_job(n: int, steps: int, kills: dict[int, int], env: dict | None = None) -> None:
    rc, output, _ = run_ulfm(n, "elastic_numpy.py", str(steps), *[f"{r}:{s}" for r, s in kills.items()], env=env)
    for r in kills:
        assert f"KILLING rank={r} step={kills[r]}" in output, output
    check_survivors(results(output), n, steps, kills, output)


def test_numpy_loop_survives_a_sigkill_at_3_ranks():
    check_numpy_job(3, 20, {1: 7})


def test_numpy_loop_survives_two_deaths_at_4_ranks_chief_included():
    check_numpy_job(4, 30, {0: 5, 2: 17})


def test_numpy_loop_survives_a_death_before_the_first_step():
    # no commit yet but the one elastic.run makes at the start: the survivors start over from it
    check_numpy_job(3, 10, {2: 0})


def test_numpy_loop_two_deaths_on_faked_nodes():
    check_numpy_job(4, 30, {3: 4, 1: 11}, env={"MPIDIST_LOCAL_SIZE": "2"})


def test_without_ulfm_elastic_run_says_so_and_a_death_ends_the_job():
    environ = dict(os.environ)
    if os.geteuid() == 0:
        environ.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = mpirun_command(2) + [sys.executable, str(JOBS / "elastic_numpy.py"), "20", "1:3"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environ,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        kill_job(proc, marker=str(JOBS / "elastic_numpy.py"))
        raise
    output = out + err
    assert output.count("ULFM is not active") == 1, output  # once, from the chief
    assert proc.returncode != 0 and "RESULT" not in output, output


@pytest.mark.parametrize("ulfm", [True, False])
def test_info_says_whether_ulfm_is_active(ulfm):
    environ = dict(os.environ)
    if os.geteuid() == 0:
        environ.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = mpirun_command(2) + (ULFM_FLAGS if ulfm else []) + [sys.executable, "-m", "mpidist", "info"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=environ, timeout=120, errors="replace").stdout
    line = next(l for l in out.splitlines() if l.startswith("ULFM"))
    assert line.split()[1] == ("yes:" if ulfm else "no:"), out


def tf_batch(rank: int, step: int):  # as in jobs/elastic_tf_loop.py
    rng = np.random.default_rng(1000 * rank + step)
    return rng.normal(size=(4, 3)).astype("float32"), rng.normal(size=(4, 1)).astype("float32")


def tf_replay(weights: list, ranks: list, start: int, stop: int) -> list:
    """SGD(0.1) on Dense(1) with the MEAN of the ranks' gradients of mean squared error, in float64."""
    kernel, bias = np.array(weights[0], np.float64), np.array(weights[1], np.float64)
    for step in range(start, stop):
        gk, gb = np.zeros_like(kernel), np.zeros_like(bias)
        for r in ranks:
            x, y = (a.astype(np.float64) for a in tf_batch(r, step))
            err = x @ kernel + bias - y
            gk += 2 * x.T @ err / len(x)
            gb += 2 * err.sum(axis=0) / len(x)
        kernel, bias = kernel - 0.1 * gk / len(ranks), bias - 0.1 * gb / len(ranks)
    return [kernel, bias]


def test_tensorflow_custom_loop_survives_a_sigkill_at_3_ranks():
    pytest.importorskip("tensorflow")
    n, steps, kills = 3, 12, {1: 5}
    rc, output, _ = run_ulfm(n, "elastic_tf_loop.py", str(steps), "1:5", timeout=400)
    got = results(output)
    assert sorted(r["rank"] for r in got) == [0, 2], output[-3000:]
    first = got[0]
    for r in got:
        assert r["weights"] == first["weights"] and r["step"] == steps and r["size"] == 2
        assert [(s["step"], s["weights"], s["ranks"]) for s in r["segments"]] == \
            [(s["step"], s["weights"], s["ranks"]) for s in first["segments"]]
    segments = first["segments"]
    assert [s["ranks"] for s in segments] == [[0, 1, 2], [0, 2]] and segments[1]["step"] in (4, 5), segments
    for seg, after in zip(segments, segments[1:] + [{"step": steps, "weights": first["weights"]}]):
        want = tf_replay(seg["weights"], seg["ranks"], seg["step"], after["step"])
        for w, a in zip(want, after["weights"]):
            np.testing.assert_allclose(np.array(a), w, rtol=1e-4, atol=1e-5)


def keras_fit_reference(epochs: int) -> list:
    """As jobs/elastic_keras_fit.py without a death: SGD(0.05) on Dense(1) (zeros), mean squared error
    over each global batch of 12 rows (the mean over replicas of their equal shares' means), float64."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(48, 3)).astype("float32").astype(np.float64)
    y = (x.astype("float32") @ np.array([[1.0], [-2.0], [0.5]], "float32") + 0.3).astype("float32").astype(np.float64)
    kernel, bias = np.zeros((3, 1)), np.zeros(1)
    for _ in range(epochs):
        for b in range(4):
            xb, yb = x[12 * b:12 * b + 12], y[12 * b:12 * b + 12]
            err = xb @ kernel + bias - yb
            kernel, bias = kernel - 0.05 * 2 * xb.T @ err / 12, bias - 0.05 * 2 * err.sum(axis=0) / 12
    return [kernel, bias]


@pytest.mark.parametrize("per_commit, kill, resumed", [
    (1, (1, 2), {(1, 1), (1, 2)}),  # at the death's batch, or the one before if the death cut it short
    (2, (1, 3), {(1, 2)}),          # the commit of batch 2; batch 3's start is lost and redone
    (3, (0, 2), {(0, 0)}),          # first epoch, before any commit but the start's: from the start
])
def test_keras_fit_resumes_at_the_committed_epoch_and_batch_after_a_sigkill_at_3_ranks(per_commit, kill, resumed):
    """A death before batch ``kill[1]`` of epoch ``kill[0]``, committing every ``per_commit`` batches
    (and at each epoch's end): the survivors roll back to rank 0's last commit, losing at most
    ``per_commit - 1`` finished batches, and redo them from the rolled-back weights on the same global
    batches; so the reference with that rollback is the run without a death."""
    pytest.importorskip("tensorflow")
    epoch, batch = kill
    rc, output, _ = run_ulfm(3, "elastic_keras_fit.py", "3", f"1:{epoch}:{batch}",
                             f"--batches-per-commit={per_commit}", timeout=400)
    got = results(output)
    assert f"KILLING rank=1 epoch={epoch} batch={batch}" in output, output[-3000:]
    assert sorted(r["rank"] for r in got) == [0, 2], output[-3000:]
    first = got[0]
    for r in got:  # identical on every survivor, on the 2-rank communicator, training finished
        assert r["weights"] == first["weights"] and r["size"] == 2 and (r["epoch"], r["batch"]) == (3, 0), output
        assert r["starts"] == first["starts"], output
    starts = first["starts"]
    assert [s["size"] for s in starts] == [3, 2], starts
    # resumed at the lowest survivor's (rank 0's) last commit, a commit point of the epoch of the death
    at = (starts[1]["epoch"], starts[1]["batch"])
    assert at == tuple(starts[1]["last_seen"]) and at in resumed, starts
    assert at[1] % per_commit == 0 and 0 <= batch - at[1] <= per_commit, starts
    # rolled back weights and position together: the same updates as an uninterrupted run
    for w, a in zip(keras_fit_reference(3), first["weights"]):
        assert np.all(np.isfinite(a))
        np.testing.assert_allclose(np.array(a), w, rtol=1e-4, atol=1e-5)


def _environ() -> dict:
    environ = dict(os.environ)
    if os.geteuid() == 0:
        environ.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return environ


def test_sigusr1_to_every_rank_writes_the_last_commit_exits_0_and_a_relaunch_resumes(tmp_path):
    import queue
    import threading
    n, path = 3, str(tmp_path / "preempted.pkl")
    script = str(JOBS / "elastic_preempt.py")
    proc = subprocess.Popen(mpirun_command(n) + [sys.executable, script, path, str(10 ** 9)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=_environ(), start_new_session=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(l) for l in proc.stdout] + [lines.put(None)], daemon=True).start()
    seen, pids, deadline = [], {}, time.monotonic() + 240
    try:
        while len(pids) < n:  # every rank has installed its handler and committed
            line = lines.get(timeout=max(1.0, deadline - time.monotonic()))
            assert line is not None, "".join(seen)
            seen.append(line)
            if line.startswith("READY "):
                rank, pid = line.split()[1:3]
                pids[int(rank)] = int(pid)
        for pid in pids.values():  # as Slurm's --signal (or mpirun forwarding it) does
            os.kill(pid, signal.SIGUSR1)
        rc = proc.wait(timeout=120)
    except (queue.Empty, subprocess.TimeoutExpired):
        kill_job(proc, marker=script)
        pytest.fail("the preempted job did not exit\n" + "".join(seen)[-3000:])
    while (line := lines.get(timeout=30)) is not None:
        seen.append(line)
    output = "".join(seen)
    assert rc == 0 and "RESULT" not in output, output  # a clean exit, before the end of training
    exits = sorted(int(l.split("step=")[1]) for l in output.splitlines() if l.startswith("EXIT "))
    assert len(exits) == n and len(set(exits)) == 1 and exits[0] >= 1, output  # all at the same commit
    from mpidist.elastic import read_checkpoint
    snapshot = read_checkpoint(path)
    stopped = snapshot["step"]
    assert stopped == exits[0], (snapshot, output)
    np.testing.assert_array_equal(snapshot["w"], replay(np.zeros(4), list(range(n)), 0, stopped))
    # the requeued job: resumes from the file and finishes
    steps = stopped + 4
    cmd = mpirun_command(n) + [sys.executable, script, path, str(steps)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=_environ(), timeout=240)
    got = results(out.stdout)
    assert out.returncode == 0 and sorted(r["rank"] for r in got) == list(range(n)), out.stdout + out.stderr
    for r in got:
        assert r["start"] == {"step": stopped, "w": snapshot["w"].tolist(), "resumed": True}, r
        assert r["step"] == steps
        np.testing.assert_array_equal(r["w"], replay(snapshot["w"], list(range(n)), stopped, steps))


def test_sigterm_to_mpirun_during_a_long_step_leaves_the_chiefs_last_commit(tmp_path):
    """mpirun forwards a SIGTERM and SIGKILLs its ranks about 0.2 s later, inside their 60 s step:
    the checkpoint is what the chief's handler wrote at the signal, and a relaunch resumes from it."""
    import queue
    import threading
    n, path = 3, str(tmp_path / "preempted.pkl")
    script = str(JOBS / "elastic_preempt.py")
    proc = subprocess.Popen(mpirun_command(n) + [sys.executable, script, path, "+3", "--step-seconds=60"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_environ(),
                            start_new_session=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(l) for l in proc.stdout] + [lines.put(None)], daemon=True).start()
    seen, ready, deadline = [], 0, time.monotonic() + 240
    try:
        while ready < n:  # every rank has committed twice and is in its long step
            line = lines.get(timeout=max(1.0, deadline - time.monotonic()))
            assert line is not None, "".join(seen)
            seen.append(line)
            ready += line.startswith("READY ")
        proc.send_signal(signal.SIGTERM)  # mpirun itself, as `kill` or a scheduler would
        rc = proc.wait(timeout=60)
    except (queue.Empty, subprocess.TimeoutExpired):
        kill_job(proc, marker=script)
        pytest.fail("the job did not end after SIGTERM to mpirun\n" + "".join(seen)[-3000:])
    while (line := lines.get(timeout=30)) is not None:
        seen.append(line)
    output = "".join(seen)
    assert rc != 0 and "EXIT " not in output, output  # the ranks were killed inside their step
    from mpidist.elastic import read_checkpoint
    snapshot = read_checkpoint(path)
    stopped = snapshot["step"]
    assert stopped >= 2, (snapshot, output)  # READY comes after the second commit
    np.testing.assert_array_equal(snapshot["w"], replay(np.zeros(4), list(range(n)), 0, stopped))
    out = subprocess.run(mpirun_command(n) + [sys.executable, script, path, "+3"], capture_output=True,
                         text=True, env=_environ(), timeout=240)
    got = results(out.stdout)
    assert out.returncode == 0 and sorted(r["rank"] for r in got) == list(range(n)), out.stdout + out.stderr
    for r in got:
        assert r["start"] == {"step": stopped, "w": snapshot["w"].tolist(), "resumed": True}, r
        np.testing.assert_array_equal(r["w"], replay(snapshot["w"], list(range(n)), stopped, stopped + 3))
