"""A user's script around the library (simlib): it never mentions Horovod or MPI.

Usage: run_sim.py OUT_DIR   (writes OUT_DIR/w.<rank>.npy)"""
import os
import sys

import numpy as np

import simlib

rng = np.random.default_rng(7)
x = rng.normal(size=(48, 5)).astype(np.float32)
y = (x @ np.arange(1, 6, dtype=np.float32) + 0.1 * rng.normal(size=48)).astype(np.float32)
initial = np.random.default_rng(100 + simlib.rank()).normal(size=5).astype(np.float32)  # differs per rank
w = simlib.fit(x, y, steps=20, learning_rate=0.05, initial=initial)
np.save(os.path.join(sys.argv[1], f"w.{simlib.rank()}.npy"), w)
print(f"rank {simlib.rank()} of {simlib.size()}: fitted", flush=True)
