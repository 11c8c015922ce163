"""``Variable.ref()`` for Keras 3 variables, which lack it.

Horovod programs written for ``tf.keras`` 2 key dictionaries by ``var.ref()`` (a
``tf.Variable`` method; Horovod's own tests do, on ``model.trainable_weights``). Keras 3's
TensorFlow-backend Variable has no such method, so :func:`install` gives it one with TensorFlow's
meaning: a hashable reference compared by identity, whose ``deref()`` is the variable. Nothing is
replaced where the method exists. Installed when ``mpidist.horovod.tensorflow`` is imported (with
TensorFlow 2.16+, importing TensorFlow has loaded Keras already) and again at ``hvd.init()``.
"""
from __future__ import annotations

import sys
from typing import Any

_KERAS_TF_VARIABLE = "keras.src.backend.tensorflow.core"


class Reference:
    """A hashable reference to an object, equal only to references to the same object."""

    __slots__ = ("_wrapped",)

    def __init__(self, wrapped: Any) -> None:
        self._wrapped = wrapped

    def deref(self) -> Any:
        return self._wrapped

    def __hash__(self) -> int:
        return id(self._wrapped)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Reference) and other.deref() is self._wrapped

    def __repr__(self) -> str:
        return f"<Reference wrapping {self._wrapped!r}>"


def _ref(self: Any) -> Reference:
    """A hashable reference to this variable (``tf.Variable.ref``'s meaning)."""
    return Reference(self)


def install() -> bool:
    """Give the loaded Keras 3 TensorFlow Variable class ``ref()``; whether it has one now."""
    core = sys.modules.get(_KERAS_TF_VARIABLE)
    cls = getattr(core, "Variable", None)
    if cls is None:
        return False
    if not hasattr(cls, "ref"):
        cls.ref = _ref
    return True
