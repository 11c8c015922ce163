"""ULFM (User-Level Failure Mitigation) on the MPI communicator: is it active, and the steps of a
recovery (revoke, agree, shrink).

ULFM is active when the MPI library is Open MPI 5 started with ``mpirun --with-ft ulfm`` (the
launcher then sets ``OMPI_MCA_mpi_ft_enable=1`` in every rank's environment) and mpi4py exposes
``Comm.Revoke``/``Shrink``/``Agree`` (mpi4py >= 4). Without ``--mca mpi_ft_detector true`` a dead
peer can leave the survivors waiting, so that is reported too. The detector sends heartbeats only
from inside MPI calls: a rank that computes longer than ``mpi_ft_detector_timeout`` without one
is declared dead (docs/elastic.md, "Detection settings"). MPICH through mpi4py and ``srun``
direct launch have no ULFM here: under ``srun --mpi=pmix`` Slurm's PMIx plugin cancels the whole
step as soon as one task ends without finalizing (``mpi/pmix: _errhandler: Error handler invoked:
status = -61``), whatever ``--kill-on-bad-exit`` and ``OMPI_MCA_mpi_ft_enable`` say (seen with
Slurm 22.05, tests/slurm); ``slurm/elastic.sbatch`` runs ``mpirun --with-ft ulfm`` instead.
"""
from __future__ import annotations

import os
from typing import Any, cast

from mpi4py import MPI

from ..topology import detect_launcher

_TRUE = ("1", "true", "yes", "on", "enabled")


def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in _TRUE


def status() -> tuple[bool, str]:
    """(whether ULFM is active in this process, a sentence saying why or why not)."""
    if not all(hasattr(MPI.Comm, n) for n in ("Revoke", "Shrink", "Agree", "Ack_failed")):
        return False, f"mpi4py {_mpi4py_version()} lacks Comm.Revoke/Shrink/Agree (needs mpi4py >= 4)"
    vendor = MPI.get_vendor()[0]
    if vendor != "Open MPI":
        return False, f"the MPI library is {vendor}, not Open MPI 5 with ULFM"
    if detect_launcher().name == "srun":
        return False, ("srun direct launch: Slurm cancels the whole step when a task dies; run "
                       "`mpirun --with-ft ulfm` inside the allocation (slurm/elastic.sbatch)")
    if not _env_true("OMPI_MCA_mpi_ft_enable"):
        return False, "the job was not launched with `mpirun --with-ft ulfm` (OMPI_MCA_mpi_ft_enable unset)"
    if not _env_true("OMPI_MCA_mpi_ft_detector"):
        return True, ("active (mpirun --with-ft ulfm), but the failure detector is off: add "
                      "`--mca mpi_ft_detector true`, else a dead peer can leave the survivors waiting")
    return True, "active (mpirun --with-ft ulfm, failure detector on)"


def active() -> bool:
    """Whether ULFM is active in this process (see :func:`status`)."""
    return status()[0]


def _mpi4py_version() -> str:
    import mpi4py
    return getattr(mpi4py, "__version__", "?")


def lost_error(exc: BaseException) -> bool:
    """Whether ``exc`` is an MPI error that means a peer died (or the communicator was revoked)."""
    if not isinstance(exc, MPI.Exception):
        return False
    classes = [getattr(MPI, n, None) for n in ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING", "ERR_REVOKED")]
    return exc.Get_error_class() in [c for c in classes if isinstance(c, int)]


def revoke(comms: list[Any]) -> None:
    """Revoke each communicator (every rank in it then leaves its collectives); errors ignored."""
    for comm in comms:
        if comm is None or comm == MPI.COMM_NULL:
            continue
        try:
            comm.Revoke()
        except MPI.Exception:
            pass


def agree_all_ok(comm: MPI.Intracomm, ok: bool) -> bool:
    """Fault-tolerant agreement (collective over the survivors of ``comm``, revoked or not): True
    only if every surviving rank passed ``ok=True`` and no failure interrupted the agreement."""
    flag = 1 if ok else 0
    for _ in range(8):  # each retry acknowledges the failures seen so far
        try:
            comm.Ack_failed()
        except MPI.Exception:
            pass
        try:
            return bool(comm.Agree(flag))
        except MPI.Exception as exc:
            if not lost_error(exc):
                raise
            flag = 0  # a rank died during the agreement: recover
    return False


def shrink(comm: MPI.Intracomm) -> MPI.Intracomm:
    """The communicator of the surviving ranks of ``comm``, in their old order (collective)."""
    return cast(MPI.Intracomm, comm.Shrink())  # mpi4py's stubs say Comm; an Intracomm's is one
