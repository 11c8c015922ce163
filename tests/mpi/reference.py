"""Inputs every rank can compute for every other rank, and NumPy references over all of them.

Each rank's input depends only on (seed, rank), so a rank computes all ranks' inputs locally and
compares the collective's result with NumPy applied to them: no communication in the reference.
:func:`same_everywhere` checks instead that a value is equal on every rank.
"""
from __future__ import annotations

import numpy as np

DTYPES = [np.bool_, np.int8, np.uint8, np.int16, np.int32, np.int64, np.uint64,
          np.float16, np.float32, np.float64, np.complex64, np.complex128]
OPS = ["sum", "mean", "min", "max", "prod"]
ALGORITHMS = ["flat", "hierarchical", "auto"]
SHAPES = {"scalar": (), "empty": (0,), "vector": (7,), "matrix": (3, 5)}


def valid(dtype, op: str) -> bool:
    kind = np.dtype(dtype).kind
    return not (kind == "b" and op == "mean") and not (kind == "c" and op in ("min", "max"))


def make(rank: int, dtype, shape, op: str = "sum", seed: int = 0) -> np.ndarray:
    """Small integer-valued data, so every summation order gives the exact same result."""
    rng = np.random.default_rng([seed, rank, len(shape), sum(shape)])
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return np.asarray(rng.random(shape) < 0.5)
    if op == "prod":
        choices = [1, 2] if dtype.kind == "u" else [-1, 1, 2]
        values = rng.choice(choices, size=shape)
    else:
        values = rng.integers(0 if dtype.kind == "u" else -3, 4, size=shape)
    if dtype.kind == "c":
        values = values + 1j * (rng.integers(-3, 4, size=shape) if op != "prod" else 0)
    return np.asarray(values).astype(dtype)


def reduce_all(inputs: list[np.ndarray], op: str) -> np.ndarray:
    return np.asarray(_reduce_all(inputs, op))


def _reduce_all(inputs: list[np.ndarray], op: str):
    stack = np.stack(inputs)
    dtype = stack.dtype
    n = len(inputs)
    if dtype.kind == "b":
        fn = np.logical_or if op in ("sum", "max") else np.logical_and
        return fn.reduce(stack, axis=0)
    if op in ("sum", "mean"):
        total = np.add.reduce(stack.astype(np.complex128 if dtype.kind == "c" else
                                           np.float64 if dtype.kind == "f" else dtype), axis=0)
        if op == "mean":
            total = total / n if dtype.kind in "fc" else np.trunc(total / n)
        return np.asarray(total).astype(dtype)
    if op == "prod":
        return np.multiply.reduce(stack, axis=0, dtype=dtype)
    return (np.min if op == "min" else np.max)(stack, axis=0)


def assert_same(result, expected) -> None:
    assert isinstance(result, np.ndarray), type(result)
    assert result.dtype == expected.dtype, (result.dtype, expected.dtype)
    assert result.shape == expected.shape, (result.shape, expected.shape)
    np.testing.assert_array_equal(result, expected)


FLOAT32_RTOL = 1e-5


def assert_float32_close(got, want, rtol: float = FLOAT32_RTOL) -> None:
    """``got`` equals ``want`` as far as float32 allows when the two were computed with different
    batch shapes, rank counts, execution modes (eager or tf.function: grappler and oneDNN fuse
    kernels) or summation orders: BLAS and oneDNN pick kernels and blockings by shape and CPU, so the
    sums inside a layer round differently (a Dense layer's predictions at two batch shapes: 3.9e-6
    relative apart on one CPU, 1e-7 on another). The rounding error of a sum is a few units of
    float32's epsilon (1.2e-7) times the magnitude of its terms, which an output near zero does not
    show: ``rtol`` of each value, and of the largest value as the absolute tolerance."""
    want = np.asarray(want)
    scale = float(np.max(np.abs(want))) if want.size else 0.0
    np.testing.assert_allclose(np.asarray(got), want, rtol=rtol, atol=rtol * scale)


CLIPS = {"clipnorm": 0.05, "global_clipnorm": 0.05, "clipvalue": 0.01}  # optimizer arguments of clipping tests


def clipping_acts(clip: str, grads) -> bool:
    """Whether an optimizer made with ``{clip: CLIPS[clip]}`` clips gradients ``grads`` (arrays, one
    per variable), with a margin of 2: a clipping test that did not clip could not fail."""
    grads = [np.asarray(g, np.float64) for g in grads]
    measure = {"clipnorm": max(np.linalg.norm(g) for g in grads),
               "global_clipnorm": np.sqrt(sum(np.sum(g * g) for g in grads)),
               "clipvalue": max(np.abs(g).max() for g in grads)}[clip]
    return bool(measure > 2 * CLIPS[clip])


def same_everywhere(comm, value):
    """Assert that ``value`` is equal on every rank of ``comm`` (every rank's value in the message);
    returns it."""
    everyone = comm.allgather(value)
    assert all(v == everyone[0] for v in everyone), everyone
    return everyone[0]


def assert_batch_norm_is_global(sync, ref, xs, rank, train_call) -> None:
    """A synchronized batch normalization ``sync`` called in training (``train_call(layer, x)``) on
    this rank's ``xs[rank]`` gives this rank's rows of the plain layer ``ref`` called (eagerly) on
    every rank's inputs concatenated, and the same moving statistics; in inference both use those."""
    got = np.asarray(train_call(sync, xs[rank]))
    want = np.asarray(ref(np.concatenate(xs), training=True))
    start = sum(len(x) for x in xs[:rank])
    np.testing.assert_allclose(got, want[start:start + len(xs[rank])], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(sync.moving_mean), np.asarray(ref.moving_mean), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(sync.moving_variance), np.asarray(ref.moving_variance), rtol=1e-4,
                               atol=1e-5)
    np.testing.assert_allclose(np.asarray(sync(xs[rank], training=False)), np.asarray(ref(xs[rank], training=False)),
                               rtol=1e-5, atol=1e-5)
