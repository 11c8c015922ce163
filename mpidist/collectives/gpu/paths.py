"""Which path a collective on device buffers takes: a pure function of facts every rank shares.

Paths (``Path``):

- ``nccl``: one node: NCCL over the node's ranks does the whole collective;
- ``nccl+mpi``: several nodes of equal size: NCCL reduce-scatter inside each node, MPI allreduce
  of each shard across nodes (ranks with the same local rank), NCCL all-gather inside the node;
- ``nccl-copy+mpi``: several nodes of unequal size, or ``algorithm="hierarchical"``
  (HierarchicalCopyAllReduce): NCCL reduce to local rank 0, MPI allreduce across node leaders,
  NCCL broadcast inside the node;
- ``mpi-device``: MPI alone, on device pointers (the MPI library is CUDA-aware on every rank);
- ``mpi-staged``: MPI alone, through page-locked host buffers.

Rules (:func:`choose`): the implementation asked for is ``ring`` -> MPI; NCCL unusable (see
facts.py) -> MPI, or for ``nccl`` a :class:`GpuUnavailableError` naming who asked and why; else by
topology as above. MPI on device pointers needs every rank's MPI to be CUDA-aware
(``rc.cuda_aware_mpi``) and no deadline: with ``timeout_seconds`` MPI steps use non-blocking
calls, which MPI libraries' CUDA support does not promise to cover, so they are staged.

The implementation a call asks for travels in its options (``CallOptions.implementation``, with
``requested_by`` naming the API that asked, e.g. ``NcclAllReduce``), set by the cross-device ops and
strategies from ``CommunicationOptions.implementation``.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from ...errors import GpuUnavailableError
from ...validation import check_choice
from ..options import IMPLEMENTATIONS


class Path(enum.Enum):
    NCCL = "nccl"
    NCCL_HIERARCHICAL = "nccl+mpi"
    NCCL_HIERARCHICAL_COPY = "nccl-copy+mpi"
    MPI_DEVICE = "mpi-device"
    MPI_STAGED = "mpi-staged"

    @property
    def uses_nccl(self) -> bool:
        return self.value.startswith("nccl")


@dataclass(frozen=True)
class JobFacts:
    """What the path depends on, identical on every rank (see facts.py)."""
    size: int
    num_nodes: int
    even_nodes: bool              # every node has the same number of ranks
    nccl_reason: str | None       # why NCCL cannot serve this job; None: it can
    nccl_version: int             # the lowest NCCL version of all ranks (0: none)
    cuda_aware: bool              # every rank's MPI reads device memory


def parse_implementation(value: Any, where: str = "implementation") -> str:
    """"auto", "ring" or "nccl" from a string or an enum (ours or TensorFlow's CommunicationImplementation)."""
    return check_choice(value, where, "implementation", IMPLEMENTATIONS, upper=True)


def unavailable_message(who: str, reason: str) -> str:
    return f"{who}: NCCL is not available: {reason}"


def choose(implementation: str, algorithm: str, facts: JobFacts, *, deadline: bool, who: str) -> Path:
    """The path of one collective on device buffers (see the module docstring)."""
    mpi = Path.MPI_DEVICE if facts.cuda_aware and not deadline else Path.MPI_STAGED
    if implementation == "ring":
        return mpi
    if facts.nccl_reason is not None:
        if implementation == "nccl":
            raise GpuUnavailableError(unavailable_message(who, facts.nccl_reason))
        return mpi
    if facts.num_nodes == 1:
        return Path.NCCL
    if algorithm == "hierarchical" or not facts.even_nodes:
        return Path.NCCL_HIERARCHICAL_COPY
    return Path.NCCL_HIERARCHICAL


def cross_node_mpi_on_device(facts: JobFacts, deadline: bool) -> bool:
    """Whether the MPI steps of the hierarchical NCCL paths read device memory (else staged)."""
    return facts.cuda_aware and not deadline
