"""``python -m tools.overlap_bench``: gradient buckets overlapping backprop, before and after.

(TensorFlow. The NumPy counterpart, ``mpidist.overlap.GradientBuckets`` on the progress thread, is
``python -m tools.overlap_numpy``.)

Run under mpirun from the repository root, e.g.
``mpirun -n 2 python -m tools.overlap_bench`` (rank 0 prints).

One training step of an MLP (``--inputs`` features, ``--depth`` Dense layers of ``--width``, a
Dense(10); SGD, per-replica batch ``--batch``) in a ``tf.function``, cases interleaved in ~10 ms
blocks (medians over blocks):

- compute only: the same step without a strategy (gradients and the SGD update, no communication);
- communication only: the all-reduce of a gradient-shaped list through the strategy's replica
  context, bucketed as in the step after (and in one op, as before);
- step before: the code at ``--before`` (git revision, default 0e18d34, the revision before
  buckets): one all-reduce op after the whole backward pass, ordered by two AssignVariableOps;
- step after: this checkout: buckets of ``--bucket-bytes`` (the strategy's ``bytes_per_pack``,
  default 4 MiB, the automatic bucket size until issue 33; 0: automatic, which since then makes no
  buckets in TensorFlow, one op fused into 64 MiB packs) in backprop order, each its own op.

The figure of merit is step / max(compute only, communication only): 1.0 is perfect overlap,
(compute + comm) / max(compute, comm) is none. ``--accumulation`` measures Keras'
``gradient_accumulation_steps=4`` against 1 instead: model.fit of 16 micro-batches (time per call;
divide by 16 for a micro-batch) and the engine all-reduces that carry gradients per applied update.

The "before" code is loaded from ``git show REV:mpidist/tensorflow/collectives.py`` into this
process and swapped in (reductions' ``collectives`` and ``buckets``) only while the before-step is
traced, so both run side by side in one process; without git (or ``--before ''``) it is skipped.
That old file runs on this checkout's engine, options and TensorFlow helpers, so where their API
has moved since REV the bridge adapts the old calls here, in the tool, never in the product. One
adaptation so far: before de25a2f the bridge passed per-call options to the engine as keyword
arguments, ``engine.allreduce(..., **options.kwargs())``; the one-options-type refactor removed
``CallOptions.kwargs()`` and the engine takes the options themselves (``options=``). So the old
module's collectives get today's options wrapped in :class:`_OptionsAtRev`, whose ``kwargs()`` is
``{"options": options}``: the engine sees the same options as the step after, and what is
measured as "before" (one collective op after backprop, ordered by two AssignVariableOps) is the
old code unchanged. No later revision can stand in: every one from 0d77522 on has buckets and the
token as the op's input, which is the "after" being measured.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import inspect
import json
import os
import subprocess
import sys
import types
from typing import Any, Callable, Iterator

import numpy as np
from mpi4py import MPI

from mpidist.bench.timing import compare
from tools import tables

DEFAULT_BEFORE = "0e18d34"
MICRO_BATCHES = 16  # per model.fit call in --accumulation


def before_bridge(rev: str) -> Any:
    """mpidist/tensorflow/collectives.py at git revision ``rev``, as a module of this package
    (its relative imports resolve to this checkout's modules), or None without git."""
    if not rev:
        return None
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        source = subprocess.run(["git", "-C", root, "show", f"{rev}:mpidist/tensorflow/collectives.py"],
                                check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    module = types.ModuleType("mpidist.tensorflow._collectives_before")
    module.__package__ = "mpidist.tensorflow"
    module.__file__ = f"{rev}:mpidist/tensorflow/collectives.py"
    sys.modules[module.__name__] = module
    exec(compile(source, module.__file__, "exec"), module.__dict__)  # our own file at REV
    if "options.kwargs()" in source:  # REV predates the engine's options= (module docstring)
        for name in ("allreduce", "broadcast", "allgather", "any_rank"):
            if callable(getattr(module, name, None)):
                setattr(module, name, _options_at_rev(getattr(module, name)))
    return module


class _OptionsAtRev:
    """Today's :class:`~mpidist.collectives.options.CallOptions` as a bridge of before de25a2f read
    them: its fields as they are (``implementation``, ``timeout_seconds``, ...), and ``kwargs()``,
    the engine's arguments, as today's ``options=`` (the module docstring says why)."""

    def __init__(self, options: Any) -> None:
        self.options = options

    def __getattr__(self, name: str) -> Any:
        return getattr(self.options, name)

    def kwargs(self) -> dict[str, Any]:
        return {"options": self.options}


def _options_at_rev(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` of the old module, its ``options`` argument (given or default) wrapped."""
    signature = inspect.signature(function)

    @functools.wraps(function)
    def adapted(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        bound.arguments["options"] = _OptionsAtRev(bound.arguments["options"])
        return function(*bound.args, **bound.kwargs)
    return adapted


class _NoBuckets:
    @staticmethod
    def run_bucketed(reduce: Callable[[list], list], tensors: Any, options: Any) -> list:
        return reduce(list(tensors))


@contextlib.contextmanager
def traced_before(module: Any) -> Iterator[None]:
    """While tracing: reductions run the old bridge, in one op (no buckets)."""
    from mpidist.tensorflow import reductions
    saved = reductions.collectives, reductions.buckets
    vars(reductions).update(collectives=module, buckets=_NoBuckets)  # the module's globals, for the trace
    try:
        yield
    finally:
        reductions.collectives, reductions.buckets = saved


def mlp(keras: Any, args: argparse.Namespace) -> Any:
    """``--inputs`` features, ``--depth`` Dense layers of ``--width`` (relu), a Dense(10) on top. The
    first layer is small (its gradient comes last: the part of communication nothing can hide)."""
    layers = [keras.Input((args.inputs,))]
    layers += [keras.layers.Dense(args.width, activation="relu") for _ in range(args.depth)]
    return keras.Sequential(layers + [keras.layers.Dense(10)])


def model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--inputs", type=int, default=256, help="input features (default 256)")
    parser.add_argument("--width", type=int, default=1024, help="Dense width (default 1024)")
    parser.add_argument("--depth", type=int, default=4, help="Dense layers of --width (default 4)")
    parser.add_argument("--batch", type=int, default=64, help="per-replica batch (default 64)")


def step_cases(tf: Any, keras: Any, engine: Any, args: argparse.Namespace, before: Any) -> tuple[dict, dict]:
    import mpidist
    from mpidist.experimental import CommunicationOptions
    from mpidist.tensorflow import buckets
    rank = engine.rank
    rng = np.random.default_rng(rank)
    x = tf.constant(rng.normal(size=(args.batch, args.inputs)).astype(np.float32))
    y = tf.constant(rng.integers(0, 10, size=args.batch))
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
    global_batch = args.batch * engine.size

    def trained_step(strategy: Any, model: Any, opt: Any) -> Any:  # a tf.function
        def replica(xb: Any, yb: Any) -> Any:
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(loss_fn(yb, model(xb, training=True)),
                                                  global_batch_size=global_batch)
            opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            return loss
        return tf.function(lambda xb, yb: strategy.run(replica, args=(xb, yb)), autograph=False)

    options = CommunicationOptions(bytes_per_pack=args.bucket_bytes) if args.bucket_bytes else CommunicationOptions()
    after = mpidist.MultiWorkerMirroredStrategy.on_engine(engine, options)
    with after.scope():
        model_after, opt_after = mlp(keras, args), keras.optimizers.SGD(1e-4)
    step_after = trained_step(after, model_after, opt_after)

    plain, opt_plain = mlp(keras, args), keras.optimizers.SGD(1e-4)

    @tf.function(autograph=False)
    def compute_only(xb: Any, yb: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(loss_fn(yb, plain(xb, training=True)), global_batch_size=global_batch)
        opt_plain.apply_gradients(zip(tape.gradient(loss, plain.trainable_variables), plain.trainable_variables))
        return loss

    grads = [tf.constant(np.full(v.shape, 1.0 / engine.size, np.float32)) for v in plain.trainable_variables]
    comm_after = tf.function(lambda *g: after.run(
        lambda *gs: tf.distribute.get_replica_context().all_reduce("sum", list(gs)), args=g), autograph=False)

    cases: dict[str, Callable[[], Any]] = {
        "compute only (no communication)": lambda: compute_only(x, y),
        "communication only, bucketed (after)": lambda: comm_after(*grads),
    }
    if before is not None:
        with traced_before(before):
            comm_before = tf.function(lambda *g: after.run(
                lambda *gs: tf.distribute.get_replica_context().all_reduce("sum", list(gs)), args=g), autograph=False)
            comm_before.get_concrete_function(*grads)
            model_before, opt_before = None, None
            with after.scope():
                model_before, opt_before = mlp(keras, args), keras.optimizers.SGD(1e-4)
            step_before = trained_step(after, model_before, opt_before)
            step_before.get_concrete_function(x, y)
        cases["communication only, one op (before)"] = lambda: comm_before(*grads)
        cases[f"step before ({args.before}: one collective after backprop)"] = lambda: step_before(x, y)
    cases["step after (buckets in backprop order)"] = lambda: step_after(x, y)
    sizes = [int(np.prod(v.shape)) * 4 for v in plain.trainable_variables]
    plan = buckets.plan(sizes, buckets.bucket_bytes(after.extended.default_call_options))
    facts = {"parameters": sum(sizes) // 4, "gradient MB": round(sum(sizes) / 2 ** 20, 2),
             "buckets (MB, backprop order)": [round(sum(sizes[i] for i in b) / 2 ** 20, 2) for b in plan]}
    return cases, facts


def accumulation_cases(tf: Any, keras: Any, engine: Any, args: argparse.Namespace) -> tuple[dict, dict]:
    """model.fit steps with gradient_accumulation_steps=4 and without; collectives counted."""
    import mpidist
    from mpidist.experimental import CommunicationOptions
    counted: list[bool] = []  # per engine all-reduce: does it carry gradients (a kernel)?
    real = engine.allreduce
    kernels = {(args.inputs, args.width), (args.width, args.width), (args.width, 10)}

    def allreduce(value: Any, *a: Any, **k: Any) -> Any:
        leaves = value if isinstance(value, (list, tuple)) else [value]
        counted.append(any(np.shape(leaf) in kernels for leaf in leaves))
        return real(value, *a, **k)

    engine.allreduce = allreduce
    strategy = mpidist.MultiWorkerMirroredStrategy.on_engine(engine, CommunicationOptions())
    rng = np.random.default_rng(engine.rank)
    steps = 4
    n = args.batch * steps * 8
    x = rng.normal(size=(n, args.inputs)).astype(np.float32)
    y = rng.integers(0, 10, size=n)
    models = {}
    for accumulate in (4, None):
        with strategy.scope():
            model = mlp(keras, args)
            model.compile(optimizer=keras.optimizers.SGD(1e-4, gradient_accumulation_steps=accumulate),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        models[accumulate] = model
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch * engine.size).repeat().with_options(options)
    facts: dict[str, Any] = {}
    for accumulate, model in models.items():
        model.fit(data, steps_per_epoch=steps, epochs=1, verbose=0)  # build, trace
        before_iterations = int(model.optimizer.iterations.numpy())
        del counted[:]
        model.fit(data, steps_per_epoch=MICRO_BATCHES, epochs=1, verbose=0)
        updates = int(model.optimizer.iterations.numpy()) - before_iterations
        label = f"gradient_accumulation_steps={accumulate or 1}"
        facts[label] = {"micro-batches": MICRO_BATCHES, "applied updates": updates,
                        "engine all-reduces carrying gradients (one per bucket)": sum(counted),
                        "... per applied update": sum(counted) / max(updates, 1),
                        "other engine all-reduces (per fit call: logs, metrics)": len(counted) - sum(counted)}

    def fit_steps(model: Any) -> Callable[[], Any]:
        return lambda: model.fit(data, steps_per_epoch=MICRO_BATCHES, epochs=1, verbose=0)
    cases = {f"model.fit of {MICRO_BATCHES} micro-batches, gradient_accumulation_steps={a or 1}": fit_steps(m)
             for a, m in models.items()}
    return cases, facts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.overlap_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=6.0, help="time per comparison (default 6)")
    model_arguments(parser)
    parser.add_argument("--bucket-bytes", type=int, default=4 << 20,
                        help="bytes_per_pack of the strategy after (default 4 MiB; 0: automatic, no buckets)")
    parser.add_argument("--before", default=DEFAULT_BEFORE, help=f"git revision of 'before' (default {DEFAULT_BEFORE})")
    parser.add_argument("--threads", type=int, nargs=2, default=(0, 0), metavar=("INTRA", "INTER"),
                        help="TensorFlow intra- and inter-op threads per rank (default 0 0: TensorFlow's choice)")
    parser.add_argument("--accumulation", action="store_true",
                        help="measure Keras gradient_accumulation_steps=4 against 1 instead")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    intra, inter = args.threads
    if intra:
        tf.config.threading.set_intra_op_parallelism_threads(intra)
    if inter:
        tf.config.threading.set_inter_op_parallelism_threads(inter)
    import mpidist

    comm = MPI.COMM_WORLD
    engine = mpidist.Engine(comm)
    if args.accumulation:
        cases, facts = accumulation_cases(tf, keras, engine, args)
    else:
        cases, facts = step_cases(tf, keras, engine, args, before_bridge(args.before))
    times = {name: s * 1e3 for name, s in compare(comm, cases, args.seconds).items()}
    result = {"ranks": comm.Get_size(), "threads (intra, inter)": list(args.threads), **facts, "ms": times}
    if not args.accumulation:
        result.update(overlap_ratios(times))
    if comm.Get_rank() == 0:
        print(json.dumps(result, indent=1) if args.json else table("tools.overlap_bench", result, 62), flush=True)
    return 0


def overlap_ratios(times: dict[str, float]) -> dict[str, Any]:
    """Each step's time over max(compute only, bucketed communication only), and what no overlap
    at all would give (the goal's figures; tools.overlap_numpy reports the same)."""
    compute = times["compute only (no communication)"]
    comm_ms = times["communication only, bucketed (after)"]
    floor = max(compute, comm_ms)
    return {"step / max(compute, comm)": {k: round(v / floor, 3) for k, v in times.items() if k.startswith("step")},
            "no overlap would be": round((compute + comm_ms) / floor, 3)}


def table(tool: str, result: dict, width: int) -> str:
    """``result`` as text: ``ms`` as a column of times, other dicts indented, the rest one line each."""
    lines = [f"{tool}, {result['ranks']} ranks; medians of interleaved blocks"]
    for key, value in result.items():
        if key == "ms":
            lines += tables.timing_rows(value, width, digits=3)
        elif isinstance(value, dict):
            lines.append(f"{key}:")
            lines += [f"  {k:<{width}}{v}" for k, v in value.items()]
        elif key != "ranks":
            lines.append(f"{key}: {value}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
