"""``python -m tools.overlap_timeline``: the timeline of training steps before and after buckets, as a picture.

Run under mpirun from the repository root, e.g.
``mpirun -n 2 python -m tools.overlap_timeline --out docs/img/overlap_timeline.png``.

Every rank records with ``MPIDIST_TIMELINE`` (set here to ``--trace``, default
``overlap_trace/trace.json``; one file per rank): the engine's spans of every collective
(agreement, pack, transfer, unpack), and, on a track of their own, this tool's spans of each step
(the ``tf.function`` call) and instants when each gradient became ready (a small observer op on
each gradient; it does not gate the collectives). ``--steps`` steps run with the code at
``--before`` (one collective after backprop) and as many with this checkout (buckets in backprop
order); the same model as tools/overlap_bench.py. Rank 0 merges the files (``python -m mpidist
timeline merge`` does the same) and draws the last step of each: one row per rank, the step as a
grey bar, gradients ready as ticks, collectives as coloured bars (transfer darker).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from tools.overlap_bench import DEFAULT_BEFORE, before_bridge, mlp, model_arguments, traced_before


def build_step(tf: Any, keras: Any, strategy: Any, args: argparse.Namespace, mark: Callable[[str], Any],
               variables: list) -> Callable:
    rank, size = strategy.extended.rank, strategy.num_replicas_in_sync
    rng = np.random.default_rng(rank)
    x = tf.constant(rng.normal(size=(args.batch, args.inputs)).astype(np.float32))
    y = tf.constant(rng.integers(0, 10, size=args.batch))
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    with strategy.scope():
        model, opt = mlp(keras, args), keras.optimizers.SGD(1e-4)

    def observe(name: str, t: Any) -> None:  # a stateful op that notes when `t` exists
        tf.numpy_function(lambda v, n=name: mark(n) or v, [tf.reshape(t, [-1])[:1]], t.dtype, stateful=True)

    def replica(xb: Any, yb: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(loss_fn(yb, model(xb, training=True)),
                                              global_batch_size=args.batch * size)
        observe("forward done", loss)
        grads = tape.gradient(loss, model.trainable_variables)
        for i in reversed(range(len(grads))):  # in the order backprop makes them
            observe(f"gradient {_path(model.trainable_variables[i])} ready", grads[i])
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    f = tf.function(lambda xb, yb: strategy.run(replica, args=(xb, yb)), autograph=False)
    f.get_concrete_function(x, y)
    variables[:] = model.trainable_variables
    return lambda: f(x, y)


def _path(variable: Any) -> str:
    """``dense_3/kernel``: the variable's path without the model's own name."""
    return variable.path.split("/", 1)[-1]


def profile(events: list[dict], sizes: dict[str, int], kind: str) -> dict:
    """Rank 0's median compute profile of the steps of ``kind`` (before buckets: one collective
    after backprop, so compute ran undisturbed): gradients ready (ms since the step's start),
    forward, the update after the last collective."""
    steps = sorted((e for e in events if e.get("pid") == 0 and e.get("name") == f"step {kind}"), key=lambda e: e["ts"])
    marks = [e for e in events if e.get("pid") == 0 and e.get("cat") == "mark"]
    calls = [e for e in events if e.get("pid") == 0 and e.get("cat") == "collective"]
    ready: dict[str, list[float]] = {}
    update: list[float] = []
    for s in steps:
        inside = [m for m in marks if s["ts"] <= m["ts"] <= s["ts"] + s["dur"]]
        for m in inside:
            ready.setdefault(m["name"], []).append((m["ts"] - s["ts"]) / 1e3)
        ends = [c["ts"] + c["dur"] for c in calls if s["ts"] <= c["ts"] <= s["ts"] + s["dur"]]
        if ends:
            update.append((s["ts"] + s["dur"] - max(ends)) / 1e3)
    forward = ready.pop("forward done", [0.0])
    tensors = [{"name": n, "bytes": b, "ready_ms": round(float(np.median(ready[f"gradient {n} ready"])), 3)}
               for n, b in sizes.items()]
    return {"source": f"tools/overlap_timeline.py --profile, {len(steps)} steps {kind} buckets (medians), rank 0",
            "forward_ms": round(float(np.median(forward)), 3), "update_ms": round(float(np.median(update)), 3),
            "tensors": tensors}


def draw(events: list[dict], out: str, size: int) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = sorted((e for e in events if e.get("cat") == "step"), key=lambda e: e["ts"])
    last = {}
    for label in ("before", "after"):
        mine = [e for e in steps if e["name"] == f"step {label}" and e["pid"] == 0]
        if mine:
            last[label] = mine[-1]
    fig, axes = plt.subplots(len(last), 1, figsize=(11, 1.3 + 1.1 * size * len(last)), squeeze=False)
    colours = {"agreement": "#f4a261", "transfer": "#2a9d8f", "pack": "#8ab17d", "unpack": "#8ab17d",
               "prepare": "#e9c46a"}
    for ax, (label, step0) in zip(axes[:, 0], last.items()):
        t0 = step0["ts"]
        window = (t0 - 0.05 * step0["dur"], t0 + step0["dur"] * 1.1)
        for rank in range(size):
            y = size - 1 - rank
            for e in events:
                if e.get("pid") != rank or e.get("ph") not in ("X", "i") or "ts" not in e:
                    continue
                start, dur = e["ts"], e.get("dur", 0.0)
                if start + dur < window[0] or start > window[1]:
                    continue
                s, d = (start - t0) / 1e3, dur / 1e3
                cat = e.get("cat")
                if cat == "step" and e["name"] == f"step {label}":
                    ax.barh(y, d, left=s, height=0.8, color="#dddddd", edgecolor="#999999", zorder=1)
                elif cat == "mark":
                    ax.plot([s, s], [y - 0.38, y - 0.05], color="#264653", lw=1.2, zorder=5)
                elif cat == "collective":
                    ax.barh(y + 0.2, d, left=s, height=0.35, color="#a8dadc", edgecolor="#457b9d", zorder=3)
                elif cat == "phase" and e["name"] in colours:
                    ax.barh(y + 0.2, d, left=s, height=0.22, color=colours[e["name"]], zorder=4)
        ax.set_yticks(range(size))
        ax.set_yticklabels([f"rank {size - 1 - y}" for y in range(size)])
        ax.set_xlim((window[0] - t0) / 1e3, (window[1] - t0) / 1e3)
        ax.set_title(f"{label}: step {step0['dur'] / 1e3:.1f} ms (grey); ticks: gradients ready; "
                     f"bars: collectives (green: transfer, orange: agreement)", fontsize=9)
    axes[-1, 0].set_xlabel("ms since the step's start (rank 0)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.overlap_timeline", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="overlap_timeline.png", help="the picture to write (rank 0)")
    parser.add_argument("--trace", default="overlap_trace/trace.json", help="MPIDIST_TIMELINE path")
    parser.add_argument("--steps", type=int, default=10, help="steps of each kind (default 10)")
    model_arguments(parser)
    parser.add_argument("--profile", default="", help="also write the compute profile for tools.costmodel overlap here")
    parser.add_argument("--before", default=DEFAULT_BEFORE, help=f"git revision of 'before' (default {DEFAULT_BEFORE})")
    args = parser.parse_args(argv)
    comm = MPI.COMM_WORLD
    if comm.Get_rank() == 0:
        for old in glob.glob(os.path.join(os.path.dirname(args.trace) or ".", "*.json")):
            os.remove(old)
    comm.Barrier()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    import mpidist
    from mpidist.collectives import timeline
    mpidist.rc.timeline = args.trace  # what MPIDIST_TIMELINE sets (mpidist is imported already)
    engine = mpidist.Engine(comm)
    strategy = mpidist.MultiWorkerMirroredStrategy.on_engine(engine, mpidist.experimental.CommunicationOptions())
    recorder = timeline.recorder()
    if recorder is None:  # rc.timeline was set just above
        raise RuntimeError(f"tools.overlap_timeline: no timeline recorder for --trace {args.trace!r}")
    track = recorder.engine("TensorFlow step (tools.overlap_timeline)")

    def mark(name: str) -> None:
        now = recorder.now()
        recorder.span(name, track, now, now, cat="mark")

    steps: dict[str, Any] = {}
    variables: dict[str, Any] = {}
    before = before_bridge(args.before)
    if before is not None:
        with traced_before(before):
            steps["before"] = build_step(tf, keras, strategy, args, mark, variables.setdefault("before", []))
    steps["after"] = build_step(tf, keras, strategy, args, mark, variables.setdefault("after", []))
    for label, step in steps.items():
        for _ in range(3):
            step()  # warm up
        for _ in range(args.steps):
            comm.Barrier()
            start = recorder.now()
            step()
            recorder.span(f"step {label}", track, start, recorder.now(), cat="step")
    timeline.close()
    comm.Barrier()
    if comm.Get_rank() == 0:
        from mpidist.timeline import merge
        files = sorted(glob.glob(os.path.join(os.path.dirname(args.trace) or ".", "*.rank*.json")))
        merged = merge(files)
        draw(merged["traceEvents"], args.out, comm.Get_size())
        if args.profile:
            kind = "before" if "before" in steps else "after"  # before: compute undisturbed by transfers
            sizes = {_path(v): int(np.prod(v.shape)) * 4 for v in variables[kind]}
            with open(args.profile, "w", encoding="utf-8") as f:
                json.dump(profile(merged["traceEvents"], sizes, kind), f, indent=1)
            print(f"wrote {args.profile}")
        print(f"wrote {args.out} from {len(files)} trace file(s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
