"""mpidist run's and mpidist horovodrun's decisions, one process, no MPI job: what a command line
runs, TF_CONFIG's check, the GPU of a rank, horovodrun's flags as a launcher command, the Keras 2
hint, and `import horovod` resolving to mpidist.horovod only when installed."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import pytest

from mpidist.launch import gpus, hints, horovodrun, target, tf_config
from mpidist.launch.target import LaunchError

# -- what runs ----------------------------------------------------------------------------------


def test_a_program_file_its_arguments_and_python_in_front(tmp_path):
    program = tmp_path / "train.py"
    program.write_text("pass\n")
    chosen = target.resolve([str(program), "--epochs", "3"])
    assert (chosen.kind, chosen.what, chosen.argv) == ("path", str(program), [str(program), "--epochs", "3"])
    chosen = target.resolve([os.path.basename(sys.executable), "-u", str(program), "x"])
    assert (chosen.kind, chosen.argv, chosen.unbuffered) == ("path", [str(program), "x"], True)
    assert target.resolve(["-m", "pkg.mod", "a"]).argv == ["pkg.mod", "a"]
    assert target.resolve(["-c", "print(1)", "a"]).argv == ["-c", "a"]


def test_a_console_command_is_run_when_its_file_is_python(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "cli-train"
    script.write_text(f"#!{sys.executable}\nimport sys\n")
    script.chmod(0o755)
    shell = bin_dir / "shell-tool"
    shell.write_text("#!/bin/sh\necho hi\n")
    shell.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    chosen = target.resolve(["cli-train", "out"])
    assert (chosen.kind, chosen.what, chosen.argv) == ("path", str(script), ["cli-train", "out"])
    with pytest.raises(LaunchError, match=r"the command 'shell-tool' \(.*\) is not a Python program"):
        target.resolve(["shell-tool"])


@pytest.mark.parametrize("args, message", [
    ([], "nothing to run"),
    (["missing.py"], "no such program: 'missing.py'"),
    (["no-such-command-here"], "neither a file nor a command on PATH"),
    (["-m"], "-m needs a module name"),
    (["python3", "-X", "dev", "t.py"], "python option '-X' is not supported"),
])
def test_what_cannot_run_says_why(args, message):
    with pytest.raises(LaunchError, match=message):
        target.resolve(args)


def test_execute_runs_a_file_as_main_with_its_directory_first(tmp_path, monkeypatch):
    program = tmp_path / "prog.py"
    (tmp_path / "sibling.py").write_text("VALUE = 42\n")
    program.write_text("import sys, sibling\nsys.modules['mpidist_test_result'] = (__name__, sibling.VALUE, "
                       "list(sys.argv))\n")
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    target.execute(target.resolve([str(program), "a"]))
    assert sys.modules.pop("mpidist_test_result") == ("__main__", 42, [str(program), "a"])
    sys.modules.pop("sibling", None)


# -- TF_CONFIG ----------------------------------------------------------------------------------

def config(cluster, task_type="worker", index=0):
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


def test_tf_config_agrees_when_the_cluster_shape_and_the_place_of_this_rank_do():
    assert tf_config.differences(config({"worker": ["a:1", "b:1"]}, index=1), 1, 2) == []
    chief_first = {"chief": ["a:1"], "worker": ["b:1", "c:1"]}
    assert tf_config.differences(config(chief_first, "chief", 0), 0, 3) == []
    assert tf_config.differences(config(chief_first, "worker", 1), 2, 3) == []


def test_tf_config_differences_are_named():
    assert tf_config.differences(config({"worker": ["a:1"]}), 0, 2) == [
        "it lists 1 chief/worker task(s), MPI has 2 rank(s)"]
    assert tf_config.differences(config({"worker": ["a:1", "b:1"]}, index=0), 1, 2) == [
        "rank 1 is task worker:0 there (replica 0), not replica 1"]
    found = tf_config.differences(config({"worker": ["a:1"], "ps": ["p:1"]}), 0, 1)
    assert found == ["it has job(s) ps, which a MultiWorkerMirroredStrategy job does not"]
    assert tf_config.differences("{not json", 0, 1)[0].startswith("it is not a TF_CONFIG")


# -- GPUs ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("environ, driver, local_rank, index", [
    ({}, 0, 1, None),                                  # no GPU
    ({}, 4, 1, 1),                                     # the driver shows 4: local rank 1 takes GPU 1
    ({}, 2, 3, 1),                                     # more ranks than GPUs: round robin
    ({"CUDA_VISIBLE_DEVICES": "5"}, 8, 3, None),       # the launcher gave one GPU per task
    ({"CUDA_VISIBLE_DEVICES": "2,3"}, 8, 1, 1),        # index into the visible list
    ({"CUDA_VISIBLE_DEVICES": ""}, 8, 0, None),        # none visible
])
def test_a_rank_uses_its_node_local_gpu(environ, driver, local_rank, index):
    assert gpus.plan(local_rank, 4, environ, driver_count=driver).index == index


def test_gpu_choice_off():
    chosen = gpus.plan(1, 2, {}, driver_count=4, enabled=False)
    assert chosen.index is None and "MPIDIST_BIND_GPU=0" in chosen.reason


# -- horovodrun ---------------------------------------------------------------------------------

def test_horovodrun_flags_become_open_mpi_options():
    cmd = horovodrun.build(["-np", "4", "-H", "n1:2,n2:2", "-p", "2222", "--network-interface", "eth1",
                            "--fusion-threshold-mb", "64", "--cycle-time-ms", "2.5", "--hierarchical-allreduce",
                            "--timeline-filename", "/tmp/t.json", "--mpi-args=--tag-output",
                            "python3", "train.py", "--lr", "0.1"], "Open MPI", {"HOME": "/root", "PWD": "/x"})
    argv = cmd.argv
    assert argv[1:9] == ["-n", "4", "--bind-to", "none", "--map-by", "slot", *argv[7:9]]
    assert argv[argv.index("--host") + 1] == "n1:2,n2:2"
    assert argv[argv.index("plm_rsh_args") + 1] == "-p 2222"
    assert argv[argv.index("btl_tcp_if_include") + 1] == argv[argv.index("oob_tcp_if_include") + 1] == "eth1"
    exported = [argv[i + 1] for i, a in enumerate(argv) if a == "-x"]
    assert "HOME" in exported and "PWD" not in exported and "HOROVOD_FUSION_THRESHOLD" in exported
    assert argv[-8:] == ["--tag-output", "python3", "-m", "mpidist", "run", "train.py", "--lr", "0.1"]
    assert cmd.env == {"HOROVOD_FUSION_THRESHOLD": str(64 << 20), "HOROVOD_CYCLE_TIME": "2.5",
                       "HOROVOD_TIMELINE": "/tmp/t.json", "HOROVOD_HIERARCHICAL_ALLREDUCE": "1"}


def test_horovodrun_defaults_to_this_host_and_runs_a_command_in_this_python():
    argv = horovodrun.build(["-np", "2", "train-cli", "a"], "Open MPI", {}).argv
    assert argv[argv.index("--host") + 1] == "localhost:2"
    assert argv[-6:] == [sys.executable, "-m", "mpidist", "run", "train-cli", "a"]


def test_horovodrun_inside_a_slurm_allocation_uses_srun():
    cmd = horovodrun.build(["-np", "8", "--gloo", "python", "t.py"], "Open MPI", {"SLURM_JOB_ID": "12"})
    assert cmd.argv[1:5] == ["-n", "8", "--mpi=pmix", "--kill-on-bad-exit=1"]
    assert os.path.basename(cmd.argv[0]) == "srun" and cmd.argv[-5:] == ["python", "-m", "mpidist", "run", "t.py"]
    assert any("--gloo" in note for note in cmd.notes)
    hosts = horovodrun.build(["-np", "2", "-H", "a:2", "python", "t.py"], "Open MPI", {"SLURM_JOB_ID": "12"})
    assert "--host" in hosts.argv  # hosts given: mpirun inside the allocation


def test_horovodrun_for_mpich_converts_a_horovod_hostfile(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# nodes\nnode1 slots=2\nnode2 slots=4\n")
    cmd = horovodrun.build(["-np", "6", "--hostfile", str(hostfile), "python", "t.py"], "MPICH", {})
    try:
        assert cmd.argv[1:4] == ["-n", "6", "-f"]
        with open(cmd.temporary) as f:
            assert f.read() == "node1:2\nnode2:4\n"
    finally:
        os.unlink(cmd.temporary)
    with pytest.raises(LaunchError, match="Hydra takes no ssh port"):
        horovodrun.build(["-np", "2", "-p", "22", "python", "t.py"], "MPICH", {})


@pytest.mark.parametrize("args, message", [
    (["-np", "2", "--autotune", "python", "t.py"], "horovodrun flag --autotune is not supported by mpidist "
                                                   "horovodrun"),
    (["-np", "2"], "no command to run"),
    (["python", "t.py"], "the following arguments are required: -np/--num-proc"),
    (["-np", "2", "-H", "a:2", "--hostfile", "f", "python", "t.py"], "give -H/--hosts or --hostfile, not both"),
])
def test_horovodrun_refuses_clearly(args, message):
    with pytest.raises(LaunchError, match=message):
        horovodrun.build(args, "Open MPI", {})


def test_the_printed_command_sums_up_the_exports():
    cmd = horovodrun.build(["-np", "2", "python", "t.py"], "Open MPI", {"A": "1", "B": "2"})
    line = horovodrun.shown(cmd, verbose=False)
    assert "-x <2 variables>" in line and "-x A" not in line
    assert "-x A -x B" in horovodrun.shown(cmd, verbose=True)


# -- the Keras 2 hint ---------------------------------------------------------------------------

def test_keras_2_line_failing_under_keras_3_gets_a_hint(tmp_path, monkeypatch):
    program = tmp_path / "prog.py"
    program.write_text("class Opt:\n    variables = []\n\nopt = Opt()\nopt.variables()\n")
    monkeypatch.setitem(sys.modules, "keras", types.SimpleNamespace(__version__="3.15.0"))
    monkeypatch.delenv("TF_USE_LEGACY_KERAS", raising=False)
    with pytest.raises(TypeError) as caught:
        exec(compile(program.read_text(), str(program), "exec"), {})
    assert hints.keras2_hint(caught.value) == (
        "mpidist run: prog.py:5 is Keras 2 code (optimizer.variables() (a list in Keras 3, not a method)), which "
        "Keras 3 rejects; run it under Keras 2: `mpidist run --keras 2 ...` (needs `pip install tf_keras`)")
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "1")
    assert hints.keras2_hint(caught.value) is None  # already Keras 2: another problem


# -- import horovod -----------------------------------------------------------------------------

def test_horovod_names_resolve_only_where_installed():
    code = ("import sys, importlib\n"
            "try:\n    import horovod\nexcept ImportError:\n    print('plain: no horovod')\n"
            "from mpidist.launch import aliases\naliases.install()\n"
            "import horovod, mpidist.horovod\n"
            "from horovod.runner import run\n"
            "print(horovod is mpidist.horovod, horovod.__version__, run is mpidist.horovod.run,\n"
            "      horovod.__spec__.name)\n"
            "try:\n    import horovod.torch\nexcept ModuleNotFoundError as e:\n    print(e)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "plain: no horovod", "True 0.28.1 True mpidist.horovod",
        "mpidist run: `import horovod.torch`: mpidist provides Horovod's TensorFlow and Keras API only "
        "(horovod.tensorflow, horovod.tensorflow.keras, horovod.keras), not horovod.torch"]
