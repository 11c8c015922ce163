"""Packing many leaves into few buffers, and unpacking results as views.

``plan`` splits leaf indices into packs (each pack holds one group, e.g. one dtype); packs are
decided from sizes every rank knows, so all ranks build the same plan. A pack of one leaf whose
dtype already matches is sent as a view of the caller's array: one large array takes no copy.

Automatic packing (``bytes_per_pack=0``, the default) is **fusion**: every leaf, large ones
included, is packed greedily, in the nest's order, into packs of up to ``FUSION_BYTES`` (64 MiB), so
one step's gradients of B bytes of one dtype go in about ⌈B / 64 MiB⌉ MPI calls (a ResNet-50's
102 MB: 2; a BERT-base's 440 MB: 7), in the same order on every rank. A pack closes before the
leaf that would take it over the limit, so every pack but the last of a group holds more than
64 MiB minus that next leaf. A single leaf of the limit or more travels alone (the smaller ones
go on filling the pack around it), as a view of the caller's array when its dtype is already the
wire dtype: it is never split, because a split leaf could no longer come back as a view of one
receive buffer (a copy out), and a message that large already pays a call's latency back many
times over.

The trade-off. Fusing costs one copy of each leaf into the pack (``np.concatenate`` into a recycled
buffer); results come back as views of the pack's receive buffer, so there is no copy out. The copy
runs at memory bandwidth: ResNet-50's 102 MB took 9.4 ms at best here (10.9 GB/s), a quarter of
the 2-rank shared-memory allreduce of the same bytes (~40 ms) and a smaller share across a network;
MPI libraries also copy the send buffer into the receive buffer themselves in their ring and
recursive-doubling algorithms. Each MPI call pays its algorithm's latency term, 2(N-1)·α for a
ring (α: ~2-5 µs per message across a network): at 512 ranks and 3 µs that is ~3 ms per call, so
the 54 calls of ResNet-50 under the old rule (leaves of 64 KiB and more alone, 4 MiB packs) cost
~160 ms of latency per step against ~6 ms for 2 packs. Why 64 MiB: the smallest round size that
puts ResNet-50 in at most 3 calls (issue 33's bound; it needs >= 51 MB); a pack's bandwidth term
dwarfs its latency term at any scale (64 MiB at 10 GB/s is 6.7 ms); and the memory it adds is
bounded: a pack's send buffer comes from the recycled pool (buffers.py, capped by
``rc.buffer_pool_bytes``, 512 MiB) and is reused by the next pack and the next step, while the
receive buffer holds the results the caller would hold anyway. Measured against it on one
oversubscribed machine (4 ranks on 2 cores): messages of 1-9 MB beat one of 100 MB there, so the
old rule was twice as fast (docs/performance.md, "Issue 33: fusion of large tensors");
``bytes_per_pack`` picks smaller packs where that holds. Horovod fuses up to 128 MB (64 MB before
0.21), PyTorch DDP in ~25 MB buckets.

``bytes_per_pack=B`` packs greedily up to B bytes the same way (``rc.bytes_per_pack``,
``HOROVOD_FUSION_THRESHOLD`` and ``CommunicationOptions(bytes_per_pack=B)`` set it); ``num_packs=K``
splits each group into K packs of about equal size (``0``: every leaf alone), as TensorFlow's
cross-device ops do.

The same functions pack and unpack device arrays (collectives/gpu): ``pack`` takes the array
module (``xp=cupy``) for the buffers it allocates; the others only use methods that NumPy and
CuPy arrays share (``view``, ``astype``, ``reshape``, slicing).
"""
from __future__ import annotations

import math
from typing import Any, Hashable, Sequence

import numpy as np

from . import buffers

FUSION_BYTES = 64 * 1024 * 1024  # the automatic pack size: see the module docstring
ALIGN = 16  # byte packs align every leaf so unpacked views are aligned for any dtype


def plan(nbytes: Sequence[int], groups: Sequence[Hashable], bytes_per_pack: int,
         num_packs: int | None) -> list[list[int]]:
    """Leaf indices split into packs; within a pack, leaves keep their order."""
    by_group: dict[Hashable, list[int]] = {}
    for i, g in enumerate(groups):
        by_group.setdefault(g, []).append(i)
    packs: list[list[int]] = []
    for idx in by_group.values():
        if num_packs is not None:
            packs += [[i] for i in idx] if num_packs == 0 else _even(idx, nbytes, num_packs)
        else:
            packs += _greedy(idx, nbytes, bytes_per_pack if bytes_per_pack > 0 else FUSION_BYTES)
    return packs


def _greedy(idx: list[int], nbytes: Sequence[int], limit: int) -> list[list[int]]:
    """Packs of up to ``limit`` bytes in order; a leaf of ``limit`` or more alone (the others go on
    filling the pack around it)."""
    packs: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i in idx:
        if nbytes[i] >= limit:
            packs.append([i])
            continue
        if current and size + nbytes[i] > limit:
            packs.append(current)
            current, size = [], 0
        current.append(i)
        size += nbytes[i]
    if current:
        packs.append(current)
    return packs


def _even(idx: list[int], nbytes: Sequence[int], k: int) -> list[list[int]]:
    k = min(k, len(idx))
    total = sum(nbytes[i] for i in idx)
    packs: list[list[int]] = [[]]
    acc = 0
    for pos, i in enumerate(idx):
        left_leaves, left_packs = len(idx) - pos, k - len(packs)
        if packs[-1] and (acc >= total * len(packs) / k or left_leaves == left_packs):
            packs.append([])
        packs[-1].append(i)
        acc += nbytes[i]
    return packs


def as_dtype(array: Any, dtype: np.dtype) -> Any:
    """``array`` in ``dtype``: a view when only bool→uint8 reinterpretation is needed."""
    if array.dtype == dtype:
        return array
    if array.dtype.kind == "b" and dtype == np.uint8:
        return array.view(np.uint8)
    return array.astype(dtype)


def pack(arrays: Sequence[Any], dtype: np.dtype, xp: Any = None) -> Any:
    """One 1-D buffer of ``dtype`` holding ``arrays`` back to back (a view for a single array).

    ``xp``: the array module of device arrays (CuPy), whose ``empty`` makes the buffer; None: host
    NumPy arrays, packed into a recycled buffer (buffers.py)."""
    if len(arrays) == 1:
        return as_dtype(arrays[0], dtype).reshape(-1)
    if xp is None:
        out = buffers.empty(sum([a.size for a in arrays]), dtype)
        return np.concatenate(arrays, axis=None, out=out, casting="safe")
    out = xp.empty(sum([a.size for a in arrays]), dtype=dtype)
    at = 0
    for a in arrays:
        out[at:at + a.size] = as_dtype(a, dtype).reshape(-1)
        at += a.size
    return out


def unpack(buffer: Any, shapes: Sequence[tuple], dtypes: Sequence[np.dtype]) -> list[Any]:
    """Split a buffer from :func:`pack` back into arrays (views where the dtype already matches)."""
    out, offset = [], 0
    same = buffer.dtype
    for shape, dtype in zip(shapes, dtypes):
        count = math.prod(shape)
        piece = buffer[offset:offset + count].reshape(shape)
        offset += count
        out.append(piece if dtype == same else from_wire(piece, dtype))
    return out


def from_wire(piece: Any, dtype: np.dtype) -> Any:
    """A result in the caller's dtype: inverse of :func:`as_dtype` (a view for uint8→bool)."""
    if piece.dtype == dtype:
        return piece
    return piece.view(np.bool_) if dtype.kind == "b" else piece.astype(dtype)


def byte_layout(nbytes: Sequence[int]) -> tuple[list[int], int]:
    """Offsets of leaves in a byte pack (each aligned to ``ALIGN``) and the pack's total size."""
    offsets, total = [], 0
    for n in nbytes:
        offsets.append(total)
        total += -(-n // ALIGN) * ALIGN
    return offsets, total


def bytes_of(array: Any) -> Any:
    """A contiguous array's memory as a 1-D uint8 view."""
    return array.reshape(-1).view(np.uint8)


def packed_bucket_bytes(bytes_per_pack: int | None, default: int) -> int:
    """The bucket size for :func:`backprop_buckets`: ``bytes_per_pack`` (None: ``default``, the
    caller's ``rc.bytes_per_pack``); 0, automatic, means ``FUSION_BYTES`` (64 MiB), the pack size,
    so that a bucket is one pack and a step costs as many MPI calls bucketed as not. The one rule
    for TensorFlow's buckets (tensorflow/buckets.py) and NumPy's (overlap.py)."""
    size = default if bytes_per_pack is None else bytes_per_pack
    return int(size) if size else FUSION_BYTES


def backprop_buckets(sizes: Sequence[int | None], limit: int | None) -> list[list[int]]:
    """Indices of ``sizes`` (bytes) in buckets for overlapping gradients with backprop: walked from
    the last index (whose gradient exists first), a bucket closes before the entry that would take it
    over ``limit`` bytes (an entry bigger than ``limit`` is a bucket of its own): the pack rule of
    :func:`plan`, walked backwards, so a bucket of one dtype is one pack of the engine's call and
    bucketing adds no MPI call. Within a bucket the indices keep the list's order. One bucket of
    everything when ``limit`` is None or a size is unknown (None), since every rank must make the
    same plan. (The TensorFlow bridge's buckets, tensorflow/buckets.py, NumPy's, overlap.py, and the
    cost model's overlap use it.)"""
    n = len(sizes)
    known = [s for s in sizes if s is not None]
    if limit is None or n < 2 or len(known) < n:
        return [list(range(n))] if n else []
    buckets: list[list[int]] = []
    current: list[int] = []
    held = 0
    for i in reversed(range(n)):
        if current and held + known[i] > limit:
            buckets.append(sorted(current))
            current, held = [], 0
        current.append(i)
        held += known[i]
    if current:
        buckets.append(sorted(current))
    return buckets
