"""Slurm test job: one allreduce, then one line per rank for the test to parse.

    MPIDIST {"rank": 0, "size": 2, "sum": [2.0, 2.0, 2.0], "launcher": "srun", ...}
"""
from __future__ import annotations

import json
import logging
import os

import numpy as np

import mpidist
from mpidist.topology import detect_launcher

logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s: %(message)s")

engine = mpidist.Engine()  # logs the singleton warning when srun started N tasks but MPI sees 1
total = engine.allreduce(np.ones(3))
launcher = detect_launcher()
print("MPIDIST " + json.dumps({
    "rank": engine.rank, "size": engine.size, "sum": total.tolist(),
    "launcher": launcher.name, "tasks": launcher.tasks, "launcher_rank": launcher.rank,
    "detail": launcher.detail, "localid": os.environ.get("SLURM_LOCALID"),
    "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
}), flush=True)
