"""Horovod's gradient compression: ``Compression.none`` and ``Compression.fp16``.

A compressor's ``compress(tensor) -> (tensor, ctx)`` runs before the collective and
``decompress(tensor, ctx)`` after it, exactly as in Horovod.
"""
from __future__ import annotations

from typing import Any

import tensorflow as tf


class Compressor:
    """Interface for compressing and decompressing a tensor."""

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        raise NotImplementedError("Compressor.compress")

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        raise NotImplementedError("Compressor.decompress")


class NoneCompressor(Compressor):
    """Default: no compression."""

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        return tensor, None

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        return tensor


class FP16Compressor(Compressor):
    """Floating tensors travel as float16 and are cast back; other dtypes are untouched."""

    @staticmethod
    def compress(tensor: Any) -> tuple[Any, Any]:
        dtype = tensor.dtype
        if dtype.is_floating and dtype != tf.float16:
            tensor = tf.cast(tensor, tf.float16)
        return tensor, dtype

    @staticmethod
    def decompress(tensor: Any, ctx: Any) -> Any:
        if ctx is not None and ctx.is_floating and tensor.dtype != ctx:
            tensor = tf.cast(tensor, ctx)
        return tensor


class Compression:
    """The compressors Horovod offers."""
    none = NoneCompressor
    fp16 = FP16Compressor
