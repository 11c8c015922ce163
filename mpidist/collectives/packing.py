"""Packing many leaves into few buffers, and unpacking results as views.

``plan`` splits leaf indices into packs (each pack holds one group, e.g. one dtype); packs are
decided from sizes every rank knows, so all ranks build the same plan. A pack of one leaf whose
dtype already matches is sent as a view of the caller's array: one large array takes no copy.

Automatic packing (``bytes_per_pack=0``): leaves of at least ``ALONE_BYTES`` travel alone
(their transfer dwarfs a call's latency, and packing would cost two copies), smaller ones are
fused into packs of up to ``AUTO_PACK_BYTES``. ``bytes_per_pack=B`` packs greedily up to B bytes
(a larger leaf travels alone); ``num_packs=K`` splits each group into K packs of about equal size
(``0``: every leaf alone), as TensorFlow's cross-device ops do.

The same functions pack and unpack device arrays (collectives/gpu): ``pack`` takes the array
module (``xp=cupy``) for the buffers it allocates; the others only use methods that NumPy and
CuPy arrays share (``view``, ``astype``, ``reshape``, slicing).
"""
from __future__ import annotations

import math
from typing import Any, Hashable, Sequence

import numpy as np

from . import buffers

ALONE_BYTES = 64 * 1024
AUTO_PACK_BYTES = 4 * 1024 * 1024
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
        elif bytes_per_pack > 0:
            packs += _greedy(idx, nbytes, bytes_per_pack, bytes_per_pack)
        else:
            packs += _greedy(idx, nbytes, AUTO_PACK_BYTES, ALONE_BYTES)
    return packs


def _greedy(idx: list[int], nbytes: Sequence[int], limit: int, alone_from: int) -> list[list[int]]:
    packs: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i in idx:
        if nbytes[i] >= alone_from:
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
    caller's ``rc.bytes_per_pack``); 0, automatic, means ``AUTO_PACK_BYTES`` (4 MiB). The one rule
    for TensorFlow's buckets (tensorflow/buckets.py) and NumPy's (overlap.py)."""
    size = default if bytes_per_pack is None else bytes_per_pack
    return int(size) if size else AUTO_PACK_BYTES


def backprop_buckets(sizes: Sequence[int | None], limit: int | None) -> list[list[int]]:
    """Indices of ``sizes`` (bytes) in buckets for overlapping gradients with backprop: walked from
    the last index (whose gradient exists first), a bucket closes at the first entry that brings it
    to ``limit`` bytes; within a bucket the indices keep the list's order. One bucket of everything
    when ``limit`` is None or a size is unknown (None), since every rank must make the same plan.
    (The TensorFlow bridge's buckets, tensorflow/buckets.py, and the cost model's overlap use it.)"""
    n = len(sizes)
    known = [s for s in sizes if s is not None]
    if limit is None or n < 2 or len(known) < n:
        return [list(range(n))] if n else []
    buckets: list[list[int]] = []
    current: list[int] = []
    held = 0
    for i in reversed(range(n)):
        current.append(i)
        held += known[i]
        if held >= limit:
            buckets.append(sorted(current))
            current, held = [], 0
    if current:
        buckets.append(sorted(current))
    return buckets
