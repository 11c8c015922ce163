"""``python -m tools.costmodel record``: the MPI calls of one training step, recorded where they leave mpidist.

For each gradient set (mpidist/bench/shapes.py: ResNet-50's 214 Keras tensors, BERT-base's 199) and
each NumPy-mode path (``strategy.reduce`` of the gradient list, a replica context's ``all_reduce``
inside ``strategy.run``), two steps run through a real ``MultiWorkerMirroredStrategy``: the first
(nothing cached yet) and a repeat (the steady state, what every later step costs). For ResNet-50
also two TensorFlow paths (unless ``--no-tf``): the replica context's ``all_reduce`` inside a
``tf.function`` (Keras's optimizer's path) and mpidist's Horovod ``DistributedGradientTape``
(BERT-base's 438 MB as constants, variables and results at 4 ranks would not fit this machine). The strategy is
built on a communicator whose class records every reduction it is asked for (mpi4py's ``Clone``
keeps the class, so the engine's private clone, its agreement exchange and the cached fast path
record too); the node and leader communicators are wrapped the same way after the strategy is
built. This is the same technique as tests/mpi/test_fusion_calls.py; nothing in mpidist changes.

Two launches, so that both of ``auto``'s situations are seen: ``one-node`` (``mpirun -n 2``: always
flat) and ``multi-node`` (``mpirun -n 4`` with ``MPIDIST_LOCAL_SIZE=2``: two fake nodes, where ``auto``
asks the cost model per pack, mpidist/collectives/algorithms/choice.py; with the default links it
takes flat there too, so the committed file lists flat calls in both layouts, and
tests/unit/test_costmodel_step.py fails if a change of the rule leaves the file behind). Rank 0 (a
node leader) writes what it issued. Per MPI call the file holds: ``collective`` (``allreduce`` for data,
``agreement`` for the 24-byte signature exchange), ``bytes`` and ``dtype`` of the buffer,
``algorithm`` (``flat``: one Allreduce/Iallreduce on the job; ``hierarchical``: Reduce in the node,
Allreduce among leaders, Bcast in the node, listed in ``mpi``), ``packed`` (the send buffer is a
copy of several leaves, not a view of the caller's array) and, for data calls, ``agreement``:
whether the exchange that covers it was ``blocking`` (the data waited for it) or ``speculated``
(overlapped with the data; agreement.py). The model (step.py) reads this file.

``python -m tools.costmodel record [--out FILE]`` launches both jobs itself (mpirun from PATH) and
merges them; ``--worker FILE`` is what each launched rank runs.
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import os
import subprocess
import sys
import tempfile
from typing import Any, Callable

DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "recorded_calls.json")
SETS = ("resnet50", "bert_base")
PATHS = ("strategy.reduce", "replica all_reduce")
TF_PATHS = ("tf.function replica all_reduce", "horovod DistributedGradientTape")
TF_SETS = ("resnet50",)  # BERT-base's 438 MB as TensorFlow constants, variables and results: too much here
STEPS = 2
LAYOUTS = {"one-node": (2, None), "multi-node": (4, 2)}  # name: (ranks, MPIDIST_LOCAL_SIZE)


def _recording_classes() -> tuple[Any, Any, Any]:
    import numpy as np
    from mpi4py import MPI

    class Recording(MPI.Intracomm):
        """Records (role, MPI name, bytes, dtype, send buffer) of every reduction and broadcast."""

        log: list[tuple[str, str, int, str, str]] = []
        leaves: list[Any] = []  # the caller's arrays of this step
        role = "job"

        def _note(self, name: str, send: Any, recv: Any) -> None:
            buf = recv if send is MPI.IN_PLACE or not isinstance(send, np.ndarray) else send
            if not isinstance(buf, np.ndarray):
                return
            if buf.dtype == np.int64 and buf.size == 3:  # the agreement exchange: [h, -h, -speculated]
                what = "speculated" if buf[2] != 0 else "blocking"
            elif buf is send and any(np.may_share_memory(send, x) for x in Recording.leaves):
                what = "view"
            else:
                what = "packed"
            Recording.log.append((self.role, name, int(buf.nbytes), str(buf.dtype), what))

        def Allreduce(self, sendbuf, recvbuf, op=MPI.SUM):
            self._note("Allreduce", sendbuf, recvbuf)
            return super().Allreduce(sendbuf, recvbuf, op)

        def Iallreduce(self, sendbuf, recvbuf, op=MPI.SUM):
            self._note("Iallreduce", sendbuf, recvbuf)
            return super().Iallreduce(sendbuf, recvbuf, op)

        def Reduce(self, sendbuf, recvbuf, op=MPI.SUM, root=0):
            self._note("Reduce", sendbuf, recvbuf)
            return super().Reduce(sendbuf, recvbuf, op, root)

        def Bcast(self, buf, root=0):
            self._note("Bcast", buf, buf)
            return super().Bcast(buf, root)

    class Local(Recording):
        role = "node"

    class Leaders(Recording):
        role = "leaders"

    return Recording, Local, Leaders


def calls_of(log: list[tuple[str, str, int, str, str]]) -> list[dict]:
    """The recorded MPI calls of one step, as the file holds them (see the module docstring)."""
    out: list[dict] = []
    agreement = None
    for role, name, nbytes, dtype, what in log:
        if what in ("speculated", "blocking"):
            agreement = what
            out.append({"collective": "agreement", "bytes": nbytes, "dtype": dtype, "algorithm": "flat",
                        "speculated": agreement == "speculated", "mpi": [f"{name}(job)"]})
            continue
        if role == "job" and name in ("Allreduce", "Iallreduce"):
            algorithm = "flat"
        elif role == "node" and name == "Reduce":
            algorithm = "hierarchical"
        else:  # a later step of the hierarchical call just opened
            out[-1]["mpi"].append(f"{name}({role})")
            continue
        out.append({"collective": "allreduce", "bytes": nbytes, "dtype": dtype, "algorithm": algorithm,
                    "packed": what == "packed", "agreement": agreement or "none", "mpi": [f"{name}({role})"]})
    return out


def _replica(grads: list[Any]) -> Any:
    import mpidist

    ctx = mpidist.get_replica_context()
    assert ctx is not None, "record: strategy.run ran its function outside a replica context"
    return ctx.all_reduce("sum", grads)


def _step(strategy: Any, label: str, grads: list[Any]) -> Any:
    """One step's gradient reduction through ``label`` (one of PATHS)."""
    if label == "strategy.reduce":
        return strategy.reduce("sum", grads, axis=None)
    return strategy.run(_replica, args=(grads,))


def _wrap(topology: Any, local: Any, leaders: Any) -> None:
    """Record on the node and leader communicators too (the job's records already)."""
    topology.local, topology.cross = local(topology.local), leaders(topology.cross)


def _tf_steps(comm: Any, classes: tuple[Any, Any, Any], grads: list[Any]) -> dict[str, Callable[[], Any]]:
    """TF_PATHS as step functions on ``grads`` (TensorFlow mode; imports TensorFlow)."""
    import tensorflow as tf

    import mpidist
    import mpidist.horovod.tensorflow as hvd
    from mpidist.horovod.tensorflow import basics

    recording, local, leaders = classes
    with mpidist.rc.override(framework="tensorflow"):
        strategy = mpidist.MultiWorkerMirroredStrategy(comm=recording(comm))
    _wrap(strategy.extended.engine.topology, local, leaders)
    consts = [tf.constant(g) for g in grads]

    def replica(*gs: Any) -> Any:
        return tf.distribute.get_replica_context().all_reduce("sum", list(gs))
    in_function = tf.function(lambda *gs: strategy.run(replica, args=gs), autograph=False)
    hvd.init(comm=recording(comm))
    _wrap(basics.engine().topology, local, leaders)
    variables = [tf.Variable(tf.zeros(g.shape)) for g in grads]

    def tape() -> Any:  # the gradients of sum(v * c) are c
        with tf.GradientTape() as t:
            loss = tf.add_n([tf.reduce_sum(v * c) for v, c in zip(variables, consts)])
        return hvd.DistributedGradientTape(t, op=hvd.Sum).gradient(loss, variables)
    return {TF_PATHS[0]: lambda: in_function(*consts), TF_PATHS[1]: tape}


def worker(path: str, with_tf: bool = True) -> None:
    """One launched rank: run every set and path for STEPS steps; rank 0 writes the calls to ``path``."""
    import numpy as np
    from mpi4py import MPI

    import mpidist
    from mpidist.bench import shapes as model_shapes
    from mpidist.collectives import packing

    classes = _recording_classes()
    recording = classes[0]
    comm = MPI.COMM_WORLD
    with mpidist.rc.override(framework="numpy"):
        strategy = mpidist.MultiWorkerMirroredStrategy(comm=recording(comm))
    _wrap(strategy.extended.engine.topology, *classes[1:])
    out: dict[str, Any] = {"ranks": comm.Get_size(), "nodes": strategy.extended.engine.topology.num_nodes,
                           "sets": {}}
    want = comm.Get_size() * (comm.Get_size() + 1) / 2
    for name in SETS:
        shapes = getattr(model_shapes, name)()
        grads = [np.full(s, comm.Get_rank() + 1.0, np.float32) for s in shapes]
        recording.leaves = grads
        total = sum(g.nbytes for g in grads)
        runs: dict[str, Callable[[], Any]] = {label: functools.partial(_step, strategy, label, grads)
                                              for label in PATHS}
        if with_tf and name in TF_SETS:
            runs.update(_tf_steps(comm, classes, grads))
        paths: dict[str, list] = {}
        for label, run in runs.items():
            steps = []
            for _ in range(STEPS):
                recording.log = []
                got = run()
                if not all(np.all(np.asarray(g) == want) for g in got):
                    raise RuntimeError(f"record: {name} through {label}: a result is not the sum over ranks")
                steps.append(calls_of(recording.log))
            paths[label] = steps
        out["sets"][name] = {"tensors": len(shapes), "bytes": total, "fusion_threshold": packing.FUSION_BYTES,
                             "bound": math.ceil(total / packing.FUSION_BYTES) + 1, "paths": paths}
        recording.leaves = []
        del grads, runs
    strategy.extended.engine.close()
    if comm.Get_rank() == 0:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(out, f)


def record(out_path: str, mpirun: str = "mpirun", timeout: int = 900, with_tf: bool = True) -> dict:
    """Launch both layouts, merge rank 0's calls into ``out_path``; returns the merged dict."""
    import mpidist

    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up notes, once per rank
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    merged: dict[str, Any] = {
        "source": "python -m tools.costmodel record (tools/costmodel/record.py): NumPy-mode "
                  "MultiWorkerMirroredStrategy, MPI calls recorded on rank 0; steps[0] is the first step, "
                  "steps[-1] the repeat (steady state)",
        "mpidist_version": mpidist.__version__, "layouts": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for layout, (ranks, local) in LAYOUTS.items():
            part = os.path.join(tmp, f"{layout}.json")
            cmd = [mpirun, "-n", str(ranks), "--oversubscribe", "--bind-to", "none", "--mca",
                   "mpi_yield_when_idle", "1", "-x", "PYTHONPATH", "-x", "TF_CPP_MIN_LOG_LEVEL"]
            if local:
                cmd += ["-x", f"MPIDIST_LOCAL_SIZE={local}"]
                env["MPIDIST_LOCAL_SIZE"] = str(local)
            cmd += [sys.executable, "-m", "tools.costmodel", "record", "--worker", part]
            cmd += [] if with_tf else ["--no-tf"]
            subprocess.run(cmd, env=env, cwd=root, check=True, timeout=timeout)
            env.pop("MPIDIST_LOCAL_SIZE", None)
            with open(part, encoding="utf-8") as f:
                merged["layouts"][layout] = json.load(f)
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(merged, f, indent=1)
        f.write("\n")
    return merged


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.costmodel record", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=DEFAULT_OUT, help="where to write the calls (default: the committed file)")
    parser.add_argument("--no-tf", action="store_true", help="NumPy paths only (no TensorFlow import)")
    parser.add_argument("--worker", default="", help="run as one rank of a launched job, writing this file")
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker, not args.no_tf)
        return 0
    merged = record(args.out, with_tf=not args.no_tf)
    for layout, part in merged["layouts"].items():
        for name, s in part["sets"].items():
            for label, steps in s["paths"].items():
                data = [c for c in steps[-1] if c["collective"] == "allreduce"]
                print(f"{layout} ({part['ranks']} ranks, {part['nodes']} nodes) {name} {label}: "
                      f"{len(data)} data calls ({', '.join(sorted({c['algorithm'] for c in data}))}), "
                      f"{sum(c.get('speculated') is False for c in steps[-1])} blocking agreement(s) "
                      f"in the repeated step")
    return 0
