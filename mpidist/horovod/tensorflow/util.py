"""Horovod's ``horovod.tensorflow.util`` names that programs and Horovod's tests use.

A compatibility module named as Horovod names it (``hvd.util._executing_eagerly()``), not a
grab-bag: it holds only those names.
"""
from __future__ import annotations

import tensorflow as tf


def executing_eagerly() -> bool:
    """Whether TensorFlow executes eagerly here (Horovod's ``_executing_eagerly``)."""
    return tf.executing_eagerly()


_executing_eagerly = executing_eagerly  # Horovod's name

__all__ = ["_executing_eagerly", "executing_eagerly"]
