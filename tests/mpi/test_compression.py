"""Compression on the wire (collectives/compression.py): float32 SUM/MEAN allreduce data sent as
float16 or bfloat16, summed in float32. Results against a float64 NumPy reference of every rank's
input (each rank computes all inputs from (seed, rank)), within the rounding bound the module
documents; every rank gets the same bits; other dtypes and ops are untouched; ranks whose settings
differ get an error on every rank."""
from __future__ import annotations

import json
import os
import shutil
import tempfile

import numpy as np
import pytest

import mpidist
from mpidist.collectives import timeline
from mpidist.collectives.options import CallOptions
from mpidist.cross_device.options import CommunicationOptions
from mpidist.errors import CollectiveMismatchError

UNIT = {"float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}  # unit roundoff of each wire format
KINDS = list(UNIT)
SHAPES = [(), (0,), (1,), (3,), (7, 5), (100_003,)]  # fewer elements than ranks, odd splits, large


def inputs(size: int, shape: tuple, seed: int, spread: float = 3.0) -> list[np.ndarray]:
    """Every rank's float32 input: normal values times 10^U(-spread, spread)."""
    out = []
    for rank in range(size):
        rng = np.random.default_rng([seed, rank, len(shape)])
        x = rng.standard_normal(shape) * 10.0 ** rng.uniform(-spread, spread, shape)
        out.append(np.asarray(x, dtype=np.float32))
    return out


def check_close(got: np.ndarray, xs: list[np.ndarray], kind: str, mean: bool = False) -> None:
    """|got - exact| <= u * (sum_i |x_i| + |exact|) + float16's underflow term (module docstring)."""
    stack = np.array(xs, dtype=np.float64)
    exact, magnitude = stack.sum(axis=0), np.abs(stack).sum(axis=0)
    if mean:
        exact, magnitude = exact / len(xs), magnitude / len(xs)
    assert got.dtype == np.float32 and got.shape == exact.shape
    largest = float(np.abs(stack).max()) * len(xs) if stack.size else 0.0
    bound = UNIT[kind] * (magnitude + np.abs(exact)) * 1.001 + (largest * 2.0 ** -38 if kind == "float16" else 0)
    err = np.abs(got.astype(np.float64) - exact)
    assert np.all(err <= bound), f"worst excess {np.max(err - bound)} at {np.argmax(err - bound)}"


def same_everywhere(comm, array: np.ndarray) -> None:
    mine = np.ascontiguousarray(array).tobytes()
    assert comm.allgather(mine) == [mine] * comm.Get_size()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("op", ["sum", "mean"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_within_rounding_bound_and_same_on_every_rank(engine, comm, kind, op, shape):
    xs = inputs(comm.Get_size(), shape, seed=1)
    got = engine.allreduce(xs[comm.Get_rank()], op, options=CallOptions(compression=kind))
    check_close(np.asarray(got), xs, kind, mean=op == "mean")
    same_everywhere(comm, got)


@pytest.mark.parametrize("kind", KINDS)
def test_values_really_travel_compressed(engine, comm, kind):
    """1 + 2^-20 is not a float16/bfloat16 value: each other rank's copy rounds to 1, the float32
    sum n + 2^-20 rounds to n. One rank: nothing travels, the sum is exact."""
    n = comm.Get_size()
    x = np.full(5, 1 + 2.0 ** -20, dtype=np.float32)
    got = engine.allreduce(x, options=CallOptions(compression=kind))
    plain = engine.allreduce(x)
    assert np.array_equal(plain, np.full(5, n * (1 + 2.0 ** -20), np.float32))
    assert np.array_equal(got, plain if n == 1 else np.full(5, n, np.float32))


def test_float16_beyond_65504_is_scaled_not_inf(engine, comm):
    """Each block is scaled by a power of two: 1e9 and 1e-9 both survive within float16 precision
    (relative to their block's largest value)."""
    size = comm.Get_size()
    xs = [np.array([1e9, -3e7, 7e4, 65504.0, 1.0], np.float32) * (r + 1) for r in range(size)]
    got = engine.allreduce(xs[comm.Get_rank()], options=CallOptions(compression="float16"))
    assert np.all(np.isfinite(got))
    check_close(got, xs, "float16")
    tiny = [np.full(4, 1e-9 * (r + 1), np.float32) for r in range(size)]
    got = engine.allreduce(tiny[comm.Get_rank()], options=CallOptions(compression="float16"))
    check_close(got, tiny, "float16")
    assert np.all(got > 0)


@pytest.mark.parametrize("kind", KINDS)
def test_inf_and_nan_propagate(engine, comm, kind):
    """As in float32: inf and NaN reach every rank at their positions (float16: a block holding
    inf/NaN is sent unscaled, so there its finite values beyond 65504 become inf, as documented)."""
    x = np.array([np.nan, np.inf, 2.0, -3.5, 1.0, 0.25, -8.0, 1.5], np.float32) if comm.Get_rank() == 0 \
        else np.array([1.0, 1.0, 2.0, -3.5, 1.0, 0.25, -8.0, 1.5], np.float32)
    got = engine.allreduce(x, options=CallOptions(compression=kind))
    assert np.isnan(got[0]) and got[1] == np.inf
    n = comm.Get_size()
    assert np.array_equal(got[2:], x[2:] * n)  # small dyadic values: exact in both formats
    same_everywhere(comm, got)


@pytest.mark.parametrize("kind", KINDS)
def test_other_dtypes_and_ops_travel_uncompressed(engine, comm, kind):
    """float64, float16, integers and MIN/MAX/PROD give the uncompressed results bit for bit, also
    next to a float32 leaf that is compressed in the same call."""
    rank, n = comm.Get_rank(), comm.Get_size()
    fine = np.float32(1 + 2.0 ** -20)
    value = {"f64": np.full(3, 1 + 2.0 ** -40) * (rank + 1), "f16": np.full(2, rank + 0.5, np.float16),
             "i32": np.arange(4, dtype=np.int32) * (rank + 1), "f32": np.full(3, fine)}
    opts = CallOptions(compression=kind)
    got, plain = engine.allreduce(value, options=opts), engine.allreduce(value)
    for key in ("f64", "f16", "i32"):
        assert got[key].dtype == value[key].dtype and np.array_equal(got[key], plain[key]), key
    assert np.array_equal(got["f32"], plain["f32"] if n == 1 else np.full(3, n, np.float32))
    x = inputs(n, (33,), seed=2)[rank]
    for op in ("min", "max", "prod"):
        assert np.array_equal(engine.allreduce(x, op, options=opts), engine.allreduce(x, op)), op


@pytest.mark.node_layout  # algorithm=hierarchical among the settings
@pytest.mark.parametrize("kind", KINDS)
def test_nest_packs_and_settings(engine, comm, kind, rc_settings):
    """A nest of float32 leaves in several packs, under rc.compression, a deadline and each algorithm."""
    n, rank = comm.Get_size(), comm.Get_rank()
    shapes = [(10,), (300, 7), (1,), (4096,)]
    per_leaf = [inputs(n, s, seed=3 + i) for i, s in enumerate(shapes)]
    rc_settings(compression=kind)
    for kwargs in ({}, {"bytes_per_pack": 4096}, {"timeout_seconds": 60}, {"algorithm": "hierarchical"}):
        got = engine.allreduce([xs[rank] for xs in per_leaf], "mean", **kwargs)
        for leaf, xs in zip(got, per_leaf):
            check_close(leaf, xs, kind, mean=True)
            same_everywhere(comm, leaf)


def test_repeated_plain_calls_stay_compressed(engine, comm, rc_settings):
    """rc.compression also covers the engine's cached path for repeated plain calls."""
    n = comm.Get_size()
    x = np.full(8, 1 + 2.0 ** -20, dtype=np.float32)
    engine.allreduce(x)  # cached uncompressed ...
    rc_settings(compression="bfloat16")  # ... then the setting changes
    for _ in range(3):
        assert np.array_equal(engine.allreduce(x), np.full(8, n * (1 + 2.0 ** -20) if n == 1 else n, np.float32))


def test_communication_options_reach_the_numpy_strategy(comm):
    """CommunicationOptions(compression=...) on the strategy, and per call, reach the engine."""
    n = comm.Get_size()
    x = np.full(4, 1 + 2.0 ** -20, dtype=np.float32)
    expected = np.full(4, n * (1 + 2.0 ** -20) if n == 1 else n, np.float32)
    with mpidist.rc.override(framework="numpy"):
        strategy = mpidist.MultiWorkerMirroredStrategy(
            communication_options=CommunicationOptions(compression="bf16"))
        try:
            assert np.array_equal(strategy.reduce("sum", x, axis=None), expected)
            per_call = strategy.reduce("sum", x, axis=None, options=CommunicationOptions(compression="none"))
            assert np.array_equal(per_call, np.full(4, n * (1 + 2.0 ** -20), np.float32))
        finally:
            strategy.close()


@pytest.mark.mpi(min_size=2)
def test_different_settings_raise_on_every_rank(engine, comm, rc_settings):
    x = np.ones(6, np.float32)
    first = CallOptions(compression="float16" if comm.Get_rank() == 0 else "none")
    with pytest.raises(CollectiveMismatchError) as info:
        engine.allreduce(x, options=first)
    assert "compression=float16" in str(info.value)
    report = str(info.value).split(": ", 1)[1]
    assert comm.allgather(report) == [report] * comm.Get_size()
    # rc on one rank only: the other ranks' cached plain path must not run uncompressed silently
    engine.allreduce(x)
    engine.allreduce(x)
    if comm.Get_rank() == comm.Get_size() - 1:
        rc_settings(compression="bfloat16")
    with pytest.raises(CollectiveMismatchError, match="compression=bfloat16"):
        engine.allreduce(x)
    assert engine.allreduce(x, options=CallOptions(compression="none"))[0] == comm.Get_size()  # still usable


def test_communication_options_reach_the_tensorflow_strategy(eng, comm):
    """A TensorFlow strategy's CommunicationOptions(compression=...) reach the engine, eagerly and
    inside a tf.function (replica context), with no change in the TensorFlow bridge."""
    tf = pytest.importorskip("tensorflow")
    import mpidist.on_tensorflow
    n = comm.Get_size()
    x = tf.constant(np.full(4, 1 + 2.0 ** -20, dtype=np.float32))
    expected = np.full(4, n * (1 + 2.0 ** -20) if n == 1 else n, np.float32)
    strategy = mpidist.on_tensorflow.MultiWorkerMirroredStrategy.on_engine(eng, CommunicationOptions(compression="bfloat16"))
    assert np.array_equal(strategy.reduce("sum", x, axis=None).numpy(), expected)

    @tf.function
    def step():
        return strategy.run(lambda: tf.distribute.get_replica_context().all_reduce("sum", x))

    assert np.array_equal(strategy.experimental_local_results(step())[0].numpy(), expected)


def test_communication_options_reach_a_strategy_with_cross_device_ops(eng, comm):
    """With ``cross_device_ops=``, the strategy's CommunicationOptions(compression=...) still reach
    the engine (the ops' own options carry no compression; rc's default is off)."""
    tf = pytest.importorskip("tensorflow")
    import mpidist.on_tensorflow
    n = comm.Get_size()
    x = tf.constant(np.full(4, 1 + 2.0 ** -20, dtype=np.float32))
    expected = np.full(4, n * (1 + 2.0 ** -20) if n == 1 else n, np.float32)
    strategy = mpidist.on_tensorflow.MultiWorkerMirroredStrategy.on_engine(eng, CommunicationOptions(compression="bfloat16"),
                             cross_device_ops=mpidist.MPIAllReduce())
    assert np.array_equal(strategy.reduce("sum", x, axis=None).numpy(), expected)


def test_timeline_names_compression_and_its_transfers(comm):
    """The timeline's span of a compressed allreduce says so and shows Alltoallv + Allgatherv."""
    directory = comm.bcast(tempfile.mkdtemp(prefix="mpidist-compression-") if comm.Get_rank() == 0 else None)
    engine = mpidist.Engine(comm)
    try:
        with mpidist.rc.override(timeline=os.path.join(directory, "trace.json")):
            engine.allreduce(np.ones(1000, np.float32), options=CallOptions(compression="float16"))
            engine.allreduce(np.ones(1000, np.int32), options=CallOptions(compression="float16"))
            path = timeline.recorder().path
        assert timeline.recorder() is None  # reading the setting again closes the trace file
    finally:
        engine.close()
    with open(path, encoding="utf-8") as f:
        events = json.load(f)
    comm.Barrier()
    if comm.Get_rank() == 0:
        shutil.rmtree(directory, ignore_errors=True)
    events = events["traceEvents"] if isinstance(events, dict) else events
    spans = [e for e in events if e.get("cat") == "collective"]
    assert len(spans) == 2
    compressed, plain = spans
    assert compressed["args"].get("compression") == ("float16" if comm.Get_size() > 1 else None)
    assert "compression" not in plain["args"]  # int32 travels unchanged
    transfers = [e["args"].get("mpi", e["name"]) for e in events if e.get("name") == "transfer"
                 and compressed["ts"] <= e["ts"] <= compressed["ts"] + compressed["dur"]]
    if comm.Get_size() > 1:
        assert any("Alltoallv" in str(t) for t in transfers) and any("Allgatherv" in str(t) for t in transfers), \
            transfers
