"""What ``mpidist run`` would resolve in this job (``mpidist check``'s "mpidist run" line), changing
nothing: ranks and nodes come from the check's own line above it; here the Horovod names, the
TF_CONFIG it would export or keep, the Keras of ``tf.keras`` (and whether ``--keras 2`` can work)
and the GPU each rank would take."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os

from .._config import rc
from ..launch import gpus, tf_config
from .context import Context
from .results import Outcome, ok


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def run_resolution(ctx: Context) -> Outcome:
    """The same text on every rank (GPU choices summed up), so the verdict is one line."""
    topo = ctx.engine.topology
    given = os.environ.get("TF_CONFIG")
    found = ctx.comm.allgather(tf_config.differences(given, ctx.rank, ctx.size) if given is not None else [])
    if given is None:
        config = f"TF_CONFIG exported: {ctx.size} worker(s), task index = rank"
    elif any(found):
        config = f"TF_CONFIG set here disagrees with MPI ({sorted({d for f in found for d in f})[0]}): replaced"
    else:
        config = "TF_CONFIG set here agrees with MPI: kept"
    horovod = "horovod -> mpidist.horovod"
    if importlib.util.find_spec("horovod") is not None:
        horovod += " (Horovod itself is installed too: under mpidist run the names are mpidist's)"
    legacy = os.environ.get("TF_USE_LEGACY_KERAS", "").strip().lower() in ("1", "true", "yes")
    tf_keras = _version("tf_keras")
    keras = (f"tf.keras: {'Keras 2' if legacy else 'Keras 3'}; --keras 2: "
             + (f"tf_keras {tf_keras}" if tf_keras else "needs `pip install tf_keras`"))
    plans = ctx.comm.allgather(gpus.plan(topo.local_rank, topo.local_size, enabled=rc.bind_gpu))
    if all(p.index is None for p in plans):
        gpu = f"GPU: {plans[0].reason}" if len({p.reason for p in plans}) == 1 else "GPU: left alone"
    else:
        gpu = f"GPU: each rank its node-local GPU (local rank % {max(p.visible for p in plans)})"
    return ok("; ".join([horovod, "tf.distribute strategies -> mpidist's", config, keras, gpu]))
