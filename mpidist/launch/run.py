"""``mpidist run``: a tf.distribute or Horovod program, unchanged, on the ranks of an MPI job.

    mpirun -n 8 mpidist run train.py --epochs 3
    srun mpidist run -m package.module args
    mpirun -n 4 mpidist run [--keras 2] some-console-command args

Before the program's first line (and without importing TensorFlow unless the program does):

- ``import horovod...`` resolves to ``mpidist.horovod`` (aliases.py);
- TensorFlow's strategy names build mpidist's strategies once TensorFlow is imported (tf_names.py);
- ``TF_CONFIG`` describes the MPI job (tf_config.py);
- each rank uses its node-local GPU, when there are several (gpus.py);
- ``--keras 2`` makes ``tf.keras`` Keras 2 (``TF_USE_LEGACY_KERAS=1``); ``--keras 3`` the opposite.

The chief prints one line to stderr: ranks, nodes and what the names resolve to. The exit status
is the program's; an uncaught exception on any rank ends the whole job (as under ``python -m
mpi4py``), with a one-line hint when it is a Keras 2 line failing under Keras 3 (hints.py).
See docs/launch.md.
"""
from __future__ import annotations

import importlib.util
import os
import runpy
import sys
from types import ModuleType, TracebackType
from typing import Any

from . import aliases, gpus, hints, post_import, target, tf_config, tf_names

__all__ = ["main", "resolution", "USAGE"]

USAGE = ("usage: mpidist run [--keras {2,3}] PROGRAM.py ARGS | -m MODULE ARGS | -c CODE ARGS | COMMAND ARGS\n"
         "       (under mpirun/srun: mpirun -n 4 mpidist run train.py; see docs/launch.md)")
_SKIPPED_FILES = (os.path.dirname(os.path.abspath(__file__)) + os.sep,)


class _Options:
    keras: str | None = None


def _parse(argv: list[str]) -> tuple[_Options, list[str]]:
    options, args = _Options(), list(argv)
    while args and args[0].startswith("--"):
        option = args.pop(0)
        if option == "--":
            break
        if option in ("--help",):
            raise target.LaunchError(USAGE)
        name, _, value = option.partition("=")
        if name != "--keras":
            raise target.LaunchError(f"mpidist run: unknown option {option!r}\n{USAGE}")
        if not value:
            if not args:
                raise target.LaunchError("mpidist run: --keras needs 2 or 3")
            value = args.pop(0)
        if value not in ("2", "3"):
            raise target.LaunchError(f"mpidist run: --keras must be 2 or 3, got {value!r}")
        options.keras = value
    if args and args[0] in ("-h",):
        raise target.LaunchError(USAGE)
    return options, args


def _keras_setting(keras: str | None) -> None:
    if keras is None:
        return
    if "tensorflow" in sys.modules or "keras" in sys.modules:
        raise target.LaunchError("mpidist run: --keras must act before TensorFlow is imported, but it already is "
                                 "(a sitecustomize or .pth file imported it)")
    if keras == "2":
        if importlib.util.find_spec("tf_keras") is None:
            raise target.LaunchError("mpidist run: --keras 2 needs Keras 2: `pip install tf_keras` (the version "
                                     "of TensorFlow's minor release, e.g. tf_keras==2.21.*)")
        os.environ["TF_USE_LEGACY_KERAS"] = "1"
    else:
        os.environ["TF_USE_LEGACY_KERAS"] = "0"


def _keras_name() -> str:
    legacy = os.environ.get("TF_USE_LEGACY_KERAS", "").strip().lower() in ("1", "true", "yes")
    return "Keras 2 (tf_keras)" if legacy else "Keras 3"


def resolution(topology: Any, plan: gpus.Plan, config: dict[str, Any] | None) -> list[str]:
    """What ``mpidist run`` resolves on this job, one fact a line (the chief's start line, ``mpidist check``)."""
    nodes = topology.num_nodes
    per_node = ", ".join(map(str, topology.node_sizes)) if nodes > 1 else str(topology.size)
    workers = len(config["cluster"].get("worker", [])) + len(config["cluster"].get("chief", [])) if config else 0
    return [f"{topology.size} rank(s) on {nodes} node(s) ({per_node} per node"
            f"{', faked by MPIDIST_LOCAL_SIZE' if topology.faked_nodes else ''})",
            f"horovod -> {aliases.TARGET} (Horovod's TensorFlow/Keras API)",
            "tf.distribute strategies -> mpidist's",
            f"TF_CONFIG: {workers} worker(s), task index = rank" if config else "TF_CONFIG: not set",
            f"tf.keras: {_keras_name()}",
            f"GPU: {plan.reason}"]


def _setup(topology: Any) -> tuple[gpus.Plan, dict[str, Any]]:
    """Everything the program must find in place (collective over COMM_WORLD)."""
    from .._config import rc
    from ..topology import abort
    abort.install()  # an uncaught exception on one rank ends the job, from the program's first line
    config = tf_config.export(topology.comm)
    plan = gpus.plan(topology.local_rank, topology.local_size, enabled=rc.bind_gpu)

    def on_tensorflow(tf: ModuleType) -> None:
        tf_names.install(tf)
        gpus.apply_tensorflow(tf, plan)

    post_import.when_imported("tensorflow", on_tensorflow)
    post_import.when_imported("cupy", lambda cupy: gpus.apply_cupy(cupy, plan))
    aliases.install()
    return plan, config


def _trimmed(tb: TracebackType | None) -> TracebackType | None:
    """The traceback from the program's first frame on (mpidist run's and runpy's frames cut)."""
    while tb is not None and (tb.tb_frame.f_code.co_filename.startswith(_SKIPPED_FILES)
                              or tb.tb_frame.f_code.co_filename in ("<frozen runpy>", runpy.__file__)):
        tb = tb.tb_next
    return tb


def _exit_code(error: SystemExit) -> int:
    code = error.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _agreed(comm: Any, error: str | None) -> str | None:
    """The first rank's error of a step that every rank takes (a file missing on one node only)."""
    errors = comm.allgather(error)
    failed = [(r, e) for r, e in enumerate(errors) if e is not None]
    if not failed:
        return None
    rank, first = failed[0]
    return first if all(e == first for _, e in failed) and len(failed) == len(errors) else f"rank {rank}: {first}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        options, args = _parse(argv)
        _keras_setting(options.keras)
    except target.LaunchError as error:
        print(error, file=sys.stderr)
        return 2
    from mpi4py import MPI

    from ..topology import Topology, check_world_size
    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    if check_world_size(world.Get_size()) is not None:  # it logged why (srun's --mpi plugin, most often)
        print("mpidist run: not running the program as N separate one-rank jobs", file=sys.stderr)
        return 1
    chosen: target.Target | None = None
    try:
        chosen = target.resolve(args, quiet=rank != 0)
        problem = None
    except target.LaunchError as error:
        problem = str(error)
    problem = _agreed(world, problem)
    if problem is not None:
        if rank == 0:
            print(problem if problem.startswith("mpidist run") else f"mpidist run: {problem}", file=sys.stderr)
        return 2
    assert chosen is not None
    topology = Topology(world)
    try:
        plan, config = _setup(topology)
        if rank == 0:
            print(f"mpidist run: {chosen.describe()}: " + "; ".join(resolution(topology, plan, config)),
                  file=sys.stderr, flush=True)
    finally:
        topology.free()
    return _execute(chosen, world.Get_size())


def _execute(chosen: target.Target, size: int) -> int:
    try:
        target.execute(chosen)
    except SystemExit as error:
        return _exit_code(error)
    except BaseException as error:  # the program's own uncaught exception: shown and ended as python would
        hint = hints.keras2_hint(error)
        if hint is not None and hasattr(error, "add_note"):
            error.add_note(hint)
        elif hint is not None:
            print(hint, file=sys.stderr)
        trimmed = _trimmed(error.__traceback__)
        error.__traceback__ = trimmed  # shown from the program's first frame, as `python PROGRAM` shows it
        sys.excepthook(type(error), error, trimmed)  # mpidist's hook also ends a job of many ranks
        return 130 if isinstance(error, KeyboardInterrupt) else 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
    return 0
