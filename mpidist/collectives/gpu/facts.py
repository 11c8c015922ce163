"""Per-communicator GPU state: the job's facts (gathered once, identical on every rank) and the
NCCL communicator of this node, kept in the engine's pipeline (``pipeline.extensions["gpu"]``),
so they go when the communicator does (``Engine.replace_comm``, ``Engine.close``).

At a pipeline's first collective on device buffers (after the agreement check, so every rank is in
it) each rank contributes what it knows locally: whether NCCL works here and its version, whether
its MPI reads device memory, and the PCI bus id of its GPU. One allgather makes these the job's
facts, so the path chosen from them (paths.choose) is the same on every rank, and an error (NCCL
asked for but unusable on some rank) is raised on every rank with the same text.

NCCL refuses two ranks on one GPU before NCCL 2.30 ("Duplicate GPU detected"); from 2.30 it
allows it when ``NCCL_MULTI_RANK_GPU_ENABLE=1`` is set. Shared GPUs otherwise make NCCL unusable
for the job (AUTO then takes MPI; NCCL asked for explicitly is an error saying so).
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

from ...topology import mpi_library
from . import cupy_arrays, nccl
from .paths import JobFacts
from .staging import Staging

_log = logging.getLogger("mpidist")


@dataclass(frozen=True)
class RankFacts:
    nccl_reason: str | None
    nccl_version: int
    cuda_aware: bool | None
    node: int
    bus_id: str


def local_facts(cp: Any, node: int, device: int) -> RankFacts:
    aware, _ = mpi_library.cuda_aware()
    return RankFacts(cupy_arrays.nccl_reason(), cupy_arrays.nccl_version(), aware, node,
                     cupy_arrays.bus_id(cp, device))


def multi_rank_gpu_enabled(environ: Any = None) -> bool:
    return (os.environ if environ is None else environ).get("NCCL_MULTI_RANK_GPU_ENABLE", "") == "1"


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def job_facts(ranks: list[RankFacts], multi_rank_env: bool) -> JobFacts:
    """The job's facts from every rank's (pure: rank r's entry is ``ranks[r]``)."""
    size = len(ranks)
    by_node: dict[int, list[int]] = {}
    for r, f in enumerate(ranks):
        by_node.setdefault(f.node, []).append(r)
    versions = [f.nccl_version for f in ranks]
    version = min(versions) if versions else 0
    reason = None
    missing = [r for r, f in enumerate(ranks) if f.nccl_reason is not None]
    if missing:
        texts = {ranks[r].nccl_reason for r in missing}
        first = ranks[missing[0]].nccl_reason
        reason = first if len(missing) == size and len(texts) == 1 else f"on {_ranks(missing)}: {first}"
    else:
        for members in by_node.values():
            seen: dict[str, int] = {}
            for r in members:
                other = seen.setdefault(ranks[r].bus_id, r)
                if other != r and not (version >= nccl.MULTI_RANK_GPU_SINCE and multi_rank_env):
                    reason = (f"ranks {other} and {r} share the GPU {ranks[r].bus_id}, which NCCL "
                              f"{nccl.version_text(version)} refuses (launch one rank per GPU, or with "
                              f"NCCL >= 2.30 set NCCL_MULTI_RANK_GPU_ENABLE=1)")
                    break
            if reason:
                break
    sizes = {len(m) for m in by_node.values()}
    return JobFacts(size=size, num_nodes=len(by_node), even_nodes=len(sizes) <= 1, nccl_reason=reason,
                    nccl_version=version, cuda_aware=all(f.cuda_aware is True for f in ranks))


@dataclass
class EngineState:
    """What one pipeline (one communicator of an engine) keeps for its GPU collectives."""
    facts: JobFacts | None = None
    node_comms: dict[int, nccl.NodeComm] = field(default_factory=dict)
    told: set = field(default_factory=set)
    last_path: Any = None  # the path of the latest GPU collective (tests and diagnostics)
    staging: Staging | None = None  # page-locked host blocks of the staged paths (staging.py)

    def staging_pool(self, cp: Any) -> Staging:
        if self.staging is None:
            self.staging = Staging(cp)
        return self.staging

    def close(self) -> None:
        """The pipeline closes: wait for the copies still reading page-locked blocks, drop them."""
        if self.staging is not None:
            self.staging.close()

    def job(self, cp: Any, pipeline: Any, device: int) -> JobFacts:
        """The job's facts (collective over the pipeline's communicator the first time)."""
        if self.facts is None:
            topo = pipeline.topology
            ranks = topo.comm.allgather(local_facts(cp, topo.node_index, device))
            self.facts = job_facts(ranks, multi_rank_gpu_enabled())
        return self.facts

    def node_comm(self, cp: Any, pipeline: Any, call: Any, device: int) -> nccl.NodeComm:
        """This node's NCCL communicator on ``device`` (collective over the node the first time)."""
        found = self.node_comms.get(device)
        if found is None:
            topo = pipeline.topology
            found = nccl.create(cupy_arrays.load_nccl(), cp, topo.local, topo.local_rank, topo.local_size,
                                device, call)
            self.node_comms[device] = found
            if topo.rank == 0:
                _log.info("mpidist: NCCL %s communicator built over the %d rank(s) of each node",
                          nccl.version_text(found.version), topo.local_size)
        return found

    def tell_once(self, pipeline: Any, key: Any, message: str, *args: Any) -> None:
        """Log ``message`` once per pipeline and key, on rank 0 only."""
        if key not in self.told:
            self.told.add(key)
            if pipeline.topology.rank == 0:
                _log.info(message, *args)


def state(owner: Any) -> EngineState:
    """The GPU state of a pipeline, or of an engine's current pipeline (``owner.pipeline``)."""
    pipeline = getattr(owner, "pipeline", owner)
    found = pipeline.extensions.get("gpu")
    if found is None:
        found = pipeline.extensions["gpu"] = EngineState()
    return found
