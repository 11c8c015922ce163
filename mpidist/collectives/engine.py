"""The collective engine: logical collectives on nests of host arrays over one Topology.

Every public call does the same steps, in the same order on every rank:

1. refuse if an earlier collective on this engine timed out (the communicator state is unknown);
2. flatten the nest, turn leaves into contiguous NumPy arrays, validate arguments;
3. agree: one 16-byte Allreduce checks that every rank issues the same collective
   (``rc.check_agreement``; see agreement.py);
4. run the collective module (allreduce.py, broadcast.py …) pack by pack, each pack with the
   flat or hierarchical algorithm (``algorithm=`` or ``rc.algorithm``; "auto" by topology and size);
5. rebuild the nest with results of the same kinds, dtypes and shapes.

With ``timeout_seconds`` (or ``rc.timeout_seconds``) every MPI step is non-blocking and the whole
collective must finish by the deadline, else DeadlineExceededError (see deadline.py).
"""
from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np
from mpi4py import MPI

from .._config import rc
from ..errors import CommunicatorBrokenError
from ..topology import Topology
from . import agreement, allgather, allreduce, arrays, broadcast, nest, packing, reduce, reduce_scatter, stall, timeline
from . import gpu  # GPU dispatch hook (issue 8): device arrays go to collectives/gpu
from .algorithms import choose
from .deadline import Caller, check_timeout
from .fastpath import FastPaths
from .ops import Op, parse_op

_ALGORITHMS = ("auto", "flat", "hierarchical")


class _Call:
    """What one logical collective's modules need: topology, MPI caller, packing and algorithm."""

    __slots__ = ("where", "topo", "call", "size", "algorithm_name", "threshold", "bytes_per_pack", "num_packs")

    def __init__(self, where: str, topo: Topology, call: Caller, algorithm: str, bytes_per_pack: int,
                 num_packs: int | None) -> None:
        self.where, self.topo, self.call, self.size = where, topo, call, topo.size
        self.algorithm_name, self.threshold = algorithm, rc.hierarchical_threshold
        self.bytes_per_pack, self.num_packs = bytes_per_pack, num_packs

    def plan(self, nbytes: list[int], groups: list[Any]) -> list[list[int]]:
        return packing.plan(nbytes, groups, self.bytes_per_pack, self.num_packs)

    def algorithm(self, nbytes: int) -> ModuleType:
        return choose(self.algorithm_name, self.topo, nbytes, self.threshold)


class Engine:
    """Collectives over a private clone of ``comm`` (default COMM_WORLD).

    Creating an Engine is collective over ``comm``. ``local_size`` fakes nodes of that many
    consecutive ranks (default ``rc.local_size``). Every method is collective: all ranks of the
    communicator must call it, in the same order, with matching arguments.
    """

    def __init__(self, comm: MPI.Intracomm | None = None, *, local_size: int | None = None,
                 topology: Topology | None = None) -> None:
        self.topology = topology if topology is not None else Topology(comm, local_size=local_size)
        self._broken: str | None = None
        self._hashes: dict[tuple, int] = {}
        self._fast = FastPaths(self, self._key, _describe)
        self._monitor = stall.Monitor(self.topology.comm) if stall.enabled() else None
        self._track: tuple[Any, int] | None = None  # (timeline recorder, this engine's thread id there)

    @property
    def rank(self) -> int:
        return self.topology.rank

    @property
    def size(self) -> int:
        return self.topology.size

    @property
    def broken(self) -> str | None:
        """Why this engine refuses collectives, or None while it is usable."""
        return self._broken

    # -- public collectives, all in the same order ------------------------------------------------

    def allreduce(self, value: Any, op: Any = "sum", *, bytes_per_pack: int | None = None,
                  num_packs: int | None = None, algorithm: str | None = None,
                  timeout_seconds: float | None = None) -> Any:
        """Reduce ``value`` (an array, number or nest of them) over all ranks; every rank gets the result."""
        plain = bytes_per_pack is None and num_packs is None and algorithm is None and timeout_seconds is None
        if plain and self._broken is None:  # a repeat of an earlier plain call: see fastpath.py
            fast = self._fast.lookup(op, value)
            if fast is not None:
                return fast(value)
        where = "allreduce"
        red = parse_op(op, where)
        result = self._run(where, allreduce, value, (red.value, None), dict(op=red),
                           bytes_per_pack, num_packs, algorithm, timeout_seconds)
        if plain:
            self._fast.remember(op, red, value)
        return result

    def broadcast(self, value: Any, root: int = 0, *, bytes_per_pack: int | None = None,
                  num_packs: int | None = None, algorithm: str | None = None,
                  timeout_seconds: float | None = None) -> Any:
        """Every rank gets ``root``'s value. All ranks pass a value of the same structure, dtypes and shapes."""
        where = "broadcast"
        root = self._check_root(root, where)
        return self._run(where, broadcast, value, (None, root), dict(root=root),
                         bytes_per_pack, num_packs, algorithm, timeout_seconds)

    def allgather(self, value: Any, *, bytes_per_pack: int | None = None, num_packs: int | None = None,
                  algorithm: str | None = None, timeout_seconds: float | None = None) -> Any:
        """Concatenate every rank's value along axis 0 in rank order; axis 0 may differ per rank."""
        return self._run("allgather", allgather, value, (None, None), {},
                         bytes_per_pack, num_packs, algorithm, timeout_seconds)

    def reduce(self, value: Any, op: Any = "sum", root: int = 0, *, bytes_per_pack: int | None = None,
               num_packs: int | None = None, algorithm: str | None = None,
               timeout_seconds: float | None = None) -> Any:
        """Reduce over all ranks to ``root``; returns the result at the root and None elsewhere."""
        where = "reduce"
        red = parse_op(op, where)
        root = self._check_root(root, where)
        return self._run(where, reduce, value, (red.value, root), dict(op=red, root=root),
                         bytes_per_pack, num_packs, algorithm, timeout_seconds)

    def reduce_scatter(self, value: Any, op: Any = "sum", *, bytes_per_pack: int | None = None,
                       num_packs: int | None = None, algorithm: str | None = None,
                       timeout_seconds: float | None = None) -> Any:
        """Reduce over all ranks; rank r keeps block r of axis 0 (blocks as numpy.array_split cuts them)."""
        where = "reduce_scatter"
        red = parse_op(op, where)
        return self._run(where, reduce_scatter, value, (red.value, None), dict(op=red),
                         bytes_per_pack, num_packs, algorithm, timeout_seconds)

    def barrier(self, *, timeout_seconds: float | None = None) -> None:
        """Wait until every rank has called barrier (under the same deadline rules)."""
        self._check_usable("barrier")
        timeout = rc.timeout_seconds if timeout_seconds is None else check_timeout(timeout_seconds, "barrier")
        if self._monitor is not None:
            self._monitor.enter("barrier")
        try:
            Caller("barrier", timeout, self._break).nonblocking(self.topology.comm, "Barrier")
        finally:
            if self._monitor is not None:
                self._monitor.leave()

    def close(self) -> None:
        """Free the engine's communicators (collective). The caller's communicator is untouched."""
        if self._monitor is not None:
            self._monitor.close()
        self.topology.free()
        self._broken = "the engine was closed"

    # -- shared steps --------------------------------------------------------------------------------

    def _run(self, where: str, *args: Any) -> Any:
        monitor = self._monitor
        if monitor is None:
            return self._collective(where, *args)
        monitor.enter(where)
        try:
            return self._collective(where, *args)
        finally:
            monitor.leave()

    def _collective(self, where: str, module: ModuleType, value: Any, op_root: tuple, params: dict,
                    bytes_per_pack: int | None, num_packs: int | None, algorithm: str | None,
                    timeout_seconds: float | None) -> Any:
        if self._broken is not None:
            self._check_usable(where)
        rec = timeline.recorder()
        start = rec.now() if rec is not None else 0.0
        if bytes_per_pack is None and num_packs is None and algorithm is None:  # hot path: defaults
            bpp, npk, alg = rc.bytes_per_pack, None, rc.algorithm
        else:
            bpp, npk, alg = self._check_packing(where, bytes_per_pack, num_packs, algorithm)
        timeout = rc.timeout_seconds if timeout_seconds is None else check_timeout(timeout_seconds, where)
        if type(value) is np.ndarray and value.flags.c_contiguous and value.dtype.kind in "fiu":
            leaves, tree, host_arrays, adapters = None, nest.LEAF, [value], None  # hot path: one array
        else:
            leaves, tree = nest.flatten(value)
            # -- GPU dispatch hook (issue 8): nests holding device arrays run in collectives/gpu --
            if gpu.any_device(leaves):
                return gpu.collective(self, where, module, leaves, tree, op_root, params, alg, bpp, npk, timeout)
            # -- end of GPU dispatch hook --
            host_arrays, adapters = arrays.to_host_all(leaves, where)
        if module.validate is not None:
            module.validate(host_arrays, where)
        call = Caller(where, timeout, self._break)
        ctx = _Call(where, self.topology, call, alg, bpp, npk)
        prepared = agreed = None  # timeline marks: end of prepare, end of agreement
        if rc.check_agreement:
            key = self._key(where, op_root, "*" if tree is nest.LEAF else nest.structure_key(tree),
                            module.signature(host_arrays), alg, bpp, npk, timeout is not None)
            prepared = rec.now() if rec is not None else None
            agreement.agree(self.topology.comm, call, key, self._hashes, _describe, where)
        if rec is not None:
            prepared, agreed = timeline.agreed(rec, prepared, call)
        results = module.run(ctx, host_arrays, **params)
        if results is None:
            out = None
        elif adapters is None:
            out = results[0]
        else:
            out = nest.unflatten(tree, arrays.from_host_all(results, adapters, leaves))
        if rec is not None:
            self._record(rec, where, start, prepared, agreed, call.steps, host_arrays, op_root, alg)
        return out

    def _record(self, rec: Any, where: str, start: float, prepared: float, agreed: float | None,
                steps: Any, host_arrays: list[Any], op_root: tuple, alg: str, path: str | None = None) -> None:
        """Write one collective to the timeline (see timeline.py); ``path``: a GPU collective's path."""
        if self._track is None or self._track[0] is not rec:
            topo = self.topology
            self._track = (rec, rec.engine(f"engine {id(self) & 0xffff:04x}: {topo.size} ranks, "
                                           f"{topo.num_nodes} node(s), rank {topo.rank} here"))
        args: dict[str, Any] = {"leaves": len(host_arrays), "bytes": sum([a.nbytes for a in host_arrays]),
                                "algorithm": alg, "transfers": len(steps.items)}
        op, root = op_root
        if op is not None:
            args["op"] = Op(op).name
        if root is not None:
            args["root"] = root
        if path is not None:
            args["path"] = path
        timeline.write_collective(rec, self._track[1], where, start, prepared, agreed, steps, rec.now(), args)

    @staticmethod
    def _key(where: str, op_root: tuple, structure: str, signature: tuple, alg: str, bpp: int,
             npk: int | None, deadline: bool) -> tuple:
        """What ranks must agree on; see agreement.py and _describe."""
        return (where, op_root, structure, signature, alg,
                rc.hierarchical_threshold if alg == "auto" else None, bpp, npk, deadline)

    def _break(self, reason: str) -> None:
        self._broken = reason

    def _check_usable(self, where: str) -> None:
        if self._broken is not None:
            raise CommunicatorBrokenError(
                f"{where}: this communicator refuses collectives because {self._broken}. "
                f"Its ranks may be inside different collectives; end the job or build a new strategy/engine "
                f"on a fresh communicator.")

    def _check_root(self, root: Any, where: str) -> int:
        if isinstance(root, (bool, np.bool_)) or not isinstance(root, (int, np.integer)) \
                or not 0 <= root < self.size:
            raise ValueError(f"{where}: `root` must be a rank in [0, {self.size}), got {root!r}")
        return int(root)

    @staticmethod
    def _check_packing(where: str, bytes_per_pack: Any, num_packs: Any, algorithm: Any
                       ) -> tuple[int, int | None, str]:
        for name, v in (("bytes_per_pack", bytes_per_pack), ("num_packs", num_packs)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0):
                raise ValueError(f"{where}: `{name}` must be an integer >= 0, got {v!r}")
        if bytes_per_pack and num_packs is not None:
            raise ValueError(f"{where}: give `bytes_per_pack` or `num_packs`, not both "
                             f"(got {bytes_per_pack!r} and {num_packs!r})")
        alg = rc.algorithm if algorithm is None else algorithm
        if alg not in _ALGORITHMS:
            raise ValueError(f"{where}: `algorithm` must be one of {', '.join(_ALGORITHMS)}, got {algorithm!r}")
        bpp = rc.bytes_per_pack if bytes_per_pack is None else int(bytes_per_pack)
        return bpp, None if num_packs is None else int(num_packs), alg


def _describe(key: tuple) -> str:
    where, (op, root), structure, leaves, alg, threshold, bpp, npk, deadline = key
    parts = []
    if op is not None:
        parts.append(f"op={Op(op).name}")
    if root is not None:
        parts.append(f"root={root}")
    shown = [f"{np.dtype(d).name}{tuple(s)}".replace("'?'", "?") for d, s in leaves[:6]]
    if len(leaves) > 6:
        shown.append(f"... {len(leaves)} leaves in all")
    parts.append(f"leaves=[{', '.join(shown)}]")
    if structure not in ("*", "[" + ",".join("*" * len(leaves)) + "]"):
        parts.append(f"structure={structure[:120]}")
    parts.append(f"algorithm={alg}" + (f"(threshold={threshold})" if threshold is not None else ""))
    parts.append(f"bytes_per_pack={bpp}" + (f", num_packs={npk}" if npk is not None else ""))
    parts.append("with a deadline" if deadline else "no deadline")
    return f"{where}({', '.join(parts)})"
