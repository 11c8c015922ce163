"""Collectives on CuPy arrays and TensorFlow GPU tensors, against NumPy references over all ranks.

With a CUDA GPU and CuPy these run on the GPU. Without one (CI), the CuPy tests run against
``fake_cupy``, a stand-in backed by host memory with NCCL over MPI: that tests mpidist's GPU logic
(dispatch, paths, packing, NCCL groups, NCCL+MPI across fake nodes, staging, zero host copies on
the NCCL and device-MPI paths) but not CuPy, CUDA or NCCL themselves. The TensorFlow GPU tests need
a real GPU and skip without one. The CuPy tests have run on a real GPU (docs/gpu.md); the
TensorFlow GPU tests have not. On a GPU node (see docs/gpu.md):

    mpirun -n 2 python tests/mpi_pytest.py -q --with-mpi tests/mpi/test_gpu.py

Each engine configuration fixes its path at its first GPU collective (the job's facts are
gathered once per engine): "auto", "nccl" (skipped where NCCL is unusable, e.g. two ranks on one
GPU before NCCL 2.30), "nccl-device" (NCCL, with MPI across nodes on device pointers),
"mpi-staged" (RING, staged through host memory) and "mpi-device" (RING on device pointers); the
"-device" ones are skipped on a GPU unless the MPI library says it is CUDA-aware. On the fake
(whose streams keep work pending until the host waits: fake_stream.py) a missing wait before MPI
reads device memory gives wrong results.
"""
from __future__ import annotations

import collections
import json
import os
import tempfile

os.environ.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")  # leave GPU memory for CuPy and NCCL

import numpy as np
import pytest
from gpu_arrays import NCCL_ALWAYS, REAL_GPU, cp  # noqa: F401 (cp: the module-scoped CuPy fixture)
from reference import DTYPES, OPS, SHAPES, make, reduce_all, valid

import mpidist
from mpidist.collectives import timeline
from mpidist.collectives.gpu import facts as gpu_facts
from mpidist.collectives.gpu import transports
from mpidist.collectives.options import CallOptions
from mpidist.collectives.gpu.paths import Path
from mpidist.errors import CollectiveMismatchError, GpuUnavailableError
from mpidist.topology import mpi_library

# without a GPU every test here runs on fake_cupy/fake_nccl: marked so, and counted apart in the summary
pytestmark = [pytest.mark.mpi, pytest.mark.node_layout, pytest.mark.two_nodes] + \
    ([] if REAL_GPU else [pytest.mark.fake_gpu])

CONFIGS = {"auto": ("auto", "auto"), "nccl": ("nccl", "auto"), "nccl-device": ("nccl", "yes"),
           "mpi-staged": ("ring", "no"), "mpi-device": ("ring", "yes")}
Setup = collections.namedtuple("Setup", "name engine implementation path")


@pytest.fixture
def transfers(cp):
    """Bytes copied between host and device during a test (fake CuPy only: it counts them)."""
    if REAL_GPU:
        return None
    import fake_cupy
    fake_cupy.transfers.update(to_device=0, to_host=0)
    return fake_cupy.transfers


@pytest.fixture(scope="module", params=list(CONFIGS))
def setup(request, cp):
    implementation, aware = CONFIGS[request.param]
    if aware == "yes" and REAL_GPU and mpi_library._query_library() is not True:  # same on every rank
        pytest.skip("the MPI library does not say it is CUDA-aware")
    with mpidist.rc.override(cuda_aware_mpi=aware):
        engine = mpidist.Engine()
        try:
            # fixes this engine's job facts and path
            engine.allreduce(cp.ones(1, dtype=cp.float32), options=CallOptions(implementation=implementation))
        except GpuUnavailableError as err:  # raised alike on every rank
            engine.close()
            pytest.skip(str(err))
    state = gpu_facts.state(engine)
    yield Setup(request.param, engine, implementation, state.last_path)
    if engine.broken is None:
        engine.close()


def call(s: Setup, method: str, *args, **kwargs):
    """The engine's ``method``, with the setup's implementation in the call's options."""
    return getattr(s.engine, method)(*args, options=CallOptions(implementation=s.implementation), **kwargs)


def check(cp, result, expected: np.ndarray, op: str = "sum") -> None:
    """A CuPy array of the expected dtype and shape, equal to the NumPy reference (MEAN of floats:
    close, since ncclAvg scales before it sums)."""
    assert isinstance(result, cp.ndarray), type(result)
    assert result.dtype == expected.dtype and result.shape == expected.shape, (result.dtype, result.shape)
    host = cp.asnumpy(result)
    if op == "mean" and expected.dtype.kind in "fc":
        tolerance = 1e-2 if expected.dtype == np.float16 else 1e-6
        np.testing.assert_allclose(host, expected, rtol=tolerance, atol=tolerance)
    else:
        np.testing.assert_array_equal(host, expected)


def nccl_usable(s: Setup) -> bool:
    """The fake gives every rank its own pretend GPU, so NCCL always works there; on real GPUs it
    depends on the machine (two ranks on one GPU), which the job's facts record."""
    facts = gpu_facts.state(s.engine).facts
    if NCCL_ALWAYS:
        assert facts.nccl_reason is None, facts
        return True
    return facts.nccl_reason is None


def expected_path(s: Setup, algorithm: str = "auto", deadline: bool = False) -> Path:
    """The path a collective must take, from the configuration and the topology (paths.py's rules)."""
    aware = {"yes": True, "no": False}.get(CONFIGS[s.name][1], gpu_facts.state(s.engine).facts.cuda_aware)
    mpi = Path.MPI_DEVICE if aware and not deadline else Path.MPI_STAGED
    if s.implementation == "ring" or not nccl_usable(s):
        return mpi
    topo = s.engine.topology
    if topo.num_nodes == 1:
        return Path.NCCL
    if algorithm == "hierarchical" or len(set(topo.node_sizes)) > 1:
        return Path.NCCL_HIERARCHICAL_COPY
    return Path.NCCL_HIERARCHICAL


def test_path_matches_the_configuration(setup):
    assert setup.path is expected_path(setup), (setup.name, setup.path)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_allreduce_every_dtype_and_op(setup, cp, dtype, op):
    rank, size = setup.engine.rank, setup.engine.size
    if not valid(dtype, op):
        with pytest.raises(TypeError, match="allreduce: leaf 0 of `value` has dtype"):
            call(setup, "allreduce", {"a": cp.asarray(make(rank, dtype, (2,)))}, op)
        return
    value = {name: cp.asarray(make(rank, dtype, shape, op)) for name, shape in SHAPES.items()}
    result = call(setup, "allreduce", value, op)
    assert list(result) == list(value)
    for name, shape in SHAPES.items():
        check(cp, result[name], reduce_all([make(r, dtype, shape, op) for r in range(size)], op), op)


@pytest.mark.parametrize("timeout", [None, 60.0])
def test_large_buffer(setup, cp, timeout):
    inputs = [make(r, np.float32, (300_001,)) for r in range(setup.engine.size)]  # 1.2 MB
    result = call(setup, "allreduce", cp.asarray(inputs[setup.engine.rank]), "sum", timeout_seconds=timeout)
    check(cp, result, reduce_all(inputs, "sum"))
    assert gpu_facts.state(setup.engine).last_path is expected_path(setup, deadline=timeout is not None)


Pair = collections.namedtuple("Pair", "left right")


@pytest.mark.parametrize("packing", [{}, {"bytes_per_pack": 64}, {"num_packs": 0}, {"num_packs": 3}], ids=str)
@pytest.mark.parametrize("op", ["sum", "max", "mean"])
def test_nests_mixed_dtypes_and_host_leaves(setup, cp, packing, op):
    rank, size = setup.engine.rank, setup.engine.size
    dtypes = [np.float32, np.float64, np.int32, np.float16, np.int8 if op == "mean" else np.bool_, np.int64]

    def leaves(r):
        return [make(r, dtypes[i % 6], (i % 5, 2) if i % 4 else (i,), op, seed=i) for i in range(30)]

    mine = leaves(rank)
    value = {"layers": [Pair(cp.asarray(mine[i]), cp.asarray(mine[i + 1])) for i in range(0, 20, 2)],
             "bias": tuple(cp.asarray(x) for x in mine[20:29]), "host": mine[29], "count": 2}
    result = call(setup, "allreduce", value, op, **packing)
    everyone = [leaves(r) for r in range(size)]
    flat = [x for p in result["layers"] for x in p] + list(result["bias"])
    assert isinstance(result["layers"][0], Pair) and isinstance(result["bias"], tuple)
    for i, out in enumerate(flat):
        check(cp, out, reduce_all([e[i] for e in everyone], op), op)
    assert isinstance(result["host"], np.ndarray)  # host leaves come back on the host
    np.testing.assert_allclose(result["host"], reduce_all([e[29] for e in everyone], op), rtol=1e-6)
    assert result["count"] == (2 * size if op == "sum" else 2) and type(result["count"]) is int


@pytest.mark.parametrize("which_root", ["first", "last"])
def test_broadcast(setup, cp, which_root):
    rank, size = setup.engine.rank, setup.engine.size
    root = 0 if which_root == "first" else size - 1
    mine = [make(rank, d, (3, 2), seed=i) for i, d in enumerate(DTYPES)] + [make(rank, np.float32, (70_000,))]
    value = [cp.asarray(x) for x in mine]
    result = call(setup, "broadcast", value, root=root)
    for i, out in enumerate(result):
        check(cp, out, make(root, mine[i].dtype, mine[i].shape, seed=i if i < len(DTYPES) else 0))
    if rank == root:
        assert all(out is v for out, v in zip(result, value))  # the root's own arrays, as MPI_Bcast


def test_allgather_ragged(setup, cp):
    rank, size = setup.engine.rank, setup.engine.size
    a = [np.full((r + 1, 3), r, dtype=np.int32) for r in range(size)]
    b = [np.arange(r % 2 * 4, dtype=np.float16) for r in range(size)]  # some ranks contribute no rows
    out = call(setup, "allgather", [cp.asarray(a[rank]), cp.asarray(b[rank])])
    check(cp, out[0], np.concatenate(a))
    check(cp, out[1], np.concatenate(b))


@pytest.mark.parametrize("op", ["sum", "mean", "max"])
@pytest.mark.parametrize("which_root", ["first", "last"])
def test_reduce(setup, cp, op, which_root):
    rank, size = setup.engine.rank, setup.engine.size
    root = 0 if which_root == "first" else size - 1
    inputs = [make(r, np.float64, (4, 3), op) for r in range(size)]
    result = call(setup, "reduce", [cp.asarray(inputs[rank])], op, root=root)
    if rank != root:
        assert result is None
        return
    check(cp, result[0], reduce_all(inputs, op), op)


@pytest.mark.parametrize("op", ["sum", "mean"])
def test_reduce_scatter_uneven_blocks(setup, cp, op):
    rank, size = setup.engine.rank, setup.engine.size
    inputs = [make(r, np.float32, (2 * size + 1, 3), op) for r in range(size)]
    out = call(setup, "reduce_scatter", [cp.asarray(inputs[rank]), cp.asarray(inputs[rank][:, 0].astype(np.int64))],
               op)
    whole = reduce_all(inputs, op)
    ints = reduce_all([x[:, 0].astype(np.int64) for x in inputs], op)
    check(cp, out[0], np.array_split(whole, size)[rank], op)
    check(cp, out[1], np.array_split(ints, size)[rank], op)


def test_staging_happens_only_on_staged_paths(setup, cp, monkeypatch, transfers):
    calls = []
    original = transports.stage_to_host
    monkeypatch.setattr(transports, "stage_to_host", lambda env, a: calls.append(a.nbytes) or original(env, a))
    value = {"w": cp.ones((1000, 3), dtype=cp.float32), "b": [cp.ones(7, dtype=cp.float16), cp.ones(2, dtype=cp.int64)]}
    if transfers is not None:
        transfers.update(to_device=0, to_host=0)  # what the fake CuPy counts from here on
    for kwargs in ({}, {"num_packs": 2}, {"algorithm": "hierarchical"}):
        call(setup, "allreduce", value, "mean", **kwargs)
        call(setup, "broadcast", value, root=setup.engine.size - 1)
        call(setup, "allgather", value["b"], **kwargs)
        call(setup, "reduce_scatter", [value["w"]], "sum", **kwargs)
        call(setup, "reduce", value, "max", root=0, **kwargs)
    hierarchical = setup.path in (Path.NCCL_HIERARCHICAL, Path.NCCL_HIERARCHICAL_COPY)
    mpi_on_device = gpu_facts.state(setup.engine).facts.cuda_aware  # (no deadline here)
    if setup.path in (Path.NCCL, Path.MPI_DEVICE) or (hierarchical and mpi_on_device):
        assert calls == []
        if transfers is not None:  # not one byte crossed between host and device, in any collective
            assert transfers == {"to_device": 0, "to_host": 0}, transfers
    else:  # MPI through host memory: the staged path, or the MPI steps across nodes of the NCCL paths
        assert setup.path is Path.MPI_STAGED or hierarchical, setup.path
        if setup.path is Path.MPI_STAGED:
            stages = setup.engine.size > 1
        else:  # nccl+mpi: every rank's shard crosses nodes; nccl-copy+mpi: the node leaders' buffers
            stages = setup.path is Path.NCCL_HIERARCHICAL or setup.engine.topology.local_rank == 0
        if stages:
            assert calls


@pytest.mark.parametrize("algorithm", ["hierarchical", "flat", "auto"])
def test_every_collective_with_each_algorithm(setup, cp, algorithm):
    """On fake nodes (MPIDIST_LOCAL_SIZE) NCCL paths go NCCL+MPI, or NCCL-copy+MPI for "hierarchical"."""
    rank, size = setup.engine.rank, setup.engine.size
    mine = [make(rank, np.float32, (2 * size + 1, 3)), make(rank, np.int32, (5,), seed=1)]
    value = [cp.asarray(x) for x in mine]
    everyone = [[make(r, np.float32, (2 * size + 1, 3)), make(r, np.int32, (5,), seed=1)] for r in range(size)]
    state = gpu_facts.state(setup.engine)
    state.last_path = None
    out = call(setup, "allreduce", value, "sum", algorithm=algorithm)
    assert state.last_path is expected_path(setup, algorithm), (algorithm, state.last_path)
    for i, o in enumerate(out):
        check(cp, o, reduce_all([e[i] for e in everyone], "sum"))
    out = call(setup, "broadcast", value, root=size // 2, algorithm=algorithm)
    for i, o in enumerate(out):
        check(cp, o, everyone[size // 2][i])
    out = call(setup, "allgather", value, algorithm=algorithm)
    for i, o in enumerate(out):
        check(cp, o, np.concatenate([e[i] for e in everyone]))
    out = call(setup, "reduce_scatter", value, "max", algorithm=algorithm)
    for i, o in enumerate(out):
        check(cp, o, np.array_split(reduce_all([e[i] for e in everyone], "max"), size)[rank])
    out = call(setup, "reduce", value, "sum", root=size - 1, algorithm=algorithm)
    if rank == size - 1:
        for i, o in enumerate(out):
            check(cp, o, reduce_all([e[i] for e in everyone], "sum"))
    else:
        assert out is None
    assert state.last_path is expected_path(setup, algorithm), (algorithm, state.last_path)


def test_bfloat16_where_cupy_has_it(setup, cp):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    try:
        x = cp.asarray(np.full(5, setup.engine.rank + 1, dtype=ml_dtypes.bfloat16))
    except Exception as err:  # CuPy before ml_dtypes support: same answer on every rank
        pytest.skip(f"this CuPy has no bfloat16 arrays ({err})")
    out = call(setup, "allreduce", x, "sum")
    assert out.dtype == x.dtype
    size = setup.engine.size
    np.testing.assert_array_equal(cp.asnumpy(out).astype(np.float32), np.full(5, size * (size + 1) / 2))


def test_timeline_records_the_path_and_its_nccl_and_mpi_steps(setup, cp, comm):
    directory = comm.bcast(tempfile.mkdtemp(prefix="mpidist-gpu-timeline-") if comm.rank == 0 else None)
    value = [cp.ones(5000, dtype=cp.float32), cp.ones(3, dtype=cp.int64)]
    with mpidist.rc.override(timeline=os.path.join(directory, "trace.json")):
        call(setup, "allreduce", value, "sum")
        call(setup, "broadcast", value, root=0)
        path = timeline.recorder().path
    assert timeline.recorder() is None  # reading the setting again closes the file
    with open(path, encoding="utf-8") as f:
        events = json.load(f)
    spans = [e for e in events if e.get("cat") == "collective"]
    assert [e["name"] for e in spans] == ["allreduce", "broadcast"]
    assert all(e["args"]["path"] == setup.path.value for e in spans), [e["args"] for e in spans]
    assert spans[0]["args"]["bytes"] == 5000 * 4 + 3 * 8 and spans[0]["args"]["op"] == "SUM"
    transfers = [e["args"] for e in events if e["name"] == "transfer"]
    nccl = [t for t in transfers if "nccl" in t]
    if setup.path.uses_nccl and setup.path is not Path.NCCL and setup.engine.topology.local_size == 1:
        assert nccl == [] and all("mpi" in t for t in transfers), transfers  # a node of one rank: no NCCL steps
    elif setup.path.uses_nccl:
        assert {t["nccl"] for t in nccl} >= {"broadcast"} and any(t["nccl"] != "broadcast" for t in nccl), transfers
        across = [t for t in transfers if "mpi" in t]  # the MPI steps between nodes
        if setup.path is Path.NCCL:
            assert across == [], transfers
        elif setup.engine.topology.local_rank == 0 or setup.path is Path.NCCL_HIERARCHICAL:
            assert across, transfers
    else:
        assert nccl == [] and all("mpi" in t for t in transfers)
    comm.Barrier()


@pytest.mark.mpi(min_size=2)
def test_host_on_one_rank_device_on_others_is_a_mismatch(setup, cp):
    value = np.ones(3) if setup.engine.rank == 0 else cp.ones(3)
    with pytest.raises(CollectiveMismatchError, match="ranks issued different collectives"):
        call(setup, "allreduce", value)


def test_bench_gpu_runs_and_reports_the_paths(cp, comm):
    """``python -m mpidist bench gpu``'s measurements (on the fake CuPy their times mean nothing).
    Where NCCL cannot join every rank (ranks sharing a GPU), the NCCL part is refused with why."""
    from mpidist.bench import gpu as bench_gpu
    out = bench_gpu.run([4096, 65536], [4096], 0.01, comm)
    if out["refused"] is not None:
        assert not NCCL_ALWAYS and out["nccl"] is None and "NCCL" in out["refused"], out
    else:
        assert [r["bytes"] for r in out["nccl"]] == [4096, 65536]
        assert all(r["median"]["raw NCCL"] > 0 and r["median"]["mpidist"] > 0 for r in out["nccl"]), out
    assert [r["bytes"] for r in out["staged"]] == [4096]
    assert out["staged"][0]["median"]["loop"] > 0 and out["staged"][0]["median"]["auto"] > 0
    assert {out["paths"]["auto"], out["paths"]["ring"]} <= {p.value for p in Path}
    assert out["paths"]["ring"] in ("mpi-staged", "mpi-device")
    text = bench_gpu.tables(out)
    assert "staged allreduce" in text and ("refused" in text) is (out["refused"] is not None)


# -- strategies (NumPy framework) -------------------------------------------------------------------

@pytest.fixture(scope="module")
def strategy(cp):
    with mpidist.rc.override(framework="numpy"):
        return mpidist.MultiWorkerMirroredStrategy()


def test_strategy_reduce_run_gather_on_cupy(strategy, cp, comm):
    rank, size = comm.Get_rank(), comm.Get_size()
    total = size * (size + 1) / 2
    out = strategy.reduce("SUM", cp.full(4, rank + 1.0), axis=None)
    check(cp, out, np.full(4, total))
    reduced = strategy.run(lambda: mpidist.get_replica_context().all_reduce(
        "mean", {"g": cp.full((2, 2), rank + 1.0, dtype=cp.float32)}))
    check(cp, reduced["g"], np.full((2, 2), total / size, dtype=np.float32), "mean")
    rows = [2, 0, 3, 1]  # uneven last batches, one of them empty
    batches = [np.arange(rows[r % 4] * 2, dtype=np.float64).reshape(-1, 2) + r for r in range(size)]
    mean = strategy.reduce("MEAN", cp.asarray(batches[rank]), axis=0)
    everyone = np.concatenate(batches)
    check(cp, mean, everyone.mean(axis=0), "mean")
    gathered = strategy.gather(cp.asarray(batches[rank]), axis=0)
    check(cp, gathered, everyone)


def test_nccl_all_reduce_and_ring_on_cupy(cp, comm):
    rank, size = comm.Get_rank(), comm.Get_size()
    with mpidist.rc.override(framework="numpy"):
        node = mpidist.Topology(comm)
        mirrored = mpidist.MirroredStrategy(cross_device_ops=mpidist.NcclAllReduce(num_packs=2))
        ring = mpidist.MultiWorkerMirroredStrategy(communication_options=mpidist.experimental.CommunicationOptions(
            implementation=mpidist.experimental.CommunicationImplementation.RING))
    peers = node.node_ranks[node.node_index]
    state = gpu_facts.state(mirrored.extended._engine)
    try:
        got = mirrored.reduce("SUM", [cp.asarray([rank]), cp.ones(3)], axis=None)
    except GpuUnavailableError as err:
        if NCCL_ALWAYS:  # the fake gives every rank its own pretend GPU: NCCL must work
            raise
        # on a GPU node NCCL may be unusable (ranks sharing a GPU): then the job's facts say why
        assert state.facts.nccl_reason and str(err) == f"NcclAllReduce: NCCL is not available: {state.facts.nccl_reason}"
    else:
        check(cp, got[0], np.array([sum(peers)]))
        check(cp, got[1], np.full(3, float(len(peers))))
        assert state.facts.nccl_reason is None and state.last_path is Path.NCCL  # one node's engine
    check(cp, ring.reduce("SUM", cp.full(2, 1.0), axis=None), np.full(2, float(size)))
    assert gpu_facts.state(ring.extended._engine).last_path in (Path.MPI_STAGED, Path.MPI_DEVICE)
    node.free()


# -- TensorFlow GPU tensors -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tf_gpu():
    if not REAL_GPU:  # the fake CuPy has no DLPack
        pytest.skip("TensorFlow GPU tensors need a real GPU and CuPy")
    tf = pytest.importorskip("tensorflow")
    if not tf.config.list_physical_devices("GPU"):
        pytest.skip("TensorFlow sees no GPU")
    from mpidist.tensorflow import gpu_bridge
    gpu_bridge.prepare()  # memory growth, where TensorFlow has not initialized its GPUs yet
    return tf


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_tf_gpu_tensors_without_host_copies(tf_gpu, eng, cp, monkeypatch, mode):
    tf = tf_gpu
    from mpidist.tensorflow import collectives as tfc
    from mpidist.tensorflow import gpu_bridge
    copies, staged = [], []
    host_copy, stage = gpu_bridge.host_copy, transports.stage_to_host
    monkeypatch.setattr(gpu_bridge, "host_copy", lambda t: copies.append(t.dtype) or host_copy(t))
    monkeypatch.setattr(transports, "stage_to_host", lambda env, a: staged.append(a.nbytes) or stage(env, a))
    rank, size = eng.rank, eng.size
    with tf.device("/GPU:0"):
        x = tf.fill([1000, 3], tf.cast(rank + 1, tf.float32))
        y = tf.cast(tf.fill([5], rank), tf.float64)
    assert "GPU" in x.backing_device and "GPU" in y.backing_device
    fn = (lambda a, b: tfc.allreduce(eng, [a, b], "sum")) if mode == "eager" else \
        tf.function(lambda a, b: tfc.allreduce(eng, [a, b], "sum"))
    out = fn(x, y)
    assert all("GPU" in o.backing_device for o in out), [o.backing_device for o in out]
    assert out[0].dtype == tf.float32 and out[0].shape == (1000, 3)
    np.testing.assert_array_equal(out[0].numpy(), np.full((1000, 3), size * (size + 1) / 2, np.float32))
    np.testing.assert_array_equal(out[1].numpy(), np.full(5, size * (size - 1) / 2))
    assert copies == []  # no host copy in the bridge
    if gpu_facts.state(eng).last_path in (Path.NCCL, Path.MPI_DEVICE):
        assert staged == []  # ... nor in the engine


def test_tf_host_backed_int32_rides_along(tf_gpu, eng):
    tf = tf_gpu
    from mpidist.tensorflow import collectives as tfc
    with tf.device("/GPU:0"):
        x = tf.fill([3], tf.cast(eng.rank, tf.float32))
        n = tf.range(4)  # int32: TensorFlow keeps it in host memory even on a GPU device
    out = tfc.allreduce(eng, [x, n], "sum")
    size = eng.size
    np.testing.assert_array_equal(out[0].numpy(), np.full(3, size * (size - 1) / 2, np.float32))
    np.testing.assert_array_equal(out[1].numpy(), np.arange(4) * size)


def test_tf_strategy_reduce_on_gpu(tf_gpu, eng):
    tf = tf_gpu
    import mpidist.on_tensorflow
    from mpidist.cross_device.options import CommunicationOptions
    strategy = mpidist.on_tensorflow.MultiWorkerMirroredStrategy.on_engine(eng, CommunicationOptions())
    with tf.device("/GPU:0"):
        value = tf.fill([8], tf.cast(eng.rank + 1, tf.float32))
    out = strategy.reduce("MEAN", value, axis=None)
    assert "GPU" in out.backing_device
    np.testing.assert_allclose(out.numpy(), np.full(8, (eng.size + 1) / 2), rtol=1e-6)
