"""Slurm test job across nodes: what MPI says about nodes, and the hierarchical allreduce against
the flat one and a NumPy reference; one line per rank for the test to parse.

    MPIDIST {"rank": 0, "size": 4, "host": "node1", "num_nodes": 2, "node_sizes": [2, 2], ...}
"""
from __future__ import annotations

import json
import os

import numpy as np
from mpi4py import MPI

import mpidist
from mpidist.collectives.algorithms import hierarchical

calls = []
original = hierarchical.allreduce
hierarchical.allreduce = lambda *a, **k: calls.append(1) or original(*a, **k)

engine = mpidist.Engine()
topo = engine.topology
rank, size = engine.rank, engine.size
checks = {}
for dtype in (np.int64, np.float64, np.float32):
    for op in ("sum", "max", "min"):
        for shape in [(7,), (40_001,)]:  # the long one is split into shards across the nodes
            mine = ((np.arange(np.prod(shape)).reshape(shape) % 13) * (rank + 1) - rank).astype(dtype)
            every = [((np.arange(np.prod(shape)).reshape(shape) % 13) * (r + 1) - r).astype(dtype) for r in range(size)]
            expected = {"sum": lambda: np.sum(every, axis=0), "max": lambda: np.max(every, axis=0),
                        "min": lambda: np.min(every, axis=0)}[op]().astype(dtype)
            flat = engine.allreduce(mine, op, algorithm="flat")
            hier = engine.allreduce(mine, op, algorithm="hierarchical")
            checks[f"{np.dtype(dtype).name} {op} {shape}"] = bool(np.array_equal(flat, expected)
                                                                  and np.array_equal(hier, flat))
print("MPIDIST " + json.dumps({
    "rank": rank, "size": size, "host": MPI.Get_processor_name(), "num_nodes": topo.num_nodes,
    "node_sizes": list(topo.node_sizes), "node_index": topo.node_index, "local_rank": topo.local_rank,
    "faked": topo.faked_nodes, "local_size_env": os.environ.get("MPIDIST_LOCAL_SIZE"),
    "hierarchical_calls": len(calls),
    "failed": [k for k, ok in checks.items() if not ok], "checked": len(checks),
}), flush=True)
engine.close()
