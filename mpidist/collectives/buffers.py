"""Recycled result buffers.

Under an MPI library a fresh multi-megabyte NumPy array costs page faults on every call (measured
here: a 4 MB Allreduce into a fresh array 5.4 ms, into a reused one 1.1 ms), because large
allocations come straight from mmap and go back on free. The pool keeps large blocks and hands
one out again only when nothing outside the pool refers to it any more: NumPy views always refer
to the array that owns the memory, so the block's reference count says whether any result, or any
view of one, is still alive. Users see ordinary arrays they own; memory is reused only after
they drop them.

Blocks come in size classes (four per power of two: 1, 1.25, 1.5, 1.75 × 2^k bytes), so requests of
nearby sizes share blocks and at most a quarter of a block is unused. The pool holds at most
``rc.buffer_pool_bytes`` (0 disables it), evicting free blocks of the least recently used classes
first; requests under ``MIN_BYTES`` use plain ``numpy.empty``. A :class:`Slot` serves a cached
fast path's repeated request: the same test, without looking the block up again.
"""
from __future__ import annotations

import mmap
import sys
import threading
import weakref
from collections import OrderedDict

import numpy as np

from .._config import rc

MIN_BYTES = 256 * 1024
HUGE_PAGE = 2 << 20  # blocks from 1 MiB: whole 2 MiB huge pages (Linux transparent huge pages)
HUGE_FROM = 1 << 20
_FREE_REFS = 3  # the pool's list, the local name, getrefcount's argument

_lock = threading.Lock()
_blocks: OrderedDict[int, list[np.ndarray]] = OrderedDict()
_held = 0


def size_class(nbytes: int) -> int:
    """The smallest of 2^k, 1.25·2^k, 1.5·2^k, 1.75·2^k bytes that holds ``nbytes``."""
    step = 1 << max(0, nbytes.bit_length() - 3)  # a quarter of the power of two below nbytes
    return -(-nbytes // step) * step


def empty(count: int, dtype: np.dtype) -> np.ndarray:
    """A 1-D array of ``count`` elements of ``dtype``, from the pool when it is large."""
    nbytes = count * dtype.itemsize
    if nbytes < MIN_BYTES or rc.buffer_pool_bytes == 0:
        return np.empty(count, dtype=dtype)
    return _block(nbytes)[0][:nbytes].view(dtype)


def _block(nbytes: int) -> tuple[np.ndarray, bool]:
    """A free block of ``nbytes``' size class, and whether the pool holds it (False: over the cap)."""
    size = size_class(nbytes)
    with _lock:
        for block in _blocks.get(size, ()):
            if sys.getrefcount(block) == _FREE_REFS:
                _blocks.move_to_end(size)
                return block, True
        block = _allocate(size)
        if _make_room(size):
            _blocks.setdefault(size, []).append(block)
            return block, True
    return block, False


class Slot:
    """The result buffer of one request that a cached fast path makes on every call: ``count``
    elements of ``dtype`` in ``shape`` (None: 1-D).

    :meth:`take` is :func:`empty` (then reshaped), made cheaper for the repeat: the pool block
    handed out last time is tried first, by a weak reference, with the pool's own test (nothing
    outside the pool refers to it any more, not even a view of a result), under the pool's lock.
    Only a block the pool holds is remembered, and the pool lets go of a block only while it is
    free, so a live reference means the block is still the pool's: a result the caller keeps is
    never handed out again. Anything else (the block in use, evicted, or never pooled) takes the
    pool's ordinary path.
    """

    __slots__ = ("count", "dtype", "shape", "nbytes", "_last")

    def __init__(self, count: int, dtype: np.dtype, shape: tuple[int, ...] | None = None) -> None:
        self.count, self.dtype, self.shape = count, np.dtype(dtype), shape
        self.nbytes = count * self.dtype.itemsize
        self._last: weakref.ref | None = None

    def take(self) -> np.ndarray:
        nbytes, last = self.nbytes, self._last
        if last is not None:
            with _lock:
                block = last()
                if block is not None and sys.getrefcount(block) == _FREE_REFS:
                    out = block[:nbytes].view(self.dtype)
                    return out if self.shape is None else out.reshape(self.shape)
        if nbytes < MIN_BYTES or rc.buffer_pool_bytes == 0:
            out = np.empty(self.count, dtype=self.dtype)
        else:
            block, pooled = _block(nbytes)
            self._last = weakref.ref(block) if pooled else None
            out = block[:nbytes].view(self.dtype)
        return out if self.shape is None else out.reshape(self.shape)


def empty_like(array: np.ndarray) -> np.ndarray:
    if array.nbytes < MIN_BYTES:
        return np.empty_like(array)
    return empty(array.size, array.dtype).reshape(array.shape)


def _allocate(size: int) -> np.ndarray:
    """A new block of ``size`` bytes. From ``HUGE_FROM`` bytes: an anonymous mapping aligned to
    ``HUGE_PAGE`` and advised MADV_HUGEPAGE, so that every page of it can be a huge page (NumPy's own
    large arrays start at an arbitrary offset and get at most a part: measured here, an Allreduce of
    1 MB into such a block took 0.53x the time of one into ``numpy.empty``'s, 4 MB 0.47x, at 2 ranks).
    The block is the array its views refer to (their ``base``), as the pool's reference test needs."""
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if size < HUGE_FROM or advice is None:
        return np.empty(size, dtype=np.uint8)
    length = -(-size // HUGE_PAGE) * HUGE_PAGE
    try:
        region = mmap.mmap(-1, length + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        start = np.frombuffer(region, dtype=np.uint8, count=1).ctypes.data
        offset = -start % HUGE_PAGE
        region.madvise(advice, offset, length)
        return np.frombuffer(region, dtype=np.uint8, count=size, offset=offset)
    except (OSError, ValueError):  # no such mapping or advice here: ordinary memory
        return np.empty(size, dtype=np.uint8)


def _make_room(nbytes: int) -> bool:
    """Evict free blocks, least recently used sizes first, until ``nbytes`` fits under the cap."""
    global _held
    limit = rc.buffer_pool_bytes
    for size in list(_blocks):
        if _held + nbytes <= limit:
            break
        kept = [b for b in _blocks[size] if sys.getrefcount(b) > _FREE_REFS]
        _held -= size * (len(_blocks[size]) - len(kept))
        if kept:
            _blocks[size] = kept
        else:
            del _blocks[size]
    if _held + nbytes > limit:
        return False
    _held += nbytes
    return True


def held_bytes() -> int:
    """Bytes the pool holds (in use by results or free for reuse)."""
    return _held
