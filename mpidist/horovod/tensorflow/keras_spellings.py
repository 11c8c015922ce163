"""Three ``tf.keras`` 2 spellings that Horovod programs (and Horovod's own tests) use, given to Keras 3.

- ``var.ref()``: programs written for ``tf.keras`` 2 key dictionaries by it (a ``tf.Variable``
  method; Horovod's tests do, on ``model.trainable_weights``). Keras 3's TensorFlow-backend
  Variable has none, so it gets one with TensorFlow's meaning: a hashable reference compared by
  identity, whose ``deref()`` is the variable.
- ``BatchNormalization(fused=...)``: Keras 2's choice of kernel (a speed hint, same results);
  Keras 3 has one kernel and refuses the argument, so it is accepted and dropped.
- ``session.run(layer.moving_mean)`` in a ``tf.compat.v1`` graph: a v1 Session fetches a
  ``tf.Variable`` (its current value); a Keras 3 variable made in that graph holds one but gave the
  Session nothing to fetch ("Can not convert a Variable into a Tensor or Operation"). It now gives
  its TensorFlow variable's graph element, as ``tf.Variable`` does.

Nothing is replaced where Keras has the name already. Only the installed Keras 3 is touched
(``tf_keras``, under ``TF_USE_LEGACY_KERAS=1``, has both). Installed at ``hvd.init()``, through
the patch registry (``mpidist.tensorflow.patching``), never when ``mpidist.horovod.tensorflow`` is
imported: a program calls ``hvd.init()`` before it builds a model, as Horovod requires (before it,
Keras 3 answers these spellings with its own errors, as under Horovod itself).
"""
from __future__ import annotations

import inspect
import sys
from typing import Any

from ...tensorflow import patching
from ...tensorflow.variables import make_session_fetchable

_KERAS_TF_VARIABLE = "keras.src.backend.tensorflow.core"
_KERAS_BATCH_NORM = "keras.src.layers.normalization.batch_normalization"


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


def _accepting_fused(init: Any) -> Any:
    def __init__(self: Any, *args: Any, fused: Any = None, **kwargs: Any) -> None:
        init(self, *args, **kwargs)  # Keras 3 has one kernel: ``fused`` (Keras 2's speed hint) is dropped
    __init__.__doc__ = init.__doc__
    __init__.accepts_fused = True  # type: ignore[attr-defined]
    return __init__


def install() -> None:
    """Give the loaded Keras 3 classes the three spellings (see the module docstring)."""
    variable = getattr(sys.modules.get(_KERAS_TF_VARIABLE), "Variable", None)
    if variable is not None and not hasattr(variable, "ref"):
        patching.replace(variable, "ref", _ref, checked=patching.KERAS3,
                         reason="Horovod programs key dictionaries by tf.keras 2's var.ref()")
    if variable is not None:
        make_session_fetchable(variable)
    batch_norm = getattr(sys.modules.get(_KERAS_BATCH_NORM), "BatchNormalization", None)
    if batch_norm is not None and "fused" not in _parameters(batch_norm.__init__):
        # replace, not patch: patch's functools.update_wrapper would set __wrapped__, and Keras reads the
        # signature (inspect.signature follows __wrapped__, getfullargspec does not) to build the config
        patching.replace(batch_norm, "__init__", _accepting_fused(batch_norm.__init__), checked=patching.KERAS3,
                         reason="Horovod programs pass tf.keras 2's BatchNormalization(fused=...), a speed hint")


def _parameters(function: Any) -> set[str]:
    if getattr(function, "accepts_fused", False):
        return {"fused"}
    try:
        return set(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return set()
