"""Checkpoint job. Usage: checkpoint_job.py PATH save-then-hang | restore

save-then-hang: save version 1, then start saving version 2 but stall before the rename (as a
node failure or kill during a save would), printing SAVING-V2 so the test can kill the job.
restore: restore and print a checksum and the version on every rank.
"""
import os
import sys
import time

import numpy as np

import mpidist
from mpidist import checkpoint

path, mode = sys.argv[1], sys.argv[2]
strategy = mpidist.MultiWorkerMirroredStrategy()
rank = strategy.extended.rank


def state(version: int) -> dict:
    rng = np.random.default_rng(version)
    return {"version": np.int64(version), "w": rng.normal(size=(300, 300)).astype(np.float32),
            "layers": [rng.normal(size=50), np.arange(version, version + 5)]}


if mode == "save-then-hang":
    checkpoint.save(state(1), path, strategy)
    real_replace = os.replace

    def slow_replace(src, dst):
        print("SAVING-V2 (temporary file written, about to rename)", flush=True)
        time.sleep(300)
        real_replace(src, dst)
    os.replace = slow_replace
    checkpoint.save(state(2), path, strategy)
else:
    try:
        got = checkpoint.restore(path, state(0), strategy)
    except (OSError, ValueError) as err:
        print(f"rank {rank}: ERROR {err}", flush=True)
        sys.exit(1)
    expected = state(int(got["version"]))
    same = all(np.array_equal(a, b) for a, b in zip(mpidist.collectives.nest.flatten(got)[0],
                                                     mpidist.collectives.nest.flatten(expected)[0]))
    print(f"rank {rank}: restored version {int(got['version'])} exact={same} "
          f"checksum={float(got['w'].sum()):.6f}", flush=True)
