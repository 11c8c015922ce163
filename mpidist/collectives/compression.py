"""Compression on the wire: float32 SUM/MEAN allreduce data sent as float16 or bfloat16.

``rc.compression`` (env ``MPIDIST_COMPRESSION``), ``CallOptions(compression=...)`` or
``CommunicationOptions(compression=...)``: "none" (the default), "float16" or "bfloat16".
MPI has no float16/bfloat16 SUM, so the reduction is not MPI's: it is a reduce-scatter and an
allgather of 16-bit data, with the sums in float32:

1. each rank cuts a pack into ``size`` blocks (as ``numpy.array_split`` does) and sends block
   ``j``, compressed, to rank ``j`` (one ``Alltoallv``);
2. rank ``j`` decompresses what it got and adds it to its own block in float32 (in rank order;
   its own block never leaves float32), divides by ``size`` for MEAN, and compresses the result
   once;
3. one ``Allgatherv`` of the compressed results; every rank decompresses all blocks, its own
   included, so every rank returns the same bits.

Each value is rounded twice (the sender's copy, then the sum): with ``u`` = 2^-11 (float16) or
2^-8 (bfloat16), ``|result - exact| <= u * (sum_i |x_i| + |result|)`` plus float16's underflow
term below. Half the bytes of a float32 allreduce travel; the conversions cost CPU time, so it
pays where the network, not memory, is the limit (docs/compression.md has the figures).

**float16 range.** Every compressed block carries a power-of-two scale (an int16 exponent in one
extra 16-bit word): the block's largest magnitude is scaled into [2^14, 2^15), so values beyond
float16's 65504 do not overflow and small gradients do not underflow; within a block, values
below ``max * 2^-24`` lose precision (float16 subnormals) and below ``max * 2^-39`` become 0. A
block holding inf or NaN is sent unscaled (its inf/NaN survive; its finite values beyond 65504
become inf). bfloat16 has float32's range and needs no scale.

What travels uncompressed: leaves of other dtypes (float64, float16, integers ...) and other ops
(MIN, MAX, PROD), in the same call through the usual path; one rank (nothing travels, the
result is exact); device (GPU) buffers; reduce, reduce_scatter, broadcast, allgather. The
``algorithm`` option does not apply to compressed packs (the steps above run on the whole
communicator). Ranks must use the same setting: it is part of the agreement key.
"""
from __future__ import annotations

from typing import Callable, cast

import numpy as np
from mpi4py import MPI

from . import buffers, packing
from .algorithms.flat import displacements
from .ops import Op

OPS = (Op.SUM, Op.MEAN)  # the ops that go compressed (for float32 leaves)
F32 = np.dtype(np.float32)
_U16 = np.dtype(np.uint16)
_MAX_SHIFT = 100  # float16 scales stay within 2^±100 (finite float32 factors both ways)


def run(ctx, arrays: list[np.ndarray], op: Op, others: Callable[[list[np.ndarray]], list[np.ndarray]]
        ) -> list[np.ndarray]:
    """Allreduce of ``arrays``: float32 leaves compressed (packed as ``ctx.plan`` says), the rest
    through ``others`` (the uncompressed path), in that order on every rank."""
    codec = _CODECS[ctx.compression]
    mine = [i for i, a in enumerate(arrays) if a.dtype == F32]
    rest = [i for i, a in enumerate(arrays) if a.dtype != F32]
    results: list[np.ndarray] = [None] * len(arrays)  # type: ignore[list-item]  # each filled below
    if mine:
        if ctx.size > 1:  # the timeline's record of this collective says so
            ctx.notes = {**(ctx.notes or {}), "compression": codec.name}
        leaves = [arrays[i] for i in mine]
        for pack in ctx.plan([a.nbytes for a in leaves], [F32] * len(leaves)):
            send = packing.pack([leaves[k] for k in pack], F32)
            recv = reduce_buffer(ctx, send, op, codec)
            for k, out in zip(pack, packing.unpack(recv, [leaves[k].shape for k in pack], [F32] * len(pack))):
                results[mine[k]] = out
    if rest:
        for i, out in zip(rest, others([arrays[i] for i in rest])):
            results[i] = out
    return results


def blocks(count: int, size: int) -> tuple[list[int], list[int]]:
    """Element counts and offsets of the ``size`` blocks of ``count`` elements (array_split's cut)."""
    base, extra = divmod(count, size)
    counts = [base + (j < extra) for j in range(size)]
    return counts, displacements(counts)


def reduce_buffer(ctx, send: np.ndarray, op: Op, codec: Codec) -> np.ndarray:
    """SUM (or MEAN) of the 1-D float32 ``send`` over ``ctx``'s ranks, compressed on the wire."""
    comm, size, rank = ctx.topo.comm, ctx.size, ctx.topo.rank
    out = buffers.empty(send.size, F32)
    if size == 1:  # nothing travels: the exact value
        np.copyto(out, send)
        return out
    counts, offsets = blocks(send.size, size)
    head = codec.header
    # 1. block j, compressed, to rank j (none to ourselves)
    send_counts = [0 if j == rank else head + counts[j] for j in range(size)]
    send_displs = displacements(send_counts)
    wire = buffers.empty(sum(send_counts), _U16)
    for j in range(size):
        if j != rank:
            at = send_displs[j]
            codec.encode(send[offsets[j]:offsets[j] + counts[j]], wire[at:at + head + counts[j]])
    mine = counts[rank]
    recv_counts = [0 if i == rank else head + mine for i in range(size)]
    recv_displs = displacements(recv_counts)
    got = buffers.empty(sum(recv_counts), _U16)
    ctx.call(comm, "Alltoallv", [wire, (send_counts, send_displs), MPI.UINT16_T],
             [got, (recv_counts, recv_displs), MPI.UINT16_T])
    # 2. our block's sum in float32, in rank order, compressed once
    total = out[offsets[rank]:offsets[rank] + mine]  # scratch: the allgather's result replaces it
    np.copyto(total, send[offsets[rank]:offsets[rank] + mine])
    for i in range(size):
        if i != rank:
            at = recv_displs[i]
            codec.accumulate(got[at:at + head + mine], total)
    if op is Op.MEAN:
        total /= size
    block = buffers.empty(head + mine, _U16)
    codec.encode(total, block)
    # 3. everyone's compressed results to everyone, decompressed (our own block too: same bits everywhere)
    gather_counts = [head + c for c in counts]
    gather_displs = displacements(gather_counts)
    gathered = buffers.empty(sum(gather_counts), _U16)
    ctx.call(comm, "Allgatherv", [block, MPI.UINT16_T], [gathered, (gather_counts, gather_displs), MPI.UINT16_T])
    for j in range(size):
        at = gather_displs[j]
        codec.decode(gathered[at:at + head + counts[j]], out[offsets[j]:offsets[j] + counts[j]])
    return out


class Codec:
    """float32 to 16-bit words and back, a cache-sized chunk at a time (each step is several NumPy
    passes; on chunks they stay in cache instead of going to memory and back each time).

    ``encode(x, wire)`` fills ``wire`` (``header`` words first, then one word per value);
    ``decode(wire, out)`` writes the float32 values into ``out``; ``accumulate(wire, total)``
    adds them to ``total``."""

    name = "none"
    header = 0

    def encode(self, x: np.ndarray, wire: np.ndarray) -> None:
        state = self.start(x, wire)
        tmp = np.empty(min(CHUNK, x.size), np.uint32)
        for at in range(0, x.size, CHUNK):
            part = x[at:at + CHUNK]
            self.encode_chunk(part, wire[self.header + at:self.header + at + part.size], tmp[:part.size], state)

    def decode(self, wire: np.ndarray, out: np.ndarray) -> np.ndarray:
        state = self.state(wire)
        data = wire[self.header:]
        for at in range(0, out.size, CHUNK):
            self.decode_chunk(data[at:at + CHUNK], out[at:at + CHUNK], state)
        return out

    def accumulate(self, wire: np.ndarray, total: np.ndarray) -> None:
        state = self.state(wire)
        data = wire[self.header:]
        scratch = np.empty(min(CHUNK, total.size), F32)
        for at in range(0, total.size, CHUNK):
            part = total[at:at + CHUNK]
            np.add(part, self.decode_chunk(data[at:at + CHUNK], scratch[:part.size], state), out=part)

    # one codec's steps
    def start(self, x: np.ndarray, wire: np.ndarray) -> object:
        """Write the header of ``x``'s block into ``wire``; returns what encode_chunk needs."""
        return None

    def state(self, wire: np.ndarray) -> object:
        """What decode_chunk needs, from the block's header."""
        return None

    def encode_chunk(self, x: np.ndarray, wire: np.ndarray, tmp: np.ndarray, state: object) -> None:
        raise NotImplementedError

    def decode_chunk(self, wire: np.ndarray, out: np.ndarray, state: object) -> np.ndarray:
        raise NotImplementedError


CHUNK = 1 << 15  # values per chunk: 128 KiB of float32


class Float16(Codec):
    """IEEE float16 with a power-of-two scale per block (one int16 exponent word ahead of the data)."""

    name, header = "float16", 1

    def start(self, x: np.ndarray, wire: np.ndarray) -> object:
        shift = scale_exponent(x)
        wire[:1].view(np.int16)[0] = shift
        return np.float32(2.0 ** shift)

    def state(self, wire: np.ndarray) -> object:
        return np.float32(2.0 ** -int(wire[:1].view(np.int16)[0]))

    def encode_chunk(self, x: np.ndarray, wire: np.ndarray, tmp: np.ndarray, state: object) -> None:
        data = wire.view(np.float16)
        if state == 1:
            with np.errstate(over="ignore"):  # a block with inf/NaN: its values beyond 65504 become inf
                np.copyto(data, x, casting="same_kind")
        else:
            scaled = tmp.view(F32)
            np.multiply(x, cast(np.float32, state), out=scaled)  # state(): the block's float32 scale
            np.copyto(data, scaled, casting="same_kind")

    def decode_chunk(self, wire: np.ndarray, out: np.ndarray, state: object) -> np.ndarray:
        np.copyto(out, wire.view(np.float16))
        if state != 1:
            out *= state
        return out


def scale_exponent(x: np.ndarray) -> int:
    """The power of two that brings ``x``'s largest magnitude into [2^14, 2^15): 0 for an empty
    or all-zero block, or one holding inf/NaN (sent unscaled); clamped to ±100."""
    if x.size == 0:
        return 0
    high, low = float(x.max()), float(x.min())
    largest = max(high, -low)
    if not np.isfinite(largest) or largest == 0.0:
        return 0
    _, exponent = np.frexp(largest)  # largest = f * 2^exponent, 0.5 <= f < 1
    return int(min(_MAX_SHIFT, max(-_MAX_SHIFT, 15 - int(exponent))))


class BFloat16(Codec):
    """bfloat16 (float32's upper 16 bits), rounded to nearest even; NaN stays a (quiet) NaN."""

    name, header = "bfloat16", 0

    def encode_chunk(self, x: np.ndarray, wire: np.ndarray, tmp: np.ndarray, state: object) -> None:
        bits = x.view(np.uint32)
        np.right_shift(bits, 16, out=tmp)
        np.bitwise_and(tmp, 1, out=tmp)
        np.add(tmp, 0x7FFF, out=tmp)
        np.add(tmp, bits, out=tmp)  # + 0x7FFF + lowest kept bit: round half to even (wraps only for NaN)
        np.right_shift(tmp, 16, out=tmp)
        np.copyto(wire, tmp, casting="unsafe")
        if np.isnan(x.max()):  # NaN's rounding may have carried into inf or the sign
            wire[np.isnan(x)] = 0x7FC0

    def decode_chunk(self, wire: np.ndarray, out: np.ndarray, state: object) -> np.ndarray:
        np.left_shift(wire, 16, out=out.view(np.uint32), dtype=np.uint32)
        return out


_CODECS: dict[str, Codec] = {"float16": Float16(), "bfloat16": BFloat16()}


def codec(name: str) -> Codec:
    """The codec of a compression setting ("float16" or "bfloat16")."""
    return _CODECS[name]
