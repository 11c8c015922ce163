"""What the agreement replays of a GPU allreduce (mpidist/collectives/gpu/recipes.py): recorded steps
become a recipe only when they are all of one replayable kind, and a recipe is attached to, kept
on, or dropped from the signature just agreed exactly as every rank would (no CuPy, no GPU)."""
from __future__ import annotations

import types

import numpy as np
from mpi4py import MPI

from mpidist.collectives.gpu import recipes
from mpidist.collectives.gpu.recipes import DeviceRecipe


def test_nccl_steps_are_all_reduces_or_nothing():
    calls = [("allReduce", 64, (1, 2, 16, 7, 0, 0)), ("allReduce", 8, (3, 4, 2, 7, 4, 0))]
    assert recipes.nccl_steps(calls) == (("nccl", 7, 16, 0, 64), ("nccl", 7, 2, 4, 8))
    assert recipes.nccl_steps(calls + [("broadcast", 8, (3, 3, 8, 1, 0, 0))]) is None


def test_mpi_steps_are_flat_allreduces_on_the_engines_communicator():
    comm, other = object(), object()
    send, recv = np.zeros(5, np.float32), np.zeros(5, np.float32)
    issued = [(comm, "Allreduce", (send, recv, MPI.SUM), False),
              (comm, "Allreduce", (MPI.IN_PLACE, recv, MPI.MAX), True)]
    assert recipes.mpi_steps(issued, comm) == ((np.dtype(np.float32), 5, MPI.SUM, False),
                                               (np.dtype(np.float32), 5, MPI.MAX, True))
    assert recipes.mpi_steps(issued, other) is None  # another communicator (Topology.cross ...)
    assert recipes.mpi_steps([(comm, "Bcast", (recv, 0), False)], comm) is None


def test_end_keeps_one_kind_of_steps_only():
    comm = object()
    ctx = types.SimpleNamespace(call=types.SimpleNamespace(issued=None), topo=types.SimpleNamespace(comm=comm))
    node = types.SimpleNamespace(issued=None)
    recipes.begin(ctx, node)
    node.issued.append(("allReduce", 4, (1, 2, 1, 7, 0, 0)))
    recipe = recipes.end(ctx, node, cp=None)
    assert isinstance(recipe, DeviceRecipe) and recipe.node is node and recipe == (("nccl", 7, 1, 0, 4),)
    assert ctx.call.issued is None and node.issued is None  # recording stops
    recipes.begin(ctx, node)  # NCCL and MPI mixed (the hierarchical paths): nothing to replay
    node.issued.append(("allReduce", 4, (1, 2, 1, 7, 0, 0)))
    ctx.call.issued.append((comm, "Allreduce", (np.zeros(1), np.zeros(1), MPI.SUM), False))
    assert recipes.end(ctx, node, cp=None) is None
    recipes.begin(ctx, None)
    assert recipes.end(ctx, None, cp=None) is None  # nothing issued (zero-size leaves): no speculation


def test_adopt_attaches_keeps_or_drops_as_every_rank_would():
    agreement = types.SimpleNamespace(last=None)
    recipes.adopt(agreement, (("nccl", 7, 1, 0, 4),))
    assert agreement.last is None  # nothing agreed: nothing to attach to
    agreement.last = (42, None)
    recipe = DeviceRecipe((("nccl", 7, 1, 0, 4),), node=None, cp=None)
    recipes.adopt(agreement, recipe)
    assert agreement.last == (42, recipe) and agreement.last[1] is recipe
    recipes.adopt(agreement, DeviceRecipe((("nccl", 7, 1, 0, 4),), node=None, cp=None))
    assert agreement.last[1] is recipe  # the same steps again: kept
    recipes.adopt(agreement, (("nccl", 7, 2, 0, 8),))
    assert agreement.last == (42, None)  # other steps for the same signature: never speculate on it
    recipes.adopt(agreement, None)
    assert agreement.last == (42, None)
