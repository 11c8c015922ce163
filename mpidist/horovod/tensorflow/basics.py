"""Horovod's basics on mpidist: init/shutdown, ranks and sizes, build facts, the timeline.

``init()`` builds one mpidist Engine on the job's communicator (COMM_WORLD, the mpi4py
communicator given, or the ranks listed) and registers it as the global process set. Horovod's
environment variables that mean something here are mapped onto ``mpidist.rc`` first (see
``environment.py``).
"""
from __future__ import annotations

import logging
from typing import Any

from mpi4py import MPI

from ..._config import rc
from ...collectives import Engine
from . import environment, keras_spellings, process_sets, sessions

_log = logging.getLogger("mpidist")
_engine: Engine | None = None


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Start mpidist's Horovod layer (collective over ``comm``). A second call does nothing.

    ``comm``: None (COMM_WORLD), an mpi4py intracommunicator, or a list of COMM_WORLD ranks.
    ``process_sets``: ProcessSets (or rank lists) to register at once; "dynamic" is accepted.
    """
    global _engine
    if _engine is not None:
        return
    environment.apply()
    base: Any = comm
    if isinstance(comm, (list, tuple)):
        ranks = sorted(int(r) for r in comm)
        world = MPI.COMM_WORLD
        sub = world.Split(0 if world.Get_rank() in ranks else MPI.UNDEFINED, world.Get_rank())
        if sub == MPI.COMM_NULL:
            raise ValueError(f"init: this rank ({world.Get_rank()}) is not in `comm` ranks {ranks}")
        base = sub
    _engine = Engine(base)
    if base is not comm:
        base.Free()
    process_sets_mod.register_global(_engine)
    keras_spellings.install()  # the patches of hvd (mpidist.tensorflow.patching): at init, never at import
    sessions.install()
    if process_sets not in (None, "dynamic"):
        for ps in process_sets:
            process_sets_mod.add_process_set(ps)
    _log.debug("horovod: initialized on %d ranks (rank %d, local %d/%d)", size(), rank(),
               local_rank(), local_size())


process_sets_mod = process_sets


def shutdown() -> None:
    """Free the engines of every process set (collective). ``init()`` may be called again."""
    global _engine
    if _engine is None:
        return
    process_sets_mod.clear()
    _engine.close()
    _engine = None


def is_initialized() -> bool:
    return _engine is not None


def check_initialized(where: str = "horovod") -> Engine:
    """The global engine, or Horovod's "not initialized" ValueError."""
    if _engine is None:
        raise ValueError(f"{where}: Horovod has not been initialized; use hvd.init().")
    return _engine


def engine() -> Engine:
    return check_initialized("engine")


def size() -> int:
    return check_initialized("size").size


def rank() -> int:
    return check_initialized("rank").rank


def local_size() -> int:
    return check_initialized("local_size").topology.local_size


def local_rank() -> int:
    return check_initialized("local_rank").topology.local_rank


def cross_size() -> int:
    """The number of nodes holding a rank with this rank's local rank."""
    return check_initialized("cross_size").topology.cross.Get_size()


def cross_rank() -> int:
    return check_initialized("cross_rank").topology.cross.Get_rank()


def is_homogeneous() -> bool:
    """Whether every node holds the same number of ranks."""
    return len(set(check_initialized("is_homogeneous").topology.node_sizes)) == 1


def mpi_threads_supported() -> bool:
    check_initialized("mpi_threads_supported")
    return MPI.Query_thread() == MPI.THREAD_MULTIPLE


def mpi_enabled() -> bool:
    return True


def mpi_built() -> bool:
    return True


def gloo_enabled() -> bool:
    return False


def gloo_built() -> bool:
    return False


def nccl_built() -> int:
    """mpidist reaches NCCL through CuPy when it is installed (0: not available)."""
    try:
        from cupy.cuda import nccl  # noqa: F401
    except Exception:  # any import failure means no NCCL
        return 0
    return 1


def ddl_built() -> bool:
    return False


def ccl_built() -> bool:
    return False


def cuda_built() -> bool:
    import tensorflow as tf
    return bool(tf.test.is_built_with_cuda())


def rocm_built() -> bool:
    import tensorflow as tf
    return bool(tf.test.is_built_with_rocm())


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Write mpidist's trace of every collective to ``file_path`` (one file per rank)."""
    check_initialized("start_timeline")
    if not file_path:
        raise ValueError("start_timeline: `file_path` must be a non-empty path, got ''")
    rc.timeline = file_path


def stop_timeline() -> None:
    check_initialized("stop_timeline")
    rc.timeline = ""
