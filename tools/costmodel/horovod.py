"""Horovod's schedule of one step's gradients, on paper: 128 MB fusion buffer, 1 ms cycle.

What is modelled (Horovod's documented behaviour, docs "Tensor Fusion" and "Autotune": defaults
``HOROVOD_FUSION_THRESHOLD`` = 128 MB since 0.21, ``HOROVOD_CYCLE_TIME`` = 1 ms; nothing of
Horovod's code is used here): gradients become ready during the backward pass, in reverse model
order, at a uniform rate in bytes (assumption: the backward pass's real profile is not recorded).
A background loop wakes every cycle (the first at the backward pass's start): at a wake-up it
negotiates which tensors are ready on every rank (with the response cache: one allreduce of a bit vector of
⌈tensors / 8⌉ bytes), then fuses the ready ones greedily, in order, into buffers of up to the
threshold (a tensor of the threshold or more alone), and for each buffer copies the tensors in,
allreduces it and copies the results out (two copies). The loop's next wake-up is one cycle after
this one, or when its work ends if that is later (it sleeps only what is left of the cycle).
Compute and communication run side by side (NCCL's stream, a NIC): the step's **exposed**
communication is how long the last allreduce ends after the backward pass.

The allreduce of a buffer costs ``cost(nbytes)`` (step.py passes the cost model's NCCL prediction,
the cheaper of ring and tree as NCCL picks, on GPU presets; the best flat MPI algorithm on CPU).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

FUSION_BYTES = 128 * 1024 * 1024
CYCLE_S = 1e-3


@dataclass(frozen=True)
class Schedule:
    exposed_s: float    # communication after the backward pass ends
    busy_s: float       # the background loop's working time in all (negotiation, copies, allreduces)
    buffers: int        # fused allreduces
    cycles: int         # wake-ups that sent something


def ready_times(sizes: Sequence[int], backward_s: float) -> list[float]:
    """When each tensor's gradient is ready (seconds from the backward pass's start): reverse model
    order, at a uniform rate in bytes, the first tensor of the model last (at ``backward_s``)."""
    total = sum(sizes) or 1
    out = [0.0] * len(sizes)
    done = 0
    for i in reversed(range(len(sizes))):
        done += sizes[i]
        out[i] = backward_s * done / total
    return out


def fuse(sizes: Sequence[int], limit: int) -> list[list[int]]:
    """Indices of ``sizes`` in buffers of up to ``limit`` bytes, in order (a size >= limit alone)."""
    buffers: list[list[int]] = []
    current: list[int] = []
    used = 0
    for i, n in enumerate(sizes):
        if n >= limit:
            buffers.append([i])
            continue
        if current and used + n > limit:
            buffers.append(current)
            current, used = [], 0
        current.append(i)
        used += n
    if current:
        buffers.append(current)
    return buffers


def schedule(sizes: Sequence[int], backward_s: float, cost: Callable[[float], float], copy_bandwidth: float,
             fusion_bytes: int = FUSION_BYTES, cycle_s: float = CYCLE_S) -> Schedule:
    """Horovod's loop over one step's gradients of ``sizes`` bytes (model order); see the module docstring."""
    if cycle_s <= 0 or fusion_bytes < 1 or copy_bandwidth <= 0:
        raise ValueError(f"schedule: `cycle_s`, `fusion_bytes` and `copy_bandwidth` must be > 0, got "
                         f"{cycle_s!r}, {fusion_bytes!r}, {copy_bandwidth!r}")
    ready = ready_times(sizes, backward_s)
    order = sorted(range(len(sizes)), key=lambda i: (ready[i], -i))  # backprop order
    negotiate = cost(math.ceil(len(sizes) / 8))
    at, t, end, busy, buffers, cycles = 0, 0.0, 0.0, 0.0, 0, 0
    while at < len(order):
        batch = []
        while at < len(order) and ready[order[at]] <= t + 1e-12:
            batch.append(order[at])
            at += 1
        if not batch:  # nothing ready: wake-ups go by until the next tensor is
            t += max(1, math.ceil((ready[order[at]] - t) / cycle_s - 1e-9)) * cycle_s
            continue
        work = negotiate
        for group in fuse([sizes[i] for i in batch], fusion_bytes):
            nbytes = sum(sizes[batch[j]] for j in group)
            work += cost(nbytes) + 2 * nbytes / copy_bandwidth
            buffers += 1
        cycles += 1
        busy += work
        end = t + work
        t = max(t + cycle_s, end)
    return Schedule(max(0.0, end - backward_s), busy, buffers, cycles)
