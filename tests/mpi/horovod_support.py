"""Helpers of the mpidist.horovod tests: each rank's known inputs, and one function run three ways.

``run(mode, fn, *arrays)`` calls ``fn`` on constant tensors eagerly ("eager"), inside a
``tf.function`` ("function") or in a ``tf.compat.v1`` graph run by a Session ("graph"), and
returns NumPy values (nests kept).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import tensorflow as tf

MODES = ["eager", "function", "graph"]


def data(rank: int, shape: tuple, dtype: Any = np.float32, seed: int = 0) -> np.ndarray:
    """Small integers (exact in every summation order), different on every rank."""
    rng = np.random.default_rng([seed, rank, len(shape)])
    return rng.integers(-4, 5, size=shape).astype(dtype)


def to_numpy(value: Any) -> Any:
    return tf.nest.map_structure(lambda t: t.numpy() if hasattr(t, "numpy") else np.asarray(t), value)


def run(mode: str, fn: Callable[..., Any], *arrays: np.ndarray) -> Any:
    if mode == "eager":
        return to_numpy(fn(*[tf.constant(a) for a in arrays]))
    if mode == "function":
        return to_numpy(tf.function(fn)(*[tf.constant(a) for a in arrays]))
    assert mode == "graph", mode
    with tf.Graph().as_default():
        out = fn(*[tf.constant(a) for a in arrays])
        with tf.compat.v1.Session() as sess:
            return sess.run(out)


def gradient(mode: str, fn: Callable[[tf.Tensor], tf.Tensor], x: np.ndarray, upstream: Callable[[tf.Tensor], tf.Tensor]) -> np.ndarray:
    """d/dx of ``sum(upstream(y) * y)`` with ``y = fn(x)``: GradientTape eagerly and in a
    tf.function, ``tf.gradients`` in a v1 graph. ``upstream`` gives this rank's upstream gradient."""
    def loss_and_grad(xt: tf.Tensor) -> tf.Tensor:
        if mode == "graph":
            y = fn(xt)
            return tf.gradients(tf.reduce_sum(upstream(y) * y), xt)[0]
        with tf.GradientTape() as tape:
            tape.watch(xt)
            y = fn(xt)
            loss = tf.reduce_sum(tf.stop_gradient(upstream(y)) * y)
        return tape.gradient(loss, xt)
    return run(mode, loss_and_grad, x)
