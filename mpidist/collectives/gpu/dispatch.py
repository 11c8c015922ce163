"""The engine's GPU hook: a collective whose nest holds device arrays comes here.

The steps are the engine's, in the same order on every rank:

1. CuPy is loaded (a device leaf without CuPy is an error naming the leaf, or for NCCL asked for
   explicitly ``<who>: NCCL is not available: cupy is not installed (pip install cupy-cuda12x)``);
2. leaves become contiguous CuPy arrays on one device: device leaves as they are (zero-copy views
   of other ``__cuda_array_interface__`` arrays), NumPy arrays and numbers uploaded (they come
   back as they went in, so mixed nests such as (device sums, host counts) work);
3. agreement, with the implementation asked for in the key: a rank passing host arrays where
   another passes device arrays gets a CollectiveMismatchError naming both, not a hang;
4. the job's facts (gathered once per engine) decide the path (paths.choose), the same on every
   rank; the NCCL communicator is built on first use;
5. the collective runs on the device (device_collectives.py) over the path's transport; with a
   deadline, the stream is waited for before returning, so the deadline covers the GPU work.

With the timeline on, the collective is recorded as the engine records its own (timeline.py),
with ``args.path`` and NCCL calls as transfers that were enqueued.

Results are CuPy arrays of the leaves' dtypes and shapes, ordered on the caller's current stream.
"""
from __future__ import annotations

from types import ModuleType
from typing import Any

from ..._config import rc
from ...errors import GpuUnavailableError
from .. import agreement, arrays as host_arrays, nest, timeline
from ..deadline import Caller
from ..ops import check_dtype
from . import cupy_arrays, device_collectives, facts, paths
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
    out, restore = [], []
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


def _safe_describe(describe: Any) -> Any:
    def safe(key: tuple) -> str:
        try:
            return describe(key)
        except Exception:  # a dtype NumPy cannot name from its code (bfloat16): show the raw key
            return repr(key)
    return safe


def make_env(cp: Any, ctx: Any, engine: Any, path: Path, job: paths.JobFacts, device: int,
             deadline: bool) -> Env:
    """The environment of one collective: the path's transport and the MPI fallback."""
    env = Env(cp, ctx)
    env.fallback = MpiTransport(env, device=path is Path.MPI_DEVICE or (
        path.uses_nccl and paths.cross_node_mpi_on_device(job, deadline)))
    if not path.uses_nccl:
        env.primary = env.fallback
        return env
    env.node = facts.state(engine).node_comm(cp, engine, ctx.call, device)
    if path is Path.NCCL:
        env.primary = NcclTransport(env, env.node)
    else:
        env.primary = HierarchicalTransport(env, env.node, paths.cross_node_mpi_on_device(job, deadline),
                                            copy=path is Path.NCCL_HIERARCHICAL_COPY)
    return env


def collective(engine: Any, where: str, module: ModuleType, leaves: list[Any], tree: Any, op_root: tuple,
               params: dict, alg: str, bpp: int, npk: int | None, timeout: float | None) -> Any:
    """Run the engine's collective ``where`` on a nest holding device arrays (see the module docstring)."""
    from ..engine import _Call, _describe  # the engine imports this package: import it at call time

    rec = timeline.recorder()
    start = rec.now() if rec is not None else 0.0
    implementation, requested_by = paths.current()
    who = requested_by or where
    cp = _require_cupy(leaves, implementation, who, where)
    views, device = _device(cp, leaves, where)
    with cp.cuda.Device(device):
        arrays, restore = _to_device(cp, leaves, views, where)
        if module.validate is not None:
            module.validate(arrays, where)
        call = Caller(where, timeout, engine._break)
        ctx = _Call(where, engine.topology, call, alg, bpp, npk)
        prepared = agreed = None  # timeline marks, as in Engine._collective
        if rc.check_agreement:
            structure = "*" if tree is nest.LEAF else nest.structure_key(tree)
            key = engine._key(where, op_root, structure, module.signature(arrays), f"{alg}|gpu:{implementation}",
                              bpp, npk, timeout is not None)
            prepared = rec.now() if rec is not None else None
            agreement.agree(engine.topology.comm, call, key, engine._hashes, _safe_describe(_describe), where)
        if rec is not None:
            prepared, agreed = timeline.agreed(rec, prepared, call)
        state = facts.state(engine)
        job = state.job(cp, engine, device)
        path = state.last_path = paths.choose(implementation, alg, job, deadline=timeout is not None, who=who)
        state.tell_once(engine, (where, path), "mpidist: %s of GPU buffers takes the %s path (%d node(s), "
                        "NCCL %s, CUDA-aware MPI: %s)", where, path.value, job.num_nodes,
                        "unusable" if job.nccl_reason else job.nccl_version, "yes" if job.cuda_aware else "no")
        env = make_env(cp, ctx, engine, path, job, device, timeout is not None)
        if env.node is not None:
            env.node.steps = call.steps
        try:
            results = device_collectives.RUN[where](env, arrays, **params)
        finally:
            if env.node is not None:
                env.node.steps = None
        if timeout is not None:
            env.wait()
            if env.node is not None:
                env.node.check()
    if results is None:
        out = None
    elif all(r is None for r in restore):
        out = nest.unflatten(tree, results)
    else:
        out = nest.unflatten(tree, _back(cp, results, restore, leaves))
    if rec is not None:
        engine._record(rec, where, start, prepared, agreed, call.steps, arrays, op_root, alg, path=path.value)
    return out

