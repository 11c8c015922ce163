"""The engine's GPU hook: a collective whose nest holds device arrays comes here.

The steps are the engine's pipeline's (collectives/pipeline.py: the engine has already checked
that it is usable and resolved the options), through the same public methods, in the same order
on every rank:

1. CuPy is loaded (a device leaf without CuPy is an error naming the leaf, or for NCCL asked for
   explicitly ``<who>: NCCL is not available: cupy is not installed (pip install cupy-cuda12x)``);
2. leaves become contiguous CuPy arrays on one device: device leaves as they are (zero-copy views
   of other ``__cuda_array_interface__`` arrays), NumPy arrays and numbers uploaded (they come
   back as they went in, so mixed nests such as (device sums, host counts) work);
3. agreement, with the implementation asked for in the key: a rank passing host arrays where
   another passes device arrays gets a CollectiveMismatchError naming both, not a hang;
4. the job's facts (gathered once per pipeline, i.e. per communicator) decide the path (paths.choose), the same on every
   rank; the NCCL communicator is built on first use;
5. the collective runs on the device (device_collectives.py) over the path's transport; with a
   deadline, the stream is waited for before returning, so the deadline covers the GPU work;
6. an allreduce's data steps are recorded as they run and, where they can be replayed, attached to
   the signature just agreed (recipes.py), so that later repeats speculate; a plain repeat then
   takes the engine's cached fast path (fast.py, registered on the pipeline's FastPaths here).

With the timeline on, the collective is recorded as the engine records its own (timeline.py),
with ``args.path`` and NCCL calls as transfers that were enqueued.

Results are CuPy arrays of the leaves' dtypes and shapes, ordered on the caller's current stream.
"""
from __future__ import annotations

from types import ModuleType
from typing import Any

from ..._config import rc
from ...errors import GpuUnavailableError
from .. import arrays as host_arrays
from .. import nest
from ..ops import check_dtype
from ..options import Resolved
from ..pipeline import Call, Pipeline
from . import cupy_arrays, device_collectives, facts, fast, paths, recipes
from .hierarchical import HierarchicalTransport
from .paths import Path
from .transports import Env, MpiTransport, NcclTransport


def _require_cupy(leaves: list[Any], implementation: str, who: str, where: str) -> Any:
    reason = cupy_arrays.cupy_reason()
    if reason is None:
        return cupy_arrays.load_cupy()
    if implementation == "nccl":
        raise GpuUnavailableError(paths.unavailable_message(who, reason))
    i = next(i for i, leaf in enumerate(leaves) if cupy_arrays.is_device_array(leaf))
    raise GpuUnavailableError(f"{where}: leaf {i} of `value` is a CUDA device array "
                              f"({cupy_arrays.describe_leaf(leaves[i])}), which needs CuPy, but {reason}")


def _device(cp: Any, leaves: list[Any], where: str) -> tuple[list[Any | None], int]:
    """Device leaves as CuPy arrays (None for host leaves) and the one device they share."""
    views: list[Any | None] = []
    devices: dict[int, int] = {}
    for i, leaf in enumerate(leaves):
        if not cupy_arrays.is_device_array(leaf):
            views.append(None)
            continue
        a = leaf if isinstance(leaf, cp.ndarray) else cp.asarray(leaf)
        views.append(a)
        devices.setdefault(cupy_arrays.device_id(cp, a), i)
    if len(devices) > 1:
        shown = ", ".join(f"leaf {i} on GPU {d}" for d, i in devices.items())
        raise ValueError(f"{where}: the device leaves of `value` must all live on one GPU, got {shown}")
    return views, next(iter(devices))


def _to_device(cp: Any, leaves: list[Any], views: list[Any | None], where: str
               ) -> tuple[list[Any], list[host_arrays.Adapter | None]]:
    """Contiguous CuPy arrays of every leaf (in the current device) and how to give host leaves back."""
    out: list[Any] = []
    restore: list[host_arrays.Adapter | None] = []
    for i, (leaf, view) in enumerate(zip(leaves, views)):
        if view is None:
            host, adapter = host_arrays.to_host(leaf, where, i)
            if host.dtype.name == "bfloat16" and not cupy_arrays.has_bfloat16(cp):
                raise TypeError(f"{where}: leaf {i} of `value` is a bfloat16 host array in a nest with device "
                                f"arrays, and CuPy {cp.__version__} has no bfloat16 arrays (CuPy >= 14 has): "
                                f"reduce it in a separate call, or as float32")
            out.append(cp.asarray(host))
            restore.append(adapter)
            continue
        if view.dtype.name != "bfloat16":
            check_dtype(view.dtype, where, f"leaf {i} of `value`")
        out.append(view if view.flags.c_contiguous else cp.ascontiguousarray(view))
        restore.append(None)
    return out, restore


def _back(cp: Any, results: list[Any], restore: list[Any], leaves: list[Any]) -> list[Any]:
    return [r if adapter is None else adapter.from_numpy(cp.asnumpy(r), leaf)
            for r, adapter, leaf in zip(results, restore, leaves)]


def make_env(cp: Any, ctx: Call, pipeline: Pipeline, path: Path, job: paths.JobFacts, device: int,
             deadline: bool) -> Env:
    """The environment of one collective: the path's transport and the MPI fallback."""
    env = Env(cp, ctx, facts.state(pipeline).staging_pool(cp))
    env.fallback = MpiTransport(env, device=path is Path.MPI_DEVICE or (
        path.uses_nccl and paths.cross_node_mpi_on_device(job, deadline)))
    if not path.uses_nccl:
        env.primary = env.fallback
        return env
    if path is Path.NCCL:
        env.node = facts.state(pipeline).node_comm(cp, pipeline, ctx.call, device)
        env.primary = NcclTransport(env, env.node)
    else:  # (a node of one rank skips its NCCL steps, hierarchical.py: it needs no NCCL communicator)
        if pipeline.topology.local_size > 1:
            env.node = facts.state(pipeline).node_comm(cp, pipeline, ctx.call, device)
        env.primary = HierarchicalTransport(env, env.node, paths.cross_node_mpi_on_device(job, deadline),
                                            copy=path is Path.NCCL_HIERARCHICAL_COPY)
    return env


def collective(pipeline: Pipeline, where: str, module: ModuleType, leaves: list[Any], tree: Any, op_root: tuple,
               params: dict, options: Resolved, *, rec: Any = None, start: float = 0.0) -> Any:
    """Run the collective ``where`` on a nest holding device arrays (see the module docstring).

    ``options.implementation`` chooses among the paths (``options.requested_by`` is named in errors)."""
    implementation = options.implementation
    who = options.requested_by or where
    cp = _require_cupy(leaves, implementation, who, where)
    fast.attach(pipeline, cp)
    views, device = _device(cp, leaves, where)
    with cp.cuda.Device(device):
        arrays, restore = _to_device(cp, leaves, views, where)
        if module.validate is not None:
            module.validate(arrays, where)
        deadline = options.timeout is not None
        record = where == "allreduce" and not deadline and rc.check_agreement
        recorded: list[Any] = []

        def run(ctx: Call) -> Any:
            state = facts.state(pipeline)
            job = state.job(cp, pipeline, device)
            path = state.last_path = paths.choose(implementation, options.algorithm, job, deadline=deadline, who=who)
            state.tell_once(pipeline, (where, path), "mpidist: %s of GPU buffers takes the %s path (%d node(s), "
                            "NCCL %s, CUDA-aware MPI: %s)", where, path.value, job.num_nodes,
                            "unusable" if job.nccl_reason else job.nccl_version, "yes" if job.cuda_aware else "no")
            ctx.notes = {"path": path.value}
            env = make_env(cp, ctx, pipeline, path, job, device, deadline)
            if env.node is not None:
                env.node.steps = ctx.call.steps
            if record:
                recipes.begin(ctx, env.node)
            try:
                results = device_collectives.RUN[where](env, arrays, **params)
            finally:
                if record:
                    recorded.append(recipes.end(ctx, env.node, cp))
                if env.node is not None:
                    env.node.steps = None
                env.release()
            if deadline:
                env.wait()
                if env.node is not None:
                    env.node.check()
            return results

        results = pipeline.execute(where, module, arrays, tree, op_root, options, run, rec=rec, start=start,
                                   variant=f"gpu:{implementation}")
        if recorded:
            recipes.adopt(pipeline.agreement, recorded[0])
    if results is None:
        return None
    if all(r is None for r in restore):
        return nest.unflatten(tree, results)
    return nest.unflatten(tree, _back(cp, results, restore, leaves))
