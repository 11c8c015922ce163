"""``horovod.run(func, ...)``: Horovod's programmatic launcher, for programs that call it.

Horovod's ``run`` starts ``num_proc`` processes, runs ``func`` in each and returns the list of
their results in rank order. Under MPI the processes already exist (``mpirun -n N mpidist run
prog.py``): every rank calls ``run``, runs ``func`` once, and every rank gets the list of all the
ranks' results, in rank order, as Horovod's caller does. The job's size must be what the program
asks for (``num_proc``, or Horovod's older ``np``; an elastic call accepts any size from
``min_num_proc`` to ``max_num_proc``); otherwise ``run`` raises, on every rank, saying how to
launch. Host, network and controller arguments are about starting processes, which the MPI
launcher has done: they are accepted and not used.

An exception in ``func`` is not caught: it ends the job like any uncaught exception of an MPI
program under mpidist (every rank stops; see ``mpidist.rc.abort_on_error``).
"""
from __future__ import annotations

import logging
from typing import Any, Callable

from mpi4py import MPI

from ..validation import is_integer

__all__ = ["run"]

_log = logging.getLogger("mpidist")


def _count(value: Any, name: str) -> int | None:
    if value is None:
        return None
    if not is_integer(value) or value < 1:
        raise ValueError(f"horovod.run: `{name}` must be a positive int, got {value!r}")
    return int(value)


def _accepted_sizes(num_proc: int, min_num_proc: int | None, max_num_proc: int | None) -> tuple[int, float]:
    if min_num_proc is None and max_num_proc is None:
        return num_proc, num_proc
    low = min_num_proc if min_num_proc is not None else num_proc
    high: float = max_num_proc if max_num_proc is not None else float("inf")
    if low > high:
        raise ValueError(f"horovod.run: `min_num_proc` ({low}) must be <= `max_num_proc` ({max_num_proc})")
    return low, high


def run(func: Callable[..., Any], args: tuple = (), kwargs: dict | None = None, num_proc: int = 1,
        min_num_proc: int | None = None, max_num_proc: int | None = None, slots: Any = None,
        reset_limit: Any = None, cooldown_range: Any = None, hosts: Any = None, hostfile: Any = None,
        start_timeout: Any = None, ssh_port: Any = None, ssh_identity_file: Any = None, disable_cache: Any = None,
        output_filename: Any = None, verbose: Any = None, use_gloo: Any = None, use_mpi: Any = None,
        mpi_args: Any = None, network_interface: Any = None, executable: Any = None, np: Any = None,
        min_np: Any = None, max_np: Any = None) -> list[Any]:
    """Run ``func(*args, **kwargs)`` on every rank of this MPI job; returns every rank's result, in
    rank order, on every rank (collective over COMM_WORLD). See the module docstring."""
    if not callable(func):
        raise TypeError(f"horovod.run: `func` must be callable, got {type(func).__name__}")
    if hosts is not None and hostfile is not None:
        raise ValueError("horovod.run: give `hosts` or `hostfile`, not both")
    if use_gloo and use_mpi:
        raise ValueError("horovod.run: give `use_gloo` or `use_mpi`, not both")
    wanted = _count(np if np is not None and num_proc == 1 else num_proc, "num_proc")
    low, high = _accepted_sizes(wanted or 1, _count(min_num_proc if min_num_proc is not None else min_np,
                                                    "min_num_proc"),
                                _count(max_num_proc if max_num_proc is not None else max_np, "max_num_proc"))
    world = MPI.COMM_WORLD
    size = world.Get_size()
    if not low <= size <= high:
        asked = f"{wanted} processes" if low == high else f"{low} to {high} processes"
        raise RuntimeError(
            f"horovod.run: the program asks for {asked}, but this MPI job has {size} rank(s). mpidist does not "
            f"start processes from inside a program: launch it with that many ranks, e.g. "
            f"`mpirun -n {wanted} mpidist run PROGRAM ARGS` or `mpidist horovodrun -np {wanted} python PROGRAM ARGS`")
    if use_gloo:
        _log.debug("horovod.run: use_gloo ignored: mpidist's collectives run on MPI")
    result = func(*args, **(kwargs or {}))
    comm = world.Dup()  # never matches the program's own messages
    try:
        return list(comm.allgather(result))
    finally:
        comm.Free()
