"""One GPU per rank under ``mpidist run``, before TensorFlow or CuPy start using GPUs.

Each rank uses GPU ``local_rank % n`` of the GPUs its node shows it (the same rule as the
strategies' CuPy binding, collectives/gpu/binding.py), chosen without initialising CUDA: the GPUs
are those of ``CUDA_VISIBLE_DEVICES`` when it is set, else those the NVIDIA driver lists in
``/proc/driver/nvidia/gpus``. Nothing is done when the launcher already gave the rank one GPU
(``CUDA_VISIBLE_DEVICES`` of one device, as Slurm's ``--gpus-per-task=1`` does), when there is no
GPU, or when ``MPIDIST_BIND_GPU=0``.

The choice is applied when the program imports TensorFlow (``tf.config.set_visible_devices`` of
that one GPU) and CuPy (its current device), not through ``CUDA_VISIBLE_DEVICES``: a Horovod
program that pins by hand (``gpus = tf.config.list_physical_devices("GPU");
tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")``) still sees every GPU of the node
and makes the same choice.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from types import ModuleType
from typing import Mapping

__all__ = ["Plan", "plan", "apply_tensorflow", "apply_cupy", "driver_gpu_count"]

_log = logging.getLogger("mpidist")
DRIVER_GPUS = "/proc/driver/nvidia/gpus"


@dataclass(frozen=True)
class Plan:
    """``index``: the GPU (in the rank's visible list) this rank uses, or None to leave GPUs alone;
    ``reason``: why, in words; ``visible``: how many GPUs the rank was shown."""

    index: int | None
    reason: str
    visible: int = 0


def driver_gpu_count(directory: str = DRIVER_GPUS) -> int:
    """How many GPUs the NVIDIA driver lists (0 without the driver); initialises nothing."""
    try:
        return len(os.listdir(directory))
    except OSError:
        return 0


def plan(local_rank: int, local_size: int, environ: Mapping[str, str] | None = None,
         driver_count: int | None = None, enabled: bool = True) -> Plan:
    """The GPU of the rank ``local_rank`` of ``local_size`` on its node (see the module docstring)."""
    env = os.environ if environ is None else environ
    if not enabled:
        return Plan(None, "MPIDIST_BIND_GPU=0: the program chooses its GPUs")
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        n = len([d for d in visible.split(",") if d.strip()])
        source = "CUDA_VISIBLE_DEVICES"
    else:
        n = driver_gpu_count() if driver_count is None else driver_count
        source = "the NVIDIA driver"
    if n == 0:
        return Plan(None, "no GPU visible")
    if n == 1:
        return Plan(None, f"one GPU visible ({source}): nothing to choose", 1)
    index = local_rank % n
    shared = f"; {local_size} ranks share {n} GPUs" if local_size > n else ""
    return Plan(index, f"GPU {index} of the {n} that {source} shows (local rank {local_rank}){shared}", n)


def apply_tensorflow(tf: ModuleType, chosen: Plan) -> None:
    """Make GPU ``chosen.index`` TensorFlow's only visible GPU (before TensorFlow initialises it)."""
    if chosen.index is None:
        return
    gpus = tf.config.list_physical_devices("GPU")
    if len(gpus) <= chosen.index:
        return
    try:
        tf.config.set_visible_devices(gpus[chosen.index], "GPU")
    except RuntimeError as error:  # TensorFlow initialised its devices already
        _log.warning("mpidist run: could not give TensorFlow GPU %d alone: %s", chosen.index, error)


def apply_cupy(cupy: ModuleType, chosen: Plan) -> None:
    """Make GPU ``chosen.index`` CuPy's current device."""
    if chosen.index is None:
        return
    try:
        if chosen.index < int(cupy.cuda.runtime.getDeviceCount()):
            cupy.cuda.Device(chosen.index).use()
    except Exception as error:  # a CUDA install that cannot answer: leave devices alone, say why
        _log.warning("mpidist run: could not make GPU %d CuPy's device: %s", chosen.index, error)
