"""A real Slurm for tests: Debian packages, daemons in a temporary directory, as root; one node
(this host) or two (two host names in namespaces of their own on this machine, see nodes.py).

    ensure_installed()               # apt-get install the packages once (idempotent)
    with SlurmCluster(nodes=2) as cluster:  # munged, slurmctld, a slurmd per node; stopped (and swept) on exit
        job = cluster.submit("slurm/cpu_multinode.sbatch", "job.py", options=["-N1", "-n2"])
        assert job.exit_code == 0, job
        job_id = cluster.sbatch("slurm/elastic.sbatch", "job.py")  # or: act on a job while it runs
        cluster.wait_for(job_id, lambda fields: fields["JobState"] == "RUNNING", 30, "the start")
        result = cluster.wait(job_id)

Every node advertises ``cpus`` CPUs whatever the hardware has (``SlurmdParameters=config_overrides``)
and ``gpus`` fake GPUs (character devices that are /dev/null, so Slurm sets CUDA_VISIBLE_DEVICES).
With two nodes, node1 and node2 are network namespaces of their own (198.18.0.1 and .2, joined by
a veth pair; their slurmd daemons run under those host names), slurmctld runs in node1's, and so
do the client commands (``command``, ``sbatch``): nothing listens outside the namespaces.
Every wait has a timeout; a failure message carries the daemons' log tails.
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import glob
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Mapping, Sequence

from .nodes import Nodes

PACKAGES = ("munge", "slurmctld", "slurmd", "slurm-client", "libpmix2")
COMMANDS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "sinfo", "scancel")
SBIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Variables of an outer launcher or allocation that would confuse our clients and jobs.
LAUNCHER_PREFIXES = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "PMIX_", "PMI_", "PRTE_", "OPAL_PREFIX")
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                "PREEMPTED", "BOOT_FAIL", "DEADLINE"}


class ClusterUnavailable(RuntimeError):
    """Slurm cannot run here (not root, no apt-get, packages not installable): tests should skip."""


def _which(command: str) -> str | None:
    return shutil.which(command, path=os.environ.get("PATH", "") + ":" + SBIN_PATH)


def _missing() -> list[str]:
    missing = [c for c in COMMANDS if _which(c) is None]
    if not glob.glob("/usr/lib/*/slurm-wlm/mpi_pmix*.so"):
        missing.append("slurm pmix plugin (mpi_pmix.so)")
    if not glob.glob("/usr/lib/*/pmix2/lib/libpmix.so.2"):
        missing.append("libpmix.so.2 (libpmix2)")
    return missing


def _run(cmd: Sequence[str], timeout: float, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as exc:
        raise ClusterUnavailable(f"`{' '.join(cmd)}` did not finish in {timeout:.0f} s") from exc


def ensure_installed(timeout: float = 300.0) -> None:
    """Install the Debian packages when a command or plugin is missing, then fix the pmix plugin.

    Raises ClusterUnavailable (with what was expected and what came) when that is not possible.
    """
    missing = _missing()
    if missing:
        if os.geteuid() != 0:
            raise ClusterUnavailable(f"Slurm is not installed (missing: {', '.join(missing)}) and "
                                     f"installing it needs root; this is uid {os.geteuid()}")
        apt = _which("apt-get")
        if apt is None:
            raise ClusterUnavailable(f"Slurm is not installed (missing: {', '.join(missing)}) and there "
                                     f"is no apt-get to install {' '.join(PACKAGES)}")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        opts = ["-o", "DPkg::Lock::Timeout=60", "-o", "Acquire::http::Timeout=30"]
        install = [apt, *opts, "install", "-y", "-qq", "--no-install-recommends", *PACKAGES]
        with _no_service_starts():  # the packages' postinst scripts must not start system daemons
            update = _run([apt, *opts, "update", "-qq"], timeout, env)  # a failure may still leave lists
            proc = _run(install, timeout, env)
        if proc.returncode != 0:
            raise ClusterUnavailable(
                f"`{' '.join(install)}` exited with {proc.returncode}, expected 0:\n"
                f"{(proc.stdout + proc.stderr)[-1500:]}\n(apt-get update exited with {update.returncode}: "
                f"{(update.stdout + update.stderr)[-500:]})")
        if _missing():
            raise ClusterUnavailable(f"still missing after apt-get install: {', '.join(_missing())}")
    # The pmix plugin dlopen()s the unversioned libpmix.so, which only libpmix-dev would provide.
    for versioned in glob.glob("/usr/lib/*/pmix2/lib/libpmix.so.2"):
        link = Path(versioned).with_name("libpmix.so")
        if not link.exists():
            if os.geteuid() != 0:
                raise ClusterUnavailable(f"{link} is missing (srun --mpi=pmix needs it) and creating it needs root")
            link.symlink_to("libpmix.so.2")


@contextlib.contextmanager
def _no_service_starts() -> Iterator[None]:
    policy = Path("/usr/sbin/policy-rc.d")
    if policy.exists():
        yield
        return
    policy.write_text("#!/bin/sh\nexit 101\n")
    policy.chmod(0o755)
    try:
        yield
    finally:
        policy.unlink(missing_ok=True)


def _die_with_parent() -> None:
    """preexec_fn of the daemons: SIGTERM when the test process dies, even of SIGKILL (Linux)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def kill_processes_of(conf: Path) -> list[int]:
    """SIGKILL every process whose environment holds SLURM_CONF=conf (daemons, steps, tasks)."""
    marker, killed = f"SLURM_CONF={conf}".encode(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
        except OSError:
            continue
    return killed


def clean_stale_clusters() -> None:
    """Remove the leftovers of test sessions that were killed (SIGKILL) before they could stop."""
    for root in Path(tempfile.gettempdir()).glob("mpidist-slurm-*"):
        try:
            owner = int((root / "owner").read_text())
            os.kill(owner, 0)
            continue  # its session still runs
        except (OSError, ValueError):
            pass
        kill_processes_of(root / "slurm.conf")
        if not (root / "kept").exists():
            shutil.rmtree(root, ignore_errors=True)


def _free_ports(count: int) -> list[int]:
    """``count`` distinct free ports: all held open together (one port released and asked for
    again can come back), each bound on every interface as slurmctld and slurmd bind theirs (a
    port free on loopback alone may be taken on another address)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def clean_environ(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (default os.environ) without the variables of an outer launcher or allocation."""
    env = dict(os.environ if base is None else base)
    return {k: v for k, v in env.items()
            if not k.startswith(LAUNCHER_PREFIXES)
            and not (k.startswith("OMPI_") and not k.startswith("OMPI_ALLOW_RUN_AS_ROOT"))}


@dataclass
class JobResult:
    job_id: str
    state: str        # COMPLETED, FAILED, CANCELLED, TIMEOUT, ...
    exit_code: int    # the batch script's exit status (ExitCode=N:S)
    signal: int       # the signal that ended it, 0 if none
    output: str       # stdout and stderr of the batch script and all its steps
    seconds: float    # from submission to a final state

    def tagged(self, tag: str = "MPIDIST ") -> list[str]:
        """The output lines that start with ``tag``, without it."""
        return [line[len(tag):] for line in self.output.splitlines() if line.startswith(tag)]

    def __str__(self) -> str:
        return (f"job {self.job_id}: {self.state}, exit code {self.exit_code}, signal {self.signal}, "
                f"{self.seconds:.1f} s; output:\n{self.output}")


class SlurmCluster:
    """slurmctld and a slurmd per node as root, in a fresh temporary directory: ``nodes=1`` runs
    them on this host as it is, ``nodes=2`` on two nodes made of namespaces (see nodes.py; only
    where :func:`nodes.unavailable` says nothing)."""

    def __init__(self, cpus: int = 4, gpus: int = 4, nodes: int = 1) -> None:
        if nodes not in (1, 2):
            raise ValueError(f"SlurmCluster: `nodes` must be 1 or 2, got {nodes}")
        self.cpus, self.gpus = cpus, gpus
        self.host = socket.gethostname().split(".")[0]  # what `hostname -s` prints: slurmctld's host
        clean_stale_clusters()
        self.root = Path(tempfile.mkdtemp(prefix="mpidist-slurm-"))
        (self.root / "owner").write_text(str(os.getpid()))
        self.conf = self.root / "slurm.conf"
        self.node_names = [self.host] if nodes == 1 else ["node1", "node2"]
        self.one_node_reason: str | None = None  # why a one-node cluster was made (set by its maker)
        self._nodes = Nodes(self.node_names, self.environ(), str(self.root)) if nodes > 1 else None
        self._procs: dict[str, subprocess.Popen] = {}
        self._started = False

    def _in_node(self, index: int, cmd: Sequence[str], host: bool = False) -> list[str]:
        """``cmd`` as run on node ``index`` (unchanged on a one-node cluster)."""
        return list(cmd) if self._nodes is None else self._nodes.enter(index, cmd, host=host)

    # ---- environment for clients and jobs ----------------------------------------------------
    def environ(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = clean_environ()
        env["PATH"] = env.get("PATH", "") + ":" + SBIN_PATH
        env["SLURM_CONF"] = str(self.conf)  # clients find the cluster only through this
        if os.geteuid() == 0:               # Open MPI refuses root unless told
            env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        env.update(extra or {})
        return env

    def command(self, *cmd: str, timeout: float = 15.0, env: Mapping[str, str] | None = None,
                cwd: str | Path | None = None) -> subprocess.CompletedProcess:
        """Run a Slurm client command (or srun's program) against this cluster, on its first node."""
        return subprocess.run(self._in_node(0, cmd), capture_output=True, text=True, timeout=timeout,
                              env=self.environ(env), cwd=cwd)

    # ---- start / stop ------------------------------------------------------------------------
    def start(self, timeout: float = 30.0) -> None:
        atexit.register(self.stop)
        self._started = True
        for sub in ("state", "spool", "munge", "dev", "tmp"):
            (self.root / sub).mkdir(mode=0o700)
        for name in self.node_names:  # per node: what real nodes have on local disks (%n in slurm.conf)
            for sub in ("spool", "dev", "tmp"):  # tmp: the pmix plugin's per-step directories
                (self.root / sub / name).mkdir(mode=0o700)
        if self._nodes is not None:
            self._nodes.start()
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        munge_socket = self.root / "munge" / "munge.socket"
        gres = self._fake_gpus()
        self.conf.write_text(self._slurm_conf(munge_socket, gres))
        if gres:
            (self.root / "gres.conf").write_text("".join(
                f"NodeName={n} Name=gpu File={self.root}/dev/{n}/nvidia[0-{self.gpus - 1}]\n" for n in self.node_names))

        m = self.root / "munge"
        self._spawn("munged", 0, False, "munged", "-F", "-f", f"--key-file={key}", f"--socket={munge_socket}",
                    f"--pid-file={m / 'munged.pid'}", f"--log-file={m / 'munged.log'}", f"--seed-file={m / 'seed'}")
        self._wait(lambda: munge_socket.exists(), timeout, f"munged's socket {munge_socket}")
        self._spawn("slurmctld", 0, False, "slurmctld", "-D", "-f", str(self.conf))
        for i, name in enumerate(self.node_names):  # each under its node's host name
            self._spawn(f"slurmd-{name}", i, self._nodes is not None, "slurmd", "-D", "-f", str(self.conf), "-N", name)
        self._wait(self._nodes_idle, timeout, f"node(s) {','.join(self.node_names)} in state idle (sinfo)")

    def stop(self, timeout: float = 20.0) -> None:
        """Cancel jobs, stop the daemons, kill whatever still runs under this cluster. Idempotent."""
        if not self._started:
            return
        self._started = False
        with contextlib.suppress(Exception):
            if self._procs.get("slurmctld") and self._procs["slurmctld"].poll() is None:
                self.command("scancel", "--user", str(os.geteuid()), timeout=5)
                self._wait(lambda: not self.command("squeue", "-h", "-o", "%i", timeout=5).stdout.strip(),
                           timeout / 2, "no jobs left in squeue")
        for name in [*(f"slurmd-{n}" for n in self.node_names), "slurmctld", "munged"]:
            proc = self._procs.pop(name, None)
            if proc is not None and proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout / 4)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
        kill_processes_of(self.conf)
        if self._nodes is not None:
            self._nodes.stop()
        if os.environ.get("MPITEST_SLURM_KEEP") == "1":
            (self.root / "kept").touch()
            print(f"slurm test cluster kept in {self.root}")
        else:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> "SlurmCluster":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- jobs --------------------------------------------------------------------------------
    def submit(self, script: str | Path, *args: str, options: Sequence[str] = (),
               env: Mapping[str, str] | None = None, cwd: str | Path | None = None,
               timeout: float = 150.0) -> JobResult:
        """sbatch ``script`` with ``args``, wait for a final state (polling scontrol), return the result."""
        start = time.monotonic()
        job_id = self.sbatch(script, *args, options=options, env=env, cwd=cwd)
        return self.wait(job_id, timeout, start=start)

    def sbatch(self, script: str | Path, *args: str, options: Sequence[str] = (),
               env: Mapping[str, str] | None = None, cwd: str | Path | None = None) -> str:
        """sbatch ``script`` with ``args`` (output to :meth:`output_path`); return the job id at once."""
        cmd = ["sbatch", "--parsable", f"--output={self.root / 'job-%j.out'}", "--time=2", *options,
               str(script), *args]
        proc = subprocess.run(self._in_node(0, cmd), capture_output=True, text=True, timeout=15, cwd=cwd,
                              env=self.environ(env))
        if proc.returncode != 0:
            raise RuntimeError(f"`{' '.join(cmd)}` exited with {proc.returncode}, expected a job id:\n"
                               f"{proc.stdout}{proc.stderr}")
        return proc.stdout.strip().split(";")[0]

    def output_path(self, job_id: str) -> Path:
        """Where the job's stdout and stderr go (every run of a requeued job appends to it)."""
        return self.root / f"job-{job_id}.out"

    def wait_for(self, job_id: str, ready: Callable[[dict[str, str]], bool], timeout: float, what: str) -> dict[str, str]:
        """Poll ``scontrol show job`` until ``ready(fields)``; the fields then. TimeoutError (with the
        job's state, output and the daemons' logs) after ``timeout`` seconds, the job cancelled."""
        deadline, fields = time.monotonic() + timeout, {}
        while time.monotonic() < deadline:
            fields = self.job_fields(job_id)
            if ready(fields):
                return fields
            time.sleep(0.2)
        self.command("scancel", job_id)
        raise TimeoutError(f"job {job_id}: waited {timeout:.0f} s for {what}, it did not come: "
                           f"JobState={fields.get('JobState')} Reason={fields.get('Reason')}; output so far:\n"
                           f"{self._read(self.output_path(job_id))}\n{self.logs()}")

    def wait(self, job_id: str, timeout: float = 150.0, start: float | None = None) -> JobResult:
        """Wait for a final state of the job; its result (``seconds`` counted from ``start``)."""
        start = time.monotonic() if start is None else start
        fields = self.wait_for(job_id, lambda f: f.get("JobState") in FINAL_STATES, timeout, "a final state")
        code, _, sig = fields.get("ExitCode", "-1:0").partition(":")
        output = self._read(self.output_path(job_id))
        return JobResult(job_id, fields["JobState"], int(code), int(sig or 0), output, time.monotonic() - start)

    def job_fields(self, job_id: str) -> dict[str, str]:
        text = self.command("scontrol", "-o", "show", "job", job_id).stdout
        return dict(m.groups() for m in re.finditer(r"(\w+)=(\S*)", text))

    def logs(self, chars: int = 1500) -> str:
        parts = []
        for path in [*sorted(self.root.glob("*.log")), *sorted(self.root.glob("*.stderr")),
                     *sorted(self.root.glob("munge/*.log"))]:
            parts.append(f"--- {path.name} (last {chars} characters)\n{self._read(path)[-chars:]}")
        return "\n".join(parts)

    # ---- internals ---------------------------------------------------------------------------
    def _slurm_conf(self, munge_socket: Path, gres: str) -> str:
        r = self.root
        ctld_port, slurmd_port = _free_ports(2)
        addresses = ["127.0.0.1"] if self._nodes is None else self._nodes.addresses
        node_lines = "\n".join(f"NodeName={n} NodeAddr={a} CPUs={self.cpus} {gres} State=UNKNOWN"
                               for n, a in zip(self.node_names, addresses))
        # one port for every slurmd (each node has its own addresses); %n: the node's name
        return f"""\
ClusterName=mpidisttest
SlurmctldHost={self.host}({addresses[0]})
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool/%n
TmpFS={r}/tmp/%n
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd-%n.pid
SlurmctldLogFile={r}/slurmctld.log
SlurmdLogFile={r}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MailProg=/bin/true
SchedulerType=sched/builtin
SchedulerParameters=batch_sched_delay=0,sched_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
KillWait=5
MinJobAge=600
{"GresTypes=gpu" if gres else ""}
{node_lines}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""

    def _fake_gpus(self) -> str:
        """Character devices standing for GPUs (Slurm sets CUDA_VISIBLE_DEVICES from their numbers)."""
        try:
            for name in self.node_names:
                for i in range(self.gpus):
                    os.mknod(self.root / "dev" / name / f"nvidia{i}", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
        except OSError:
            self.gpus = 0  # no mknod here (unprivileged container): no GPU tests
        return f"Gres=gpu:{self.gpus}" if self.gpus else ""

    def _spawn(self, name: str, node: int, host: bool, *cmd: str) -> None:
        """Start a daemon on node ``node`` (with ``host``: under the node's host name)."""
        exe = _which(cmd[0])
        if exe is None:
            raise ClusterUnavailable(f"{cmd[0]} not found on PATH or in {SBIN_PATH}")
        log = open(self.root / f"{name}.stderr", "w")
        with log:
            self._procs[name] = subprocess.Popen(self._in_node(node, [exe, *cmd[1:]], host), stdin=subprocess.DEVNULL, stdout=log,
                                                 stderr=subprocess.STDOUT, env=self.environ(),
                                                 cwd=self.root, start_new_session=True,
                                                 preexec_fn=_die_with_parent)

    def _nodes_idle(self) -> bool:
        for name, proc in self._procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode} while starting, expected it to run:\n"
                                   f"{self._read(self.root / f'{name}.stderr')}\n{self.logs()}")
        states = self.command("sinfo", "-h", "-N", "-o", "%N %T", timeout=5).stdout.split()
        return dict(zip(states[::2], states[1::2])) == {n: "idle" for n in self.node_names}

    def _wait(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready():
                return
            time.sleep(0.1)
        raise TimeoutError(f"waited {timeout:.0f} s for {what}, it did not come\n{self.logs()}")

    @staticmethod
    def _read(path: Path) -> str:
        try:
            return path.read_text(errors="replace")
        except OSError as exc:
            return f"<cannot read {path}: {exc.strerror}>"
