"""Synthetic MNIST-shaped data and the small convolutional model of the Horovod-style MNIST jobs
(hvd_keras_mnist.py, hvd_tf2_mnist.py) and of their single-process reference (hvd_mnist_reference.py).

No download: 28x28 images drawn from a fixed seed, labels from a fixed linear rule so that the
model has something to learn. ``data`` is the same on every rank; each job shards it by rank
(``dataset.shard(size, rank)``), so step k of rank r holds rows k*G + r, k*G + r + size, ... of the
global batch k (G = per-rank batch * size): together the ranks see exactly the global batch a
single process sees.
"""
from __future__ import annotations

import numpy as np

ROWS = 512  # a multiple of every global batch used (16 rows per rank x 1, 2, 4 ranks)
BATCH = 16  # rows per rank and step
KERAS_STEPS, KERAS_EPOCHS, WARMUP_EPOCHS = 16, 3, 2  # hvd_keras_mnist.py: global steps per epoch, ...
TF2_STEPS = 24  # hvd_tf2_mnist.py: global steps


def data(rows: int = ROWS) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(2024)
    images = rng.random((rows, 28, 28, 1), dtype=np.float32)
    weights = rng.normal(size=(28 * 28, 10)).astype(np.float32)
    labels = np.argmax(images.reshape(rows, -1) @ weights, axis=1).astype(np.int64)
    return images, labels


def model(keras):
    """Horovod's example model, smaller and without its Dropout layers (their random masks differ
    between ranks and one process, so no run could equal another)."""
    keras.utils.set_random_seed(7)  # the same initial weights in every process: built right away
    net = keras.Sequential([
        keras.layers.Conv2D(4, [3, 3], activation="relu"),
        keras.layers.MaxPooling2D(pool_size=(2, 2)),
        keras.layers.Flatten(),
        keras.layers.Dense(16, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ])
    net.build((None, 28, 28, 1))
    return net


def checksum(weights) -> str:
    """A short digest of a list of arrays (equal on every rank means bitwise-equal weights)."""
    import hashlib
    digest = hashlib.sha256()
    for w in weights:
        digest.update(np.ascontiguousarray(np.asarray(w)).tobytes())
    return digest.hexdigest()[:16]
