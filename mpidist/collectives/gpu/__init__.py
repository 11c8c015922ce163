"""CUDA device buffers in every collective: CuPy arrays (or anything with
``__cuda_array_interface__``) stay on the GPU, over NCCL inside a node and MPI across nodes.

Run on a GPU (one GPU, CuPy 14, NCCL 2.28; not CUDA-aware MPI, not several GPUs per rank): see
docs/gpu.md for what is tested where and how to test it.

Nothing here imports CuPy at import time. One module per concern:

- cupy_arrays: recognizing device arrays without CuPy; CuPy and NCCL loaded on first use, and why not;
- nccl: NCCL dtype/op tables, reduction rules, the per-node communicator;
- paths: the path of a collective (a pure function of facts all ranks share), from the
  implementation the call's options ask for (AUTO, RING, NCCL);
- facts: per-communicator state (in the engine's pipeline): the job's facts, gathered once, and
  the NCCL communicator cache;
- transports, hierarchical: moving device buffers over NCCL, NCCL+MPI, MPI on device pointers or
  MPI staged through page-locked host memory;
- staging: page-locked host blocks kept between collectives, guarded by events;
- device_collectives: the five collectives on lists of device arrays;
- dispatch: the engine's hook, through the pipeline's public steps (collectives/pipeline.py);
- recipes: an allreduce's recorded data steps, so that the agreement can speculate on them;
- fast: the cached fast path of repeated allreduces (in the pipeline's FastPaths);
- binding: rank-to-GPU binding by local rank.
"""
from .binding import bind_device, device_for
from .cupy_arrays import any_device, as_cupy, cupy_reason, is_device_array, nccl_reason
from .dispatch import collective
from .paths import Path, choose, parse_implementation, unavailable_message

__all__ = ["any_device", "as_cupy", "is_device_array", "cupy_reason", "nccl_reason", "collective",
           "parse_implementation",
           "Path", "choose", "unavailable_message", "bind_device", "device_for"]
