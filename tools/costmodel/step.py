"""``python -m tools.costmodel step``: a training step's communication to 4096 ranks, from its recorded MPI calls.

Input: the call list that ``python -m tools.costmodel record`` wrote (recorded_calls.json: what
mpidist issued for one ResNet-50 or BERT-base step; record.py). For p ranks on a preset of k ranks
per node, the step is the **repeated** step (``steps[-1]``, the steady state) of the ``one-node``
recording when p <= k, else of the ``multi-node`` one (fake nodes: the algorithm mpidist picks
when the job spans nodes). Its cost, summed over the calls in order (no overlap with compute: the
recorded paths reduce after the backward pass):

- a data call: ``model.predict`` of its recorded algorithm (``flat``: the best flat MPI algorithm;
  ``hierarchical``: mpidist's leader-based one) for its bytes at p ranks, plus ``overhead_s`` of
  software per call (mpidist over raw MPI: 14.6 µs at 2 ranks on this VM, docs/scaling.md);
- a ``blocking`` agreement exchange: a flat allreduce of its 24 bytes (the data waits for it); a
  speculated one: 0 (it runs under the data and is only checked after it);
- a ``packed`` call: one copy of its bytes into the pack at the workload's ``copy_bandwidth``
  (results are views of the receive buffer: no copy out).

On GPU presets the same packs are also costed as mpidist's device path would move them (the GPU
path uses the same packing plan, packing.py): ``backend="gpu_path"``: on one node its ``nccl`` path
(NCCL over the node: the cheaper of ring and tree), across nodes its ``nccl+mpi`` path (NCCL
reduce-scatter in the node, MPI allreduce of each shard across nodes, NCCL all-gather: the model's
``hierarchical_rs``; docs/gpu.md), its agreements speculated (GPU allreduces speculate: agreement.py);
``nccl_ring`` / ``nccl_tree``: each data call as one NCCL ring or tree over the whole job. Horovod's
schedule of the same gradient set (horovod.py: 128 MB fusion, 1 ms cycle, overlapped with the
backward pass) comes beside it. Scaling efficiency = compute / (compute + exposed communication),
compute from presets.py's workloads (assumptions, stated there).
"""
from __future__ import annotations

import argparse
import json
import math
import os
from typing import Any

from mpidist.bench import shapes as model_shapes

from . import horovod
from .chief import is_chief
from .model import predict, resolve
from .presets import MODELS, Params, Workload, workload
from .record import DEFAULT_OUT

RANKS = tuple(8 << i for i in range(10))  # 8 ... 4096
BACKENDS = ("mpi", "gpu_path", "nccl_ring", "nccl_tree")
NCCL = ("nccl_ring", "nccl_tree")
OVERHEAD_S = 14.6e-6


def load(path: str = DEFAULT_OUT) -> dict:
    """The recorded calls (record.py's file)."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict) or set(data.get("layouts", {})) != {"one-node", "multi-node"}:
        raise ValueError(f"step.load: `{path}` must hold record.py's one-node and multi-node layouts")
    return data


def calls(recorded: dict, model: str, ranks: int, ranks_per_node: int, path: str = "strategy.reduce") -> list[dict]:
    """The repeated step's calls of ``model`` through ``path`` in the layout that ``ranks`` implies."""
    layout = "one-node" if ranks <= ranks_per_node else "multi-node"
    try:
        return recorded["layouts"][layout]["sets"][model]["paths"][path][-1]
    except KeyError:
        raise ValueError(f"step.calls: no recorded {layout} step of {model!r} through {path!r}") from None


def step_cost(step: list[dict], ranks: int, prm: Params, copy_bandwidth: float, backend: str = "mpi",
              overhead_s: float = OVERHEAD_S, ranks_per_node: int | None = None,
              nccl: tuple[str, ...] = NCCL) -> dict[str, Any]:
    """Seconds of one recorded step at ``ranks`` ranks: data, agreement, copy, total (module docstring);
    ``nccl``: the NCCL algorithms the ``gpu_path`` backend may pick inside a node."""
    if backend not in BACKENDS:
        raise ValueError(f"step_cost: `backend` must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if not copy_bandwidth > 0:
        raise ValueError(f"step_cost: `copy_bandwidth` must be bytes/s > 0, got {copy_bandwidth!r}")
    k = ranks_per_node or prm.ranks_per_node
    data = agree = copy = 0.0
    count = blocking = 0
    for call in step:
        if call["collective"] == "agreement":
            if not call["speculated"] and backend == "mpi":
                agree += predict("flat", call["bytes"], ranks, k, prm)
                blocking += 1
            continue
        if backend == "gpu_path":
            seconds = nccl_cost(call["bytes"], ranks, k, prm, nccl) if ranks <= k else \
                predict("hierarchical_rs", call["bytes"], ranks, k, prm)
        else:
            seconds = predict(call["algorithm"] if backend == "mpi" else backend, call["bytes"], ranks, k, prm)
        data += seconds + overhead_s
        copy += call["bytes"] / copy_bandwidth if call["packed"] else 0.0
        count += 1
    return {"data_s": data, "agreement_s": agree, "copy_s": copy, "total_s": data + agree + copy,
            "calls": count, "blocking": blocking}


def nccl_cost(nbytes: float, ranks: int, k: int, prm: Params, algorithms: tuple[str, ...] = NCCL) -> float:
    """NCCL's allreduce: the cheapest of ``algorithms`` (NCCL picks ring or tree by size)."""
    return min(predict(a, nbytes, ranks, k, prm) for a in algorithms)


def horovod_step(model: str, ranks: int, prm: Params, load_: Workload, compute_s: float,
                 ranks_per_node: int | None = None) -> horovod.Schedule:
    """Horovod's schedule of ``model``'s gradients (float32, model order) at ``ranks`` ranks."""
    k = ranks_per_node or prm.ranks_per_node
    sizes = [4 * math.prod(s) for s in getattr(model_shapes, model)()]
    if load_.gpu:
        def cost(n: float) -> float:
            return nccl_cost(n, ranks, k, prm, load_.nccl)
    else:
        def cost(n: float) -> float:
            return predict("flat", n, ranks, k, prm)
    return horovod.schedule(sizes, compute_s * load_.backward_share, cost, load_.copy_bandwidth)


def efficiency(compute_s: float, exposed_s: float) -> float:
    return compute_s / (compute_s + exposed_s) if compute_s + exposed_s > 0 else 1.0


def predict_rows(recorded: dict, preset: str, models: tuple[str, ...] = MODELS, ranks: tuple[int, ...] = RANKS,
                 compute_s: dict[str, float] | None = None, path: str = "strategy.reduce") -> list[dict]:
    """One row per (model, ranks) on ``preset``: mpidist's recorded step per backend, and Horovod's."""
    prm, load_ = resolve(preset, "predict_rows"), workload(preset)
    rows = []
    for model in models:
        compute = (compute_s or {}).get(model, load_.compute_s.get(model))
        if compute is None:
            raise ValueError(f"predict_rows: no compute time of {model!r} on {preset!r}: pass `compute_s`")
        for p in ranks:
            step = calls(recorded, model, p, prm.ranks_per_node, path)
            row: dict[str, Any] = {"preset": preset, "model": model, "ranks": p,
                                   "nodes": -(-p // prm.ranks_per_node), "compute_s": compute}
            for backend in ("mpi",) + (("gpu_path",) + load_.nccl if load_.gpu else ()):
                cost = step_cost(step, p, prm, load_.copy_bandwidth, backend, load_.overhead_s, nccl=load_.nccl)
                row[backend] = {**cost, "efficiency": efficiency(compute, cost["total_s"])}
            hv = horovod_step(model, p, prm, load_, compute)
            row["horovod"] = {"exposed_s": hv.exposed_s, "busy_s": hv.busy_s, "buffers": hv.buffers,
                              "efficiency": efficiency(compute, hv.exposed_s)}
            rows.append(row)
    return rows


def _ms(t: float) -> str:
    return f"{t * 1e3:.3g}"


def table(rows: list[dict]) -> str:
    """Markdown: per row, each column's communication (ms) and scaling efficiency."""
    backends = [b for b in BACKENDS if b in rows[0]]
    names = {"mpi": "mpidist (MPI, as recorded)", "gpu_path": "mpidist's GPU path (nccl, nccl+mpi)",
             "nccl_ring": "its packs on one NCCL ring", "nccl_tree": "… on NCCL tree"}
    cols = [names[b] for b in backends] + ["Horovod (128 MB, 1 ms) exposed (busy)"]
    lines = ["| model | ranks (nodes) | calls (blocking agr.) | " + " | ".join(f"{c}: ms, eff." for c in cols) + " |",
             "|---|---|---|" + "---|" * len(cols)]
    for r in rows:
        cells = [f"{_ms(r[b]['total_s'])} ms, {r[b]['efficiency'] * 100:.0f}%" for b in backends]
        cells.append(f"{_ms(r['horovod']['exposed_s'])} ({_ms(r['horovod']['busy_s'])}) ms, "
                     f"{r['horovod']['efficiency'] * 100:.0f}%")
        lines.append(f"| {r['model']} | {r['ranks']} ({r['nodes']}) | {r['mpi']['calls']} ({r['mpi']['blocking']}) | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.costmodel step", description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="a100-4x200g,cpu-2s-100g", help="comma-separated presets with a workload")
    parser.add_argument("--calls", default=DEFAULT_OUT, help="recorded calls (default: the committed file)")
    parser.add_argument("--ranks", default=",".join(map(str, RANKS)), help="comma-separated rank counts")
    parser.add_argument("--models", default=",".join(MODELS), help=f"among {', '.join(MODELS)}")
    parser.add_argument("--path", default="strategy.reduce",
                        help="recorded path: strategy.reduce (default), replica all_reduce; for resnet50 also "
                             "tf.function replica all_reduce, horovod DistributedGradientTape")
    parser.add_argument("--compute-ms", default="", help="override compute per step, e.g. resnet50=120,bert_base=50")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        ranks = tuple(int(x) for x in args.ranks.split(",") if x.strip())
        compute = {k: float(v) / 1e3 for k, v in (item.split("=") for item in args.compute_ms.split(",") if item)}
    except ValueError:
        parser.error(f"--ranks must be integers and --compute-ms MODEL=MS pairs, got {args.ranks!r}, "
                     f"{args.compute_ms!r}")
    models = tuple(m for m in args.models.split(",") if m)
    if not ranks or min(ranks) < 1 or any(m not in MODELS for m in models) or any(m not in MODELS for m in compute):
        parser.error(f"--ranks must be >= 1 and models among {', '.join(MODELS)}")
    recorded = load(args.calls)
    out = {}
    for preset in (p for p in args.preset.split(",") if p):
        try:
            out[preset] = predict_rows(recorded, preset, models, ranks, compute, args.path)
        except ValueError as exc:
            parser.error(str(exc))
    if not is_chief():
        return 0
    if args.json:
        print(json.dumps(out, indent=1), flush=True)
        return 0
    for preset, rows in out.items():
        prm, load_ = resolve(preset), workload(preset)
        print(f"{prm.summary()}\ncompute per step: "
              + ", ".join(f"{m} {rows[[r['model'] for r in rows].index(m)]['compute_s'] * 1e3:.3g} ms" for m in models)
              + f"; copy {load_.copy_bandwidth / 1e9:.3g} GB/s; calls: {os.path.basename(args.calls)}, {args.path}")
        print(table(rows) + "\n", flush=True)
    return 0
