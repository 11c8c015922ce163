"""Two real "nodes" on this machine for the Slurm tests: the namespace technique of tests/two_nodes.

    reason = unavailable()            # None, or why two nodes cannot be made here (then: one node)
    nodes = Nodes(("node1", "node2"), environ)
    nodes.start()
    subprocess.run(nodes.enter(0, ["ip", "addr"]))          # in node1's network namespace
    subprocess.Popen(nodes.enter(1, ["slurmd", ...], host=True))  # in node2's, host name "node2"
    nodes.stop()

Node i is a network namespace of its own (its own loopback, one end of a veth pair carrying
198.18.0.(i+1)/24), so each node has its own address and its own ports, as real nodes do: two
slurmd daemons listen on the same port, and MPI between the nodes leaves shared memory and goes
over TCP. Both share one mount namespace, made here, whose /etc/hosts names the nodes. A daemon
started with ``host=True`` also gets a UTS namespace whose host name is the node's (what
``hostname`` and MPI_Get_processor_name say). Nothing here is reachable from outside these
namespaces and no traffic leaves them (the suite never reaches the network). The namespaces go when their
processes do: the two keepers (``sleep``) die with the test process (PR_SET_PDEATHSIG).
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from typing import Mapping, Sequence

NETWORK = "198.18.0"  # RFC 2544 benchmarking range: never routed, and only inside our namespaces
TOOLS = ("unshare", "nsenter", "ip", "hostname", "mount", "sh", "sleep")
_KEEP = "echo ready; exec sleep 100000"


def address(index: int) -> str:
    return f"{NETWORK}.{index + 1}"


def unavailable() -> str | None:
    """Why two nodes cannot be made here (as tests/two_nodes/run says), or None when they can."""
    if os.geteuid() != 0:
        return f"needs root (network, mount and UTS namespaces); this is uid {os.geteuid()}"
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return f"no {', '.join(missing)} on PATH"
    probes = [(["unshare", "--net", "--mount", "--uts", "true"], "unshare --net --mount --uts is refused"),
              (["unshare", "--net", "sh", "-c", "ip link add v0 type veth peer name v1"],
               "no veth devices in a network namespace")]
    for cmd, why in probes:
        try:
            if subprocess.run(cmd, capture_output=True, timeout=10).returncode != 0:
                return why
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{why} ({exc})"
    return None


def _die_with_parent() -> None:
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Nodes:
    """Network namespaces for ``names`` (two or more), one shared mount namespace (see above)."""

    def __init__(self, names: Sequence[str], environ: Mapping[str, str], workdir: str) -> None:
        self.names = list(names)
        self.environ = dict(environ)
        self.workdir = workdir
        self.machine = socket.gethostname().split(".")[0]
        self._keepers: list[subprocess.Popen] = []

    @property
    def addresses(self) -> list[str]:
        return [address(i) for i in range(len(self.names))]

    def enter(self, index: int, cmd: Sequence[str], host: bool = False) -> list[str]:
        """``cmd`` run in node ``index``'s namespaces (and, with ``host``, under its host name)."""
        keeper = self._keepers[index].pid
        prefix = ["nsenter", f"--net=/proc/{keeper}/ns/net", f"--mount=/proc/{self._keepers[0].pid}/ns/mnt", "--"]
        if host:  # `sh -c 'hostname NAME && exec "$@"'` in a fresh UTS namespace: the node's name
            prefix += ["unshare", "--uts", "--", "sh", "-c", 'hostname "$0" && exec "$@"', self.names[index]]
        return prefix + list(cmd)

    def start(self, timeout: float = 20.0) -> None:
        hosts = os.path.join(self.workdir, "hosts")
        with open(hosts, "w") as f:  # the machine's name too: clients and slurmctld keep it
            f.write(f"127.0.0.1 localhost {self.machine}\n")
            f.writelines(f"{a} {n}\n" for a, n in zip(self.addresses, self.names))
        # node 0: new network and mount namespaces (private propagation: unshare's default)
        first = f"mount --bind {hosts} /etc/hosts && ip link set lo up && {_KEEP}"
        self._keep(["unshare", "--net", "--mount", "sh", "-c", first], timeout)
        for _ in self.names[1:]:  # the others: a network namespace each, in node 0's mount namespace
            self._keep(["nsenter", f"--mount=/proc/{self._keepers[0].pid}/ns/mnt", "--", "unshare", "--net",
                        "sh", "-c", f"ip link set lo up && {_KEEP}"], timeout)
        # a veth pair from node 0 to each other node (one link per node: a star around node 0;
        # two nodes need just one)
        for i in range(1, len(self.names)):
            here, there = f"v{i}a", f"v{i}b"
            self._ip(0, "link", "add", here, "type", "veth", "peer", "name", there)
            self._ip(0, "link", "set", there, "netns", str(self._keepers[i].pid))
            if i == 1:
                self._ip(0, "addr", "add", f"{address(0)}/24", "dev", here)
            self._ip(i, "addr", "add", f"{address(i)}/24", "dev", there)
            self._ip(0, "link", "set", here, "up")
            self._ip(i, "link", "set", there, "up")
        if len(self.names) > 2:
            raise NotImplementedError("more than two nodes need a bridge in node 0")

    def _keep(self, cmd: list[str], timeout: float) -> None:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                env=self.environ, cwd=self.workdir, text=True, preexec_fn=_die_with_parent)
        self._keepers.append(proc)
        # "ready" comes at once; a failure prints and exits; a keeper that does neither is waited
        # for ``timeout`` seconds at most (select: a plain readline could block for ever)
        ready, _, _ = select.select([proc.stdout], [], [], timeout)
        line = proc.stdout.readline().strip() if ready else ""  # type: ignore[union-attr]
        if line != "ready":
            rest = proc.stdout.read() if proc.poll() is not None else ""  # type: ignore[union-attr]
            self.stop()
            raise RuntimeError(f"`{' '.join(cmd)}` did not set up its namespaces (expected 'ready', got "
                               f"{line!r}, exit {proc.poll()}): {rest}")

    def _ip(self, index: int, *args: str) -> None:
        proc = subprocess.run(self.enter(index, ["ip", *args]), capture_output=True, text=True, timeout=10)
        if proc.returncode != 0:
            raise RuntimeError(f"`ip {' '.join(args)}` in node {self.names[index]} exited with "
                               f"{proc.returncode}, expected 0: {proc.stdout}{proc.stderr}")

    def stop(self) -> None:
        """End the keepers (the namespaces then go with their last process). Idempotent."""
        for proc in self._keepers:
            if proc.poll() is None:
                proc.kill()
            with contextlib.suppress(Exception):
                proc.wait(5)
            if proc.stdout is not None:
                proc.stdout.close()
        self._keepers.clear()


if __name__ == "__main__":
    # python -m tests.slurm.nodes --check: exit 0 where two nodes can be made, else 77 and the reason
    # (tests/run's summary); without --check: make two nodes and show what each sees
    why = unavailable()
    if why:
        print(f"SKIP: two Slurm nodes cannot be made here: {why}")
        raise SystemExit(77)
    if sys.argv[1:] == ["--check"]:
        raise SystemExit(0)
    with tempfile.TemporaryDirectory() as d:
        n = Nodes(("node1", "node2"), os.environ, d)
        n.start()
        try:
            for i in range(2):
                print(subprocess.run(n.enter(i, ["sh", "-c", "hostname; ip -4 -o addr; cat /etc/hosts"], host=True),
                                     capture_output=True, text=True, timeout=10).stdout)
        finally:
            n.stop()
