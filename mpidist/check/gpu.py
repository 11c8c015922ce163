"""The checks on GPU memory: CuPy on this rank's GPU, CUDA-aware MPI on device buffers, mpidist's
collectives on CuPy arrays on every path the job can take (MPI on device pointers, MPI staged
through host memory, NCCL in a node, NCCL+MPI across nodes, NCCL-copy+MPI), and the TensorFlow
GPU bridge (DLPack) when TensorFlow sees a GPU.

Nothing is imported at module import: CuPy and TensorFlow only where a GPU is. Where none is, each
check is ``skipped`` and says why (no GPU on the node, or what CuPy says); where a GPU is but CuPy,
NCCL or a CUDA-aware MPI is not, it is ``missing`` with the fix.
"""
from __future__ import annotations

import glob
import importlib.util
from typing import Any

import numpy as np
from mpi4py import MPI

from ..collectives.gpu import bind_device, cupy_arrays, cupy_reason, facts, nccl_reason
from ..collectives.options import CallOptions
from ..errors import GpuUnavailableError
from ..topology import mpi_library
from .context import (
    DTYPES,
    Context,
    allreduce_bus_factor,
    gate,
    make,
    median_seconds,
    mismatch,
    reference,
    settle,
    timing_line,
)
from .results import Outcome, missing, ok, skipped

CUDA_AWARE_FIX = ("use an MPI built with CUDA support (Open MPI --with-cuda, or the site's CUDA-aware "
                  "module), or MPIDIST_CUDA_AWARE_MPI=yes if the library has it but cannot tell; without "
                  "it mpidist stages MPI steps through host memory")


def gpu_hardware() -> list[str]:
    """The NVIDIA GPUs the driver lists on this node (without CUDA): /proc/driver/nvidia/gpus/*."""
    return sorted(glob.glob("/proc/driver/nvidia/gpus/*"))


def _no_cupy(what: str) -> Outcome | None:
    """None when CuPy runs on a GPU here; else ``what``'s skipped (no GPU) or missing (a GPU, no CuPy)."""
    reason = cupy_reason()
    if reason is None:
        return None
    if gpu_hardware():
        return missing(f"{what}: the node has {len(gpu_hardware())} NVIDIA GPU(s) but {reason}",
                       cupy_arrays.INSTALL_CUPY + " (matching the node's CUDA), then check `nvidia-smi`")
    return skipped(f"no GPU on this node (no /proc/driver/nvidia/gpus entries; {reason})")


def _bound(ctx: Context) -> Any:
    """CuPy, with this rank's GPU (local rank % GPUs) current."""
    cp = cupy_arrays.load_cupy()
    bind_device(ctx.engine.topology)
    return cp


def cupy_on_gpu(ctx: Context) -> Outcome:
    """CuPy computes on each rank's GPU and copies to and from it correctly; which GPUs the ranks use."""
    absent = gate(ctx, _no_cupy("CuPy"))
    if absent is not None:
        return absent
    cp = _bound(ctx)
    device = cp.cuda.Device()
    host = make(ctx.rank, np.float32, (ctx.nbytes // 4,))
    x = cp.asarray(host)
    wrong = mismatch("a host -> GPU -> host round trip", cp.asnumpy(x), host) or \
        mismatch("a sum computed on the GPU", cp.asnumpy(cp.sum(x * 2, dtype=cp.float64)),
                 np.asarray(host.astype(np.float64).sum() * 2))
    found = settle(ctx, wrong, fix="CuPy computes wrong results on this GPU: check the driver and CUDA versions "
                                   "against CuPy's (`python -c 'import cupy; cupy.show_config()'`)")
    if found is not None:
        return found
    gpus = ctx.comm.allgather((MPI.Get_processor_name(), cupy_arrays.bus_id(cp, device.id)))
    shared = len(set(gpus)) < len(gpus)
    seconds = median_seconds(lambda: (cp.asarray(host), device.synchronize()), ctx.repeat)
    return ok(f"CuPy {cp.__version__}, {_device_name(cp, device.id)}: a copy and a sum on every rank's GPU equal "
              f"the host's; {len(set(gpus))} distinct GPU(s) for {len(gpus)} rank(s)"
              f"{' (ranks share GPUs: NCCL before 2.30 refuses that)' if shared else ''}",
              timing_line("host -> GPU copy", ctx.nbytes, seconds), seconds)


def _device_name(cp: Any, device: int) -> str:
    try:
        name = cp.cuda.runtime.getDeviceProperties(device)["name"]
    except Exception:  # an old CuPy, or a driver that cannot say: the name is only for the eye
        return "device name unknown"
    return name.decode() if isinstance(name, bytes) else str(name)


def cuda_aware_mpi(ctx: Context) -> Outcome:
    """mpi4py's Allreduce on CuPy buffers (device pointers handed to MPI)."""
    absent = _no_cupy("CUDA-aware MPI")
    aware, how = mpi_library.cuda_aware()
    if absent is None and aware is not True:
        state = "cannot tell" if aware is None else "says no"
        absent = missing(f"the MPI library {state} ({how}): MPI steps on GPU buffers are staged through host memory",
                         CUDA_AWARE_FIX)
    absent = gate(ctx, absent)
    if absent is not None:
        return absent
    cp = _bound(ctx)
    count = ctx.nbytes // 4
    x = cp.asarray(make(ctx.rank, np.float32, (count,)))
    out = cp.empty_like(x)
    cp.cuda.get_current_stream().synchronize()
    ctx.comm.Allreduce(x, out, op=MPI.SUM)
    expected = reference(ctx.size, np.float32, (count,), "sum")
    wrong = mismatch("MPI_Allreduce on device buffers", cp.asnumpy(out), expected)
    found = settle(ctx, wrong, fix="the MPI library claims CUDA support but computes wrong results on device "
                                   "buffers: set MPIDIST_CUDA_AWARE_MPI=no (mpidist then stages) and tell the site")
    if found is not None:
        return found
    seconds = median_seconds(lambda: ctx.comm.Allreduce(x, out, op=MPI.SUM), ctx.repeat)
    return ok(f"mpi4py Allreduce on CuPy buffers equals the host reference ({how})",
              timing_line("float32 sum", ctx.nbytes, seconds, allreduce_bus_factor(ctx.size)), seconds)


def _collectives_on_device(ctx: Context, cp: Any, options: CallOptions) -> tuple[str | None, str]:
    """The five collectives on CuPy arrays against NumPy (every call on every rank, with ``options``:
    implementation, algorithm, deadline): the first difference this rank saw (or None), and the path
    the allreduces took."""
    engine, size, rank, wrong, path = ctx.engine, ctx.size, ctx.rank, None, "?"
    for dtype in DTYPES:
        name = np.dtype(dtype).name
        for op in ("sum", "max"):
            got = engine.allreduce(cp.asarray(make(rank, dtype, (3001,), op)), op, options=options)
            last = facts.state(engine).last_path
            path = last.value if last is not None else "?"
            wrong = wrong or mismatch(f"allreduce {op} {name}", cp.asnumpy(got), reference(size, dtype, (3001,), op))
        got = engine.broadcast(cp.asarray(make(rank, dtype, (1001,))), root=size - 1, options=options)
        wrong = wrong or mismatch(f"broadcast {name} root={size - 1}", cp.asnumpy(got), make(size - 1, dtype, (1001,)))
        got = engine.allgather(cp.asarray(make(rank, dtype, (rank + 1, 3))), options=options)
        expected = np.concatenate([make(r, dtype, (r + 1, 3)) for r in range(size)])
        wrong = wrong or mismatch(f"allgather {name}", cp.asnumpy(got), expected)
        got = engine.reduce(cp.asarray(make(rank, dtype, (501,))), root=0, options=options)
        if rank == 0:
            wrong = wrong or mismatch(f"reduce sum {name}", cp.asnumpy(got), reference(size, dtype, (501,), "sum"))
        rows = 2 * size + 1
        got = engine.reduce_scatter(cp.asarray(make(rank, dtype, (rows, 3))), options=options)
        expected = np.array_split(reference(size, dtype, (rows, 3), "sum"), size)[rank]
        wrong = wrong or mismatch(f"reduce_scatter sum {name}", cp.asnumpy(got), expected)
    return wrong, path


# (name, implementation, algorithm, deadline): the configurations that reach every path
CONFIGS = (("MPI", "ring", None, False), ("MPI with a deadline", "ring", None, True),
           ("NCCL", "nccl", None, False), ("NCCL, algorithm=hierarchical", "nccl", "hierarchical", False))


def gpu_paths(ctx: Context) -> list[tuple[str, Outcome]]:
    """One outcome per configuration of mpidist's collectives on CuPy arrays; a configuration that
    takes a path already checked says so. The engine decides the path from facts every rank shares,
    and raises GpuUnavailableError on every rank alike, so the ranks stay together."""
    absent = gate(ctx, _no_cupy("GPU collectives"))
    if absent is not None:
        return [("GPU collectives (every path)", absent)]
    cp = _bound(ctx)
    results, seen = [], set()
    for name, impl, algorithm, deadline in CONFIGS:
        title = f"GPU collectives over {name}"
        options = CallOptions(timeout_seconds=ctx.timeout if deadline else None, implementation=impl,
                              algorithm=algorithm, requested_by="python -m mpidist check")
        try:
            wrong, label = _collectives_on_device(ctx, cp, options)
        except GpuUnavailableError as exc:  # NCCL unusable for this job: every rank raised, alike
            local = nccl_reason()
            results.append((title, missing(f"{exc}", cupy_arrays.INSTALL_NCCL) if local is not None
                            else skipped(str(exc))))
            continue
        if label in seen:
            results.append((title, skipped(f"allreduce takes path {label} here, checked above")))
            continue
        seen.add(label)
        found = settle(ctx, None if wrong is None else f"path {label}: {wrong}")
        if found is not None:
            results.append((title, found))
            continue
        x = cp.ones(ctx.nbytes // 4, dtype=cp.float32)
        stream = cp.cuda.get_current_stream()

        def timed(x=x, options=options, stream=stream):
            return ctx.engine.allreduce(x, options=options), stream.synchronize()
        seconds = median_seconds(timed, ctx.repeat)
        results.append((title, ok(f"allreduce path {label}: allreduce, broadcast, allgather, reduce, reduce_scatter "
                                  f"of every dtype equal the host reference",
                                  timing_line(f"path {label}, float32 sum", ctx.nbytes, seconds,
                                              allreduce_bus_factor(ctx.size)), seconds)))
    return results


def tensorflow_bridge(ctx: Context) -> Outcome:
    """A GPU tensor's allreduce through mpidist's strategy: DLPack to CuPy and back, no host copy."""
    if importlib.util.find_spec("tensorflow") is None:
        return skipped("TensorFlow is not installed")
    # the bridge hands GPU tensors to CuPy: without CuPy on a GPU there is nothing to check (and
    # TensorFlow is not imported)
    absent = _no_cupy("the TensorFlow GPU bridge")
    gpus = []
    if absent is None:
        import tensorflow as tf
        gpus = tf.config.list_physical_devices("GPU")
        if not gpus:
            absent = skipped("TensorFlow sees no GPU (tf.config.list_physical_devices('GPU') is empty: a CPU-only "
                             "TensorFlow, or one built for another CUDA)")
    absent = gate(ctx, absent)
    if absent is not None:
        return absent
    return tensorflow_reduce(ctx, f"/GPU:{ctx.engine.topology.local_rank % len(gpus)}")


def tensorflow_reduce(ctx: Context, device: str) -> Outcome:
    """``strategy.reduce("SUM", t)`` of a tensor made on ``device`` against the host reference
    (on a GPU: the bridge; on "/CPU:0" the host path, for tests without a GPU)."""
    import tensorflow as tf

    import mpidist
    strategy = mpidist.MultiWorkerMirroredStrategy()
    count = ctx.nbytes // 4
    with tf.device(device):
        x = tf.identity(tf.constant(make(ctx.rank, np.float32, (count,))))
    got = strategy.reduce("SUM", x, axis=None)
    wrong = mismatch(f"strategy.reduce SUM of a tensor on {x.backing_device}", got.numpy(),
                     reference(ctx.size, np.float32, (count,), "sum"))
    found = settle(ctx, wrong, fix="TensorFlow tensors on this device reduce wrongly: report it with the output "
                                   "of `python -m mpidist info`; meanwhile reduce host tensors (tf.device('/CPU:0'))")
    if found is not None:
        return found
    seconds = median_seconds(lambda: strategy.reduce("SUM", x, axis=None).numpy(), ctx.repeat)
    return ok(f"TensorFlow {tf.__version__}: strategy.reduce of a tensor on {x.backing_device} equals the host "
              f"reference (result on {got.backing_device})", timing_line("float32 sum", ctx.nbytes, seconds), seconds)
