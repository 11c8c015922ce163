"""Agreement: before data moves, every rank checks that all ranks run the same collective.

A collective's signature (kind, op, root, structure, dtypes, shapes, packing and algorithm
settings) is hashed to 62 bits, cached per signature, and exchanged with one 16-byte
non-blocking ``Iallreduce(MIN)`` of ``[h, -h]``: every rank learns min and max of all hashes at once, so all
ranks see a mismatch together. Then, and only then, the ranks exchange readable descriptions and
raise :class:`CollectiveMismatchError` naming what each rank sent. The exchange is the same MPI
call for every kind of collective, so even ranks in different collectives meet in it.
"""
from __future__ import annotations

import hashlib
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from ..errors import CollectiveMismatchError

_MASK = (1 << 62) - 1


def signature_hash(key: tuple, cache: dict[tuple, int]) -> int:
    h = cache.get(key)
    if h is None:
        h = int.from_bytes(hashlib.blake2b(repr(key).encode(), digest_size=8).digest(), "little") & _MASK
        if len(cache) > 4096:
            cache.clear()
        cache[key] = h
    return h


def agree(comm: MPI.Intracomm, call: Any, key: tuple, cache: dict[tuple, int],
          describe: Callable[[tuple], str], where: str) -> None:
    """Raise CollectiveMismatchError on every rank unless all ranks passed an equal ``key``."""
    h = signature_hash(key, cache)
    both = np.empty(2, dtype=np.int64)
    call.nonblocking(comm, "Allreduce", _pair(h), both, MPI.MIN)
    if both.tolist() != [h, -h]:
        report(comm, key, describe, where)


def agree_blocking(comm: MPI.Intracomm, h: int, key: tuple, describe: Callable[[tuple], str], where: str) -> None:
    """:func:`agree` for a known hash without a deadline (the engine's cached fast path)."""
    both = np.empty(2, dtype=np.int64)
    comm.Iallreduce(_pair(h), both, MPI.MIN).Wait()
    if both.tolist() != [h, -h]:
        report(comm, key, describe, where)


def report(comm: MPI.Intracomm, key: tuple, describe: Callable[[tuple], str], where: str) -> None:
    """All ranks saw different hashes: exchange descriptions and raise, on every rank."""
    descriptions = comm.allgather(describe(key))
    raise CollectiveMismatchError(mismatch_message(where, descriptions))


_pairs: dict[int, np.ndarray] = {}


def _pair(h: int) -> np.ndarray:
    """The read-only send buffer ``[h, -h]``, built once per signature."""
    pair = _pairs.get(h)
    if pair is None:
        if len(_pairs) > 4096:
            _pairs.clear()
        pair = _pairs[h] = np.array([h, -h], dtype=np.int64)
        pair.flags.writeable = False
    return pair


def mismatch_message(where: str, descriptions: list[Any]) -> str:
    groups: dict[str, list[int]] = {}
    for rank, text in enumerate(descriptions):
        groups.setdefault(str(text), []).append(rank)
    lines = [f"{where}: ranks issued different collectives (each rank must issue the same collectives "
             f"in the same order with the same op, root, dtypes, shapes and structure):"]
    for text, ranks in groups.items():
        lines.append(f"  {_ranks(ranks)}: {text}")
    return "\n".join(lines)


def _ranks(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2:
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks))
