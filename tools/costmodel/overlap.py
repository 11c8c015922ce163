"""``python -m tools.costmodel overlap``: a training step with gradient buckets overlapping backprop, on paper.

Input: a step's compute profile (``--profile FILE.json``, written by ``tools/overlap_timeline.py
--profile``: when each gradient became ready, in ms since the step's start, its size, the forward
time and the update's time after the backward pass), measured on any machine; or the built-in
profile of docs/overlap.md's MLP. ``--compute-ms`` rescales the compute (forward + backward +
update) to another device's speed, keeping its shape.

Communication: each bucket's all-reduce costs the cost model's prediction (``model.predict``:
``--algorithm`` on ``--ranks`` ranks of ``--preset``), plus the agreement (a 16-byte all-reduce) and
a fixed software cost per collective (``--overhead-ms``: the TF bridge and the engine's Python).
Buckets follow mpidist/tensorflow/buckets.py's rule (backprop order; a bucket closes at the first
tensor that brings it to ``--bucket-bytes``).

Schedule: before buckets, one collective starts when the backward pass ends; with buckets,
bucket b starts at max(its last gradient ready, bucket b-1 done) (the collectives' order is fixed)
and the update starts when the backward pass and every bucket are done. The model assumes that
communication does not slow compute down (separate engines: a NIC, NCCL's stream); where both
share the same CPU cores (the 2-core VM) that does not hold, and the measured step is slower.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any

from mpidist.collectives.packing import FUSION_BYTES, backprop_buckets

from .chief import is_chief
from .model import ALGORITHMS, predict, resolve

# The MLP of tools/overlap_bench.py (256 inputs, 4 Dense layers of 1024, Dense(10); per-replica batch 64) as measured by
# tools/overlap_timeline.py on the 2-core VM at 2 ranks (median of 10 steps, before buckets):
# gradients in list order (kernel, bias per layer), ready times in ms since the step's start.
BUILTIN = {
    "source": "tools/overlap_timeline.py --profile, 2-core VM, 2 ranks, 10 steps before buckets (medians)",
    "forward_ms": 3.477,
    "update_ms": 5.206,
    "tensors": [
        {"name": "dense/kernel", "bytes": 1048576, "ready_ms": 12.847},
        {"name": "dense/bias", "bytes": 4096, "ready_ms": 12.592},
        {"name": "dense_1/kernel", "bytes": 4194304, "ready_ms": 11.28},
        {"name": "dense_1/bias", "bytes": 4096, "ready_ms": 9.724},
        {"name": "dense_2/kernel", "bytes": 4194304, "ready_ms": 8.575},
        {"name": "dense_2/bias", "bytes": 4096, "ready_ms": 6.89},
        {"name": "dense_3/kernel", "bytes": 4194304, "ready_ms": 5.607},
        {"name": "dense_3/bias", "bytes": 4096, "ready_ms": 3.877},
        {"name": "dense_4/kernel", "bytes": 40960, "ready_ms": 3.841},
        {"name": "dense_4/bias", "bytes": 40, "ready_ms": 3.788},
    ],
}
DEFAULT_BUCKET_BYTES = FUSION_BYTES  # mpidist's default (bytes_per_pack=0): 64 MiB, one pack per bucket


@dataclass(frozen=True)
class Prediction:
    compute_ms: float      # the step without communication
    comm_ms: float         # every bucket's collective, back to back
    before_ms: float       # one collective after the backward pass
    after_ms: float        # buckets overlapping the backward pass
    buckets: list[dict]    # per bucket: bytes, ready, start, end (ms)

    @property
    def floor_ms(self) -> float:
        return max(self.compute_ms, self.comm_ms)

    def as_dict(self) -> dict[str, Any]:
        return {"compute only (ms)": self.compute_ms, "communication only (ms)": self.comm_ms,
                "step before (ms)": self.before_ms, "step after (ms)": self.after_ms,
                "before / max(compute, comm)": self.before_ms / self.floor_ms,
                "after / max(compute, comm)": self.after_ms / self.floor_ms, "buckets": self.buckets}


def simulate(profile: dict, ranks: int, preset: str = "dgx-h100", algorithm: str = "hierarchical",
             bucket_bytes: int = DEFAULT_BUCKET_BYTES, compute_ms: float | None = None,
             overhead_ms: float = 0.03, ranks_per_node: int | None = None) -> Prediction:
    """The step of ``profile`` on ``ranks`` ranks of ``preset``, before and after buckets."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"simulate: `algorithm` must be one of {', '.join(ALGORITHMS)}, got {algorithm!r}")
    if bucket_bytes < 1:
        raise ValueError(f"simulate: `bucket_bytes` must be >= 1, got {bucket_bytes!r}")
    params = resolve(preset, "simulate")
    tensors = profile["tensors"]
    sizes = [int(t["bytes"]) for t in tensors]
    ready = [float(t["ready_ms"]) for t in tensors]
    update = float(profile["update_ms"])
    backward_end = max(ready)
    scale = 1.0 if compute_ms is None else compute_ms / (backward_end + update)
    ready, update, backward_end = [r * scale for r in ready], update * scale, backward_end * scale

    def collective_ms(nbytes: int) -> float:
        seconds = predict(algorithm, nbytes, ranks, ranks_per_node, params) \
            + predict(algorithm, 16, ranks, ranks_per_node, params)  # the agreement
        return seconds * 1e3 + overhead_ms

    buckets, done = [], 0.0
    for bucket in backprop_buckets(sizes, bucket_bytes):
        nbytes = sum(sizes[i] for i in bucket)
        at = max(ready[i] for i in bucket)
        start = max(at, done)
        done = start + collective_ms(nbytes)
        buckets.append({"bytes": nbytes, "ready_ms": at, "start_ms": start, "end_ms": done})
    comm = sum(b["end_ms"] - b["start_ms"] for b in buckets)
    before = backward_end + collective_ms(sum(sizes)) + update
    after = max(backward_end, done) + update
    return Prediction(backward_end + update, comm, before, after, buckets)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.costmodel overlap", description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", help="JSON from tools/overlap_timeline.py --profile (default: built in)")
    parser.add_argument("--preset", default="dgx-h100", help="cost-model preset (default dgx-h100)")
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 8, 64, 512],
                        help="rank counts (default 2 8 64 512)")
    parser.add_argument("--ranks-per-node", type=int, default=None, help="default: the preset's")
    parser.add_argument("--algorithm", default="hierarchical", help="model algorithm (default hierarchical)")
    parser.add_argument("--bucket-bytes", type=int, default=DEFAULT_BUCKET_BYTES, help="default 64 MiB (mpidist's)")
    parser.add_argument("--compute-ms", type=float, default=None,
                        help="rescale compute (forward + backward + update) to this many ms (default: as profiled)")
    parser.add_argument("--overhead-ms", type=float, default=0.03, help="software cost per collective (default 0.03)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    profile = BUILTIN
    if args.profile:
        with open(args.profile, encoding="utf-8") as f:
            profile = json.load(f)
    rows = {p: simulate(profile, p, args.preset, args.algorithm, args.bucket_bytes, args.compute_ms,
                        args.overhead_ms, args.ranks_per_node) for p in args.ranks}
    if not is_chief():
        return 0
    if args.json:
        print(json.dumps({str(p): r.as_dict() for p, r in rows.items()}, indent=1))
        return 0
    print(f"step with buckets overlapping backprop: preset {args.preset}, {args.algorithm}, buckets of "
          f"{args.bucket_bytes} B, overhead {args.overhead_ms} ms/collective; profile: "
          f"{profile.get('source', args.profile)}")
    print(f"{'ranks':>6} {'compute':>9} {'comm':>9} {'before':>9} {'after':>9} {'before/max':>11} {'after/max':>10}")
    for p, r in rows.items():
        print(f"{p:>6} {r.compute_ms:>9.3f} {r.comm_ms:>9.3f} {r.before_ms:>9.3f} {r.after_ms:>9.3f} "
              f"{r.before_ms / r.floor_ms:>11.3f} {r.after_ms / r.floor_ms:>10.3f}")
    return 0
