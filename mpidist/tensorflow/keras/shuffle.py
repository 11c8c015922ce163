"""Unseeded shuffles under an mpidist strategy: every rank draws the same permutation.

Rank r keeps the r-th block of every global batch (DATA sharding, what Keras asks for NumPy
input), so the ranks must see the same global batches: with shuffling, the same permutation. An
unseeded shuffle draws a different one on every rank, and the blocks overlap and miss rows. When
a multi-rank mpidist strategy is built, its ranks agree on a base seed (one broadcast); from then
on, while no global seed is set (``tf.random.set_seed`` / ``keras.utils.set_random_seed``: then
TensorFlow's own seeds already agree), the k-th unseeded shuffle of the program draws from a seed
made from (base, k):

- ``tf.data.Dataset.shuffle(n)`` without ``seed``: gets one; ``reshuffle_each_iteration`` keeps
  giving a new order every epoch, the same on every rank;
- ``model.fit(x, y, shuffle=True)`` (and ``shuffle="batch"``) on arrays: Keras draws each epoch's
  permutation with ``tf.random.shuffle`` inside its input pipeline; while that pipeline is built
  (``ArrayDataAdapter.get_tf_dataset``), an unseeded ``tf.random.shuffle`` called in that thread is
  a stateless shuffle whose seed is (base, k) and a counter advanced once per permutation: a new
  permutation every epoch, the same on every rank.

``tf.random.shuffle`` is wrapped once, for good, through the patch registry (every API module that
exports it: ``tf.random``, ``tf.compat.v2.random``, ...); the wrapper consults a context variable
that the pipeline's builder sets for the time it runs, so another thread's shuffles (or this
thread's outside the builder) are TensorFlow's own: nothing is swapped back and forth. Keras 2
(tf_keras) builds that pipeline in ``TensorLikeDataAdapter.__init__``, with the
``tf.random.shuffle`` of its own ``tensorflow.compat.v2`` module: the same there (``install_keras2``).

Ranks must build their shuffled pipelines in the same order (as SPMD programs do). A dataset
built before the strategy is not covered. The base comes from the widest strategy built so far
(a node-local MirroredStrategy built later does not replace a MultiWorkerMirroredStrategy's).
"""
from __future__ import annotations

import contextlib
import contextvars
import random
from typing import Any, Callable, Iterator, TypedDict

import numpy as np

from .. import owners, patching


class _Seeds(TypedDict):
    base: int | None  # the agreed base seed (None: no multi-rank strategy yet)
    count: int        # seeds handed out since the base was agreed
    size: int         # ranks of the widest strategy so far


_state: _Seeds = {"base": None, "count": 0, "size": 0}
_DEFAULT_GRAPH_SEED = 87654321  # what TensorFlow reports as the global seed when none is set


def register(strategy: Any) -> None:
    """Collective over ``strategy``'s ranks (at its creation): agree on the base seed.

    The seed is process-wide, so it is taken from the widest strategy built so far: a
    MirroredStrategy (the ranks of one node) built after a MultiWorkerMirroredStrategy must not
    give each node a base of its own. The broadcast always runs (collective on every rank).
    """
    if owners.multi_rank(strategy) is None:
        return
    mine = np.array([random.SystemRandom().getrandbits(62)], dtype=np.int64)
    base = int(strategy.engine.broadcast(mine, root=0)[0])
    if strategy.engine.size >= _state["size"]:
        _state.update({"base": base, "count": 0, "size": strategy.engine.size})


def _global_seed_set() -> bool:
    import tensorflow as tf
    return tf.compat.v1.get_seed(0)[0] != _DEFAULT_GRAPH_SEED


def next_seed() -> int | None:
    """The next agreed seed, or None (no multi-rank strategy yet, or a global seed is set)."""
    base = _state["base"]
    if base is None or _global_seed_set():
        return None
    _state["count"] += 1
    return int(np.random.SeedSequence([base, _state["count"]]).generate_state(1, np.uint32)[0])


def _dataset_shuffle(original: Callable[..., Any]) -> Callable[..., Any]:
    def shuffle(self: Any, buffer_size: Any, seed: Any = None, reshuffle_each_iteration: Any = True,
                name: Any = None) -> Any:
        if seed is None:
            seed = next_seed()
        return original(self, buffer_size, seed=seed, reshuffle_each_iteration=reshuffle_each_iteration, name=name)
    return shuffle


# While a Keras input pipeline with shuffle=True is built in this thread (context): the agreed shuffle.
_AGREED: contextvars.ContextVar[Callable[..., Any] | None] = contextvars.ContextVar("mpidist_agreed_shuffle",
                                                                                   default=None)


def _agreed_random_shuffle(base_seed: int) -> Callable[..., Any]:
    import tensorflow as tf
    with tf.init_scope():
        counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="mpidist_shuffle_counter")

    def shuffle(value: Any, name: Any = None) -> Any:
        step = counter.assign_add(1)
        return tf.random.experimental.stateless_shuffle(value, seed=tf.stack([tf.constant(base_seed, tf.int64), step]),
                                                        name=name)
    return shuffle


def _random_shuffle(original: Callable[..., Any]) -> Callable[..., Any]:
    """``tf.random.shuffle``: the agreed shuffle while a pipeline is built here (``_agreeing``), unseeded."""
    def shuffle(value: Any, seed: Any = None, name: Any = None) -> Any:
        agreed = _AGREED.get()
        if agreed is None or seed is not None:
            return original(value, seed, name)
        return agreed(value, name)
    return shuffle


@contextlib.contextmanager
def _agreeing(seed: int) -> Iterator[None]:
    """Unseeded ``tf.random.shuffle`` calls in this thread and context draw from ``seed`` until the end."""
    token = _AGREED.set(_agreed_random_shuffle(seed))
    try:
        yield
    finally:
        _AGREED.reset(token)


def _array_get_tf_dataset(original: Callable[..., Any]) -> Callable[..., Any]:
    def get_tf_dataset(self: Any) -> Any:
        seed = next_seed() if patching.get_private(self, "_shuffle") else None
        if seed is None:
            return original(self)
        with _agreeing(seed):  # Keras calls tf.random.shuffle while it builds the pipeline
            return original(self)
    return get_tf_dataset


def _install_random_shuffle(random_module: Any, checked: str) -> None:
    patching.patch_function(random_module, "shuffle", _random_shuffle, checked=checked,
                            reason="fit(shuffle=True): an unseeded shuffle while Keras builds the pipeline agrees")


def install() -> None:
    import tensorflow as tf
    from keras.src.trainers.data_adapters.array_data_adapter import ArrayDataAdapter
    patching.patch(tf.data.Dataset, "shuffle", _dataset_shuffle, checked=patching.TENSORFLOW,
                   reason="an unseeded Dataset.shuffle draws the same order on every rank")
    _install_random_shuffle(tf.random, patching.KERAS3)
    patching.patch(ArrayDataAdapter, "get_tf_dataset", _array_get_tf_dataset, checked=patching.KERAS3,
                   reason="fit(shuffle=True) on arrays draws the same permutation on every rank")


def _keras2_array_init(original: Callable[..., Any]) -> Callable[..., Any]:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        seed = next_seed() if kwargs.get("shuffle") else None
        if seed is None:
            return original(self, *args, **kwargs)
        with _agreeing(seed):  # tf_keras calls its tf.random.shuffle while it builds the pipeline
            return original(self, *args, **kwargs)
    return __init__


def install_keras2() -> None:
    import tensorflow as tf
    patching.patch(tf.data.Dataset, "shuffle", _dataset_shuffle, checked=patching.TENSORFLOW,
                   reason="an unseeded Dataset.shuffle draws the same order on every rank")
    adapter = patching.tf_keras_internal("data_adapter")
    _install_random_shuffle(adapter.tf.random, patching.KERAS2)  # tf_keras's tensorflow.compat.v2
    patching.patch(adapter.TensorLikeDataAdapter, "__init__", _keras2_array_init, checked=patching.KERAS2,
                   reason="fit(shuffle=True) on arrays draws the same permutation on every rank")
