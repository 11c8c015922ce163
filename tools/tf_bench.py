"""``python -m tools.tf_bench``: the TensorFlow strategy against raw MPI and TF's own MWMS.

Run under mpirun, e.g. ``mpirun -n 2 python -m tools.tf_bench`` (from the repository root). Rank 0 prints.

(a) all_reduce of one 4 KB float32 tensor inside a ``tf.function``, through the mpidist strategy's
    replica context (``strategy.run`` + ``ReplicaContext.all_reduce``), against raw mpi4py
    ``Allreduce`` of the same bytes; also the cost per collective when a tf.function issues 100 of
    them (this checkout, and the bridge at ``--before``, traced into the same process), and
    TensorFlow's MultiWorkerMirroredStrategy doing the same.
(b) one custom-training-loop step of an MLP 784-512-512-10 (0.67 M parameters, global batch 256,
    SGD): the mpidist strategy (TensorFlow's tutorial loop: strategy.run, the Keras optimizer
    all-reducing gradients, strategy.reduce of the loss); a hand-written mpi4py loop (gradients
    from tf.GradientTape in a tf.function, one fused Allreduce of all gradients and the loss
    through NumPy, the optimizer applied in a tf.function); TensorFlow's MultiWorkerMirroredStrategy
    on the same ranks, its cluster built from MPI (TF_CONFIG set in-process from the rank and free
    ports agreed over MPI).
(c) input: one step of a distributed iterator (per-replica batch 32 x 8 float32) against ``next``
    on the ``tf.data`` iterator of the same local data, eagerly and inside a ``tf.function``; with
    the per-step "does any rank have data?" agreement (ranks of unknown lengths) and without it
    (every rank the same known length); and in a tf.function that also all-reduces the batch.
(d) ``--cases token``: the ordering token alone (no token, two AssignVariableOps around the op as
    before, the resource as the op's input as now), around raw ``Allreduce`` and around the
    engine's allreduce, 100 per tf.function call.

Every case runs in blocks of about 10 ms (after a barrier), blocks of all cases interleaved so
machine noise hits them alike; figures are medians over blocks.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from mpidist.bench.timing import compare
from mpidist.cluster_resolver import MPIClusterResolver
from tools import tables
from tools.overlap_bench import DEFAULT_BEFORE, before_bridge, traced_before


def tf_config_from_mpi(comm: MPI.Intracomm) -> dict:
    """TF_CONFIG for TensorFlow's MWMS: one worker per rank, free ports agreed over MPI
    (mpidist's resolver: distinct ports per host)."""
    names = comm.allgather(MPI.Get_processor_name())
    host = "localhost" if len(set(names)) == 1 else None
    return MPIClusterResolver(comm, host=host).tf_config()


def tf_own_mwms(tf: Any) -> Any:
    """TensorFlow's own MultiWorkerMirroredStrategy (RING) on this job's ranks. TF_CONFIG from
    :func:`tf_config_from_mpi` must be set before TensorFlow starts, and this must run before
    anything else configures TensorFlow's collectives (mpidist's strategy included)."""
    return tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING))


def _allreduce_cases(tf: Any, strategy: Any, mwms: Any, comm: MPI.Intracomm,
                     before: Any = None, before_rev: str = "") -> dict[str, Callable[[], Any]]:
    a = np.ones(1024, dtype=np.float32)
    out = np.empty_like(a)
    x = tf.constant(a)
    raw = comm.Dup()

    def one(s: Any) -> Callable[[], Any]:
        def replica_fn(t: Any) -> Any:  # an op made in the replica (TF's MWMS needs a placed tensor)
            return tf.distribute.get_replica_context().all_reduce("sum", tf.identity(t))
        f = tf.function(lambda v: s.run(replica_fn, args=(v,)), autograph=False)
        return lambda: f(x)

    def raw_in_graph(v: Any) -> Any:  # the floor of any tf.numpy_function bridge: raw MPI inside one
        def call(q: np.ndarray) -> np.ndarray:
            result = np.empty_like(q)
            raw.Allreduce(q, result)
            return result
        return tf.numpy_function(call, [v], tf.float32, stateful=True)

    def chain(body: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def run100(v: Any) -> Any:
            for _ in range(100):
                v = body(v) * 0.5
            return v
        return run100

    mpidist_body = chain(lambda v: tf.distribute.get_replica_context().all_reduce("sum", v))
    f100 = tf.function(lambda v: strategy.run(mpidist_body, args=(v,)), autograph=False)
    f100_before = None
    if before is not None:  # the bridge at `before_rev`, traced in (tools/overlap_bench.py)
        with traced_before(before):
            f100_before = tf.function(lambda v: strategy.run(mpidist_body, args=(v,)), autograph=False)
            f100_before.get_concrete_function(x)
    raw1 = tf.function(raw_in_graph, autograph=False)
    raw100 = tf.function(chain(raw_in_graph), autograph=False)
    cases = {"raw mpi4py Allreduce": lambda: raw.Allreduce(a, out),
             "raw Allreduce in a tf.numpy_function, 1 per tf.function call": lambda: raw1(x),
             "mpidist, 1 per tf.function call": one(strategy),
             "raw Allreduce in a tf.numpy_function, 100 per call (per collective)": lambda: raw100(x),
             "mpidist, 100 per tf.function call (per collective)": lambda: f100(x)}
    if f100_before is not None:
        cases[f"mpidist before ({before_rev}), 100 per call (per collective)"] = lambda: f100_before(x)
    if mwms is not None:
        cases["TF MultiWorkerMirroredStrategy, 1 per call"] = one(mwms)
    return cases


def _token_cases(tf: Any, comm: MPI.Intracomm, engine: Any) -> dict[str, Callable[[], Any]]:
    """(d): the ordering token alone: 100 collectives per tf.function call in a bare
    ``tf.numpy_function`` with no token, between two AssignVariableOps (mpidist before), and
    taking the resource as an input (mpidist now); the collective is raw ``Allreduce`` and the
    engine's allreduce."""
    raw = comm.Dup()
    handle = tf.raw_ops.VarHandleOp(dtype=tf.int32, shape=[], shared_name="tf_bench_token")
    x = tf.constant(np.ones(1024, dtype=np.float32))

    def mpi(q: np.ndarray) -> np.ndarray:
        out = np.empty_like(q)
        raw.Allreduce(q, out)
        return out

    def eng(q: np.ndarray) -> np.ndarray:
        return np.asarray(engine.allreduce(q, "sum"))

    def variant(call: Callable[[np.ndarray], np.ndarray], token: str) -> Callable[[], Any]:
        def one(v: Any) -> Any:
            if token == "input":
                return tf.numpy_function(lambda h, q: call(q), [handle, v], tf.float32, stateful=True)
            if token == "none":
                return tf.numpy_function(call, [v], tf.float32, stateful=True)
            with tf.control_dependencies([tf.raw_ops.AssignVariableOp(resource=handle, value=tf.constant(0))]):
                out = tf.numpy_function(call, [v], tf.float32, stateful=True)
            with tf.control_dependencies([out]):
                tf.raw_ops.AssignVariableOp(resource=handle, value=tf.constant(0))
            return out

        def run100(v: Any) -> Any:
            for _ in range(100):
                v = one(v) * 0.5
            return v
        f = tf.function(run100, autograph=False)
        return lambda: f(x)

    return {f"{what}, token: {token} (per collective)": variant(call, token)
            for what, call in (("raw Allreduce", mpi), ("engine.allreduce", eng))
            for token in ("none", "two AssignVariableOps", "input")}


def _mlp(keras: Any) -> Any:
    return keras.Sequential([keras.Input((784,)), keras.layers.Dense(512, activation="relu"),
                             keras.layers.Dense(512, activation="relu"), keras.layers.Dense(10)])


def _step_cases(tf: Any, keras: Any, strategy: Any, mwms: Any, comm: MPI.Intracomm,
                global_batch: int) -> dict[str, Callable[[], Any]]:
    rank, size = comm.Get_rank(), comm.Get_size()
    local = global_batch // size
    rng = np.random.default_rng(rank)
    x = tf.constant(rng.normal(size=(local, 784)).astype(np.float32))
    y = tf.constant(rng.integers(0, 10, size=local))
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

    def strategy_step(s: Any) -> Callable[[], Any]:
        with s.scope():
            model, opt = _mlp(keras), keras.optimizers.SGD(0.01)

        def train_step(xb: Any, yb: Any) -> Any:
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(loss_fn(yb, model(xb, training=True)), global_batch_size=global_batch)
            opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            return loss

        step = tf.function(lambda xb, yb: s.reduce("sum", s.run(train_step, args=(xb, yb)), axis=None),
                           autograph=False)
        return lambda: step(x, y)

    model, opt = _mlp(keras), keras.optimizers.SGD(0.01)
    raw = comm.Dup()

    @tf.function(autograph=False)
    def grads_of(xb: Any, yb: Any) -> Any:
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(loss_fn(yb, model(xb, training=True)), global_batch_size=global_batch)
        return tape.gradient(loss, model.trainable_variables), loss

    @tf.function(autograph=False)
    def apply(grads: Any) -> None:
        opt.apply_gradients(zip(grads, model.trainable_variables))

    shapes = [tuple(v.shape) for v in model.trainable_variables]
    sizes = [int(np.prod(s)) for s in shapes]
    buffer = np.empty(sum(sizes) + 1, dtype=np.float32)
    summed = np.empty_like(buffer)

    def hand_written() -> float:
        grads, loss = grads_of(x, y)
        np.concatenate([g.numpy().ravel() for g in grads] + [loss.numpy().reshape(1)], out=buffer)
        raw.Allreduce(buffer, summed)
        parts = np.split(summed[:-1], np.cumsum(sizes)[:-1])
        apply([tf.constant(p.reshape(s)) for p, s in zip(parts, shapes)])
        return float(summed[-1])

    def compute_only() -> None:  # the same step without any communication: the floor
        grads, _ = grads_of(x, y)
        apply(grads)

    cases = {"hand-written mpi4py loop": hand_written, "mpidist strategy": strategy_step(strategy),
             "compute only (no communication; the floor)": compute_only}
    if mwms is not None:
        cases["TF MultiWorkerMirroredStrategy"] = strategy_step(mwms)
    return cases


def _input_cases(tf: Any, strategy: Any) -> dict[str, Callable[[], Any]]:
    """(c): per step, this rank's tf.data iterator against the distributed iterator over it."""
    batch = tf.data.Dataset.from_tensors(tf.zeros([32, 8])).repeat()  # endless: blocks never run out
    step = tf.function(lambda it: it.get_next(), autograph=False)
    reduce_sum = lambda x: tf.distribute.get_replica_context().all_reduce("sum", x)
    train = tf.function(lambda it: strategy.run(reduce_sum, args=(it.get_next(),)), autograph=False)
    cases: dict[str, Callable[[], Any]] = {}
    for label, local in (("equal known lengths", batch), ("unknown lengths (agreement)", batch.filter(lambda x: True))):
        dist = strategy.distribute_datasets_from_function(lambda ctx, local=local: local)
        plain, distributed = iter(local), iter(dist)
        cases[f"{label}: tf.data iterator, eager"] = functools.partial(next, plain)
        cases[f"{label}: distributed iterator, eager"] = functools.partial(next, distributed)
        cases[f"{label}: tf.data iterator, in a tf.function"] = functools.partial(step, plain)
        cases[f"{label}: distributed iterator, in a tf.function"] = functools.partial(step, distributed)
    # beside a step's own collective (an all_reduce of the 1 KB batch), as in training
    cases["unknown lengths (agreement): tf.data iterator + all_reduce"] = functools.partial(train, plain)
    cases["unknown lengths (agreement): distributed iterator + all_reduce"] = functools.partial(train, distributed)
    return cases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.tf_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="time per comparison (default 3)")
    parser.add_argument("--global-batch", type=int, default=256, help="MLP global batch (default 256)")
    parser.add_argument("--no-mwms", action="store_true", help="skip TensorFlow's MultiWorkerMirroredStrategy")
    parser.add_argument("--threads", type=int, default=0,
                        help="TensorFlow intra- and inter-op threads per rank (default 0: TensorFlow's choice)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--before", default=DEFAULT_BEFORE,
                        help=f"git revision whose TF bridge (a) also runs, interleaved "
                             f"(default {DEFAULT_BEFORE}; '' skips)")
    parser.add_argument("--cases", default="allreduce,step,input",
                        help="comma-separated parts to run: allreduce, step, input, token (default: all but token)")
    args = parser.parse_args(argv)
    comm = MPI.COMM_WORLD
    if comm.Get_size() > 1 and not args.no_mwms and set(args.cases.split(",")) & {"allreduce", "step"}:
        # before TensorFlow touches its context
        os.environ["TF_CONFIG"] = json.dumps(tf_config_from_mpi(comm))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)

    import mpidist
    from mpidist.experimental import CommunicationOptions
    parts = set(args.cases.split(","))
    mwms = None
    if comm.Get_size() > 1 and not args.no_mwms and parts & {"allreduce", "step"}:
        mwms = tf_own_mwms(tf)
    engine = mpidist.Engine(comm)
    strategy = mpidist.MultiWorkerMirroredStrategy.on_engine(engine, CommunicationOptions())
    results: dict[str, Any] = {"ranks": comm.Get_size(), "threads": args.threads or "TensorFlow's default"}
    if "allreduce" in parts:
        results["allreduce 4 KB (ms)"] = compare(
            comm, _allreduce_cases(tf, strategy, mwms, comm, before_bridge(args.before), args.before), args.seconds)
    if "step" in parts:
        results[f"MLP step, global batch {args.global_batch} (ms)"] = \
            compare(comm, _step_cases(tf, keras, strategy, mwms, comm, args.global_batch), args.seconds)
    if "input" in parts:
        results["input step, per-replica batch 32 x 8 (ms)"] = compare(comm, _input_cases(tf, strategy), args.seconds)
    if "token" in parts:
        results["ordering token, 4 KB, 100 per call (ms)"] = compare(comm, _token_cases(tf, comm, engine), args.seconds)
    for key, value in results.items():
        if isinstance(value, dict):
            results[key] = {name: seconds * 1e3 for name, seconds in value.items()}
    for part in ("allreduce 4 KB (ms)", "ordering token, 4 KB, 100 per call (ms)"):
        per_call = results.get(part, {})
        for name in per_call:
            if "(per collective)" in name:
                per_call[name] /= 100
    if comm.Get_rank() == 0:
        print(json.dumps(results, indent=1) if args.json else _table(results), flush=True)
    return 0


def _table(results: dict) -> str:
    title = (f"tools.tf_bench, {results['ranks']} ranks, TensorFlow threads per rank: {results['threads']}; "
             f"medians of interleaved blocks")
    return tables.table(title, results, 70,
                        extra=lambda key, name, ms: f"   {1e3 / ms:8.1f} steps/s" if key.startswith("MLP") else "")


if __name__ == "__main__":
    raise SystemExit(main())
