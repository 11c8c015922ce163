"""Page-locked host buffers kept between collectives, for the paths that stage device buffers
through host memory (``mpi-staged``, and the MPI steps of ``nccl+mpi`` without CUDA-aware MPI).

A staged step copies device -> host (queued on the caller's stream), waits for the stream once
(the data's producers and the copy), runs MPI on the host buffer, and queues the copy back
host -> device without waiting: the result is ordered on the stream like any other. Allocating
page-locked memory per call (``cudaHostAlloc``) costs more than the copy for small buffers, so
buffers are :class:`Block` s kept in a per-pipeline :class:`Staging` pool (gpu/facts.py) and by
the cached fast paths (gpu/fast.py).

A block is reused while its last copy back may still be reading it; an event guards it:

- :meth:`Block.mark` records the block's event on the stream after the queued copy back;
- :meth:`Block.after` (before device work writes the block on a stream): on another stream than
  the marked one, that stream waits for the event on the device (``wait_event``, no host wait);
  on the same stream the order is the stream's own;
- :meth:`Block.settle` (before the host writes the block without waiting for a stream first):
  the host waits for the event.

So a steady-state staged allreduce waits for the host exactly once. Blocks come in the size
classes of the host buffer pool (buffers.size_class), and go back to the pool when a collective
is done with them; the pool keeps them until the pipeline closes (:meth:`Staging.close` waits for
their copies first, since CuPy's page-locked pool hands freed memory out again at once).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ..buffers import size_class
from . import cupy_arrays

_UINT8 = np.dtype(np.uint8)


class Block:
    """One page-locked host buffer (``host``, bytes) and the event of its last queued copy."""

    __slots__ = ("host", "event", "stream")

    def __init__(self, cp: Any, nbytes: int) -> None:
        self.host = cupy_arrays.pinned_empty((nbytes,), _UINT8)
        self.event = cp.cuda.Event(disable_timing=True)
        self.stream: int | None = None  # pointer of the stream the event was recorded on; None: nothing pending

    def view(self, shape: tuple[int, ...], dtype: np.dtype, offset: int = 0) -> np.ndarray:
        """The bytes from ``offset`` as a C-contiguous array of ``shape`` and ``dtype``."""
        count = 1
        for n in shape:
            count *= n
        return self.host[offset:offset + count * dtype.itemsize].view(dtype).reshape(shape)

    def after(self, stream: Any) -> None:
        """Device work queued on ``stream`` from now on waits for the block's pending copy."""
        if self.stream is not None and self.stream != stream.ptr:
            stream.wait_event(self.event)

    def settle(self) -> None:
        """The host waits for the block's pending copy (before the host writes it)."""
        if self.stream is not None:
            self.event.synchronize()
            self.stream = None

    def mark(self, stream: Any) -> None:
        """A copy reading the block was just queued on ``stream``."""
        self.event.record(stream)
        self.stream = stream.ptr


class Staging:
    """The page-locked blocks of one pipeline: :meth:`take` one, :meth:`give` it back."""

    def __init__(self, cp: Any) -> None:
        self.cp = cp
        self.free: dict[int, list[Block]] = {}
        self.made = 0  # blocks allocated (tests: a steady state allocates none)

    def take(self, nbytes: int) -> Block:
        size = size_class(max(int(nbytes), 1))
        found = self.free.get(size)
        if found:
            return found.pop()
        self.made += 1
        return Block(self.cp, size)

    def give(self, block: Block) -> None:
        self.free.setdefault(block.host.nbytes, []).append(block)

    def close(self) -> None:
        """Wait for every pending copy, then drop the blocks."""
        for blocks in self.free.values():
            for block in blocks:
                block.settle()
        self.free.clear()
