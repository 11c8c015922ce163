"""``python -m mpidist bench [summary|paths|fusion|v1|gpu|scale] [options]`` (under mpirun/srun).

- ``summary`` (default): allreduce of 4 KB, 4 MB, 64 MB and a 100 × 4 KB nest, against raw mpi4py;
- ``paths``: one allreduce of 1-64 MB through raw MPI (Allreduce, Iallreduce), the engine,
  ``strategy.reduce`` and the replica context, in one run; ``--before PATH`` adds another
  checkout's mpidist, interleaved (bench/paths.py);
- ``fusion``: one step's gradients of ResNet-50, BERT-base or 1000 small tensors through
  ``strategy.reduce`` and a replica context, against one hand-packed raw Allreduce and one raw call
  per tensor (bench/fusion.py);
- ``v1``: a ``tf.compat.v1`` Session.run training step with Horovod's DistributedOptimizer against the
  same step in one process and with one hand-packed raw Allreduce (needs TensorFlow; bench/v1.py);
- ``gpu``: allreduce of CuPy arrays, mpidist's GPU path against raw CuPy NCCL (needs CuPy and GPUs);
- ``scale``: at any job size, every collective checked against a local reference, start-up time and
  per-call time (``--against`` an earlier run's JSON, e.g. at -n 2: ratios; bench/scale.py).

The larger measurement tools (size sweeps, TensorFlow comparisons, the cost model) live in the
repository's ``tools/`` directory: ``python -m tools.sweep``, ``tools.tf_bench``, ``tools.tf_sweep``,
``tools.costmodel``.
"""
from __future__ import annotations

import importlib
import sys

_MODES = {"summary": "mpidist.bench.summary", "paths": "mpidist.bench.paths", "gpu": "mpidist.bench.gpu",
          "v1": "mpidist.bench.v1", "fusion": "mpidist.bench.fusion", "scale": "mpidist.bench.scale"}
_MOVED = {"sweep": "tools.sweep", "tf": "tools.tf_bench", "tf-sweep": "tools.tf_sweep", "model": "tools.costmodel"}


def main(argv: list[str] | None = None) -> int:
    argv = list(argv or [])
    if argv and argv[0] in _MOVED:
        print(f"python -m mpidist bench {argv[0]}: moved to the repository's tools; run "
              f"`python -m {_MOVED[argv[0]]}` from the repository root", file=sys.stderr)
        return 2
    mode = argv.pop(0) if argv and argv[0] in _MODES else "summary"
    return importlib.import_module(_MODES[mode]).main(argv)
