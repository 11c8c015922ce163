"""Which Keras a program uses: Keras 3, or Keras 2 through ``tf_keras``.

TensorFlow >= 2.16 gives Keras 3 as ``tf.keras``. With the ``tf_keras`` package installed (the
version matching TensorFlow's) and ``TF_USE_LEGACY_KERAS=1`` set before TensorFlow is imported,
``tf.keras`` is Keras 2 instead: the usual way programs written for Keras 2 (and Horovod users,
horovod#4290) keep running on current TensorFlow. mpidist answers the question the way those
programs do:

- ``user_keras()`` is ``tf.keras`` (what ``from tensorflow import keras`` gives): the Keras whose
  callbacks and models a Horovod-style program uses;
- objects are classified by their class: an optimizer of ``tf_keras`` is a Keras 2 optimizer even
  when ``tf.keras`` is Keras 3 (a program that imports ``tf_keras`` itself).

Nothing here imports TensorFlow or Keras at import time.
"""
from __future__ import annotations

import sys
from typing import Any


def user_keras() -> Any:
    """``tf.keras``: tf_keras (Keras 2) under ``TF_USE_LEGACY_KERAS=1``, else Keras 3 (imports TensorFlow)."""
    import tensorflow as tf
    return tf.keras


def major_version(module: Any) -> int:
    """The major version of a Keras API module (``tf.keras``, ``keras``, ``tf_keras``), e.g. 2 or 3."""
    version = getattr(module, "__version__", None)
    if not version:  # tf.keras under TF_USE_LEGACY_KERAS is tf_keras.api._v2.keras: ask its package
        version = getattr(sys.modules.get(module.__name__.split(".")[0]), "__version__", "0")
    return int(str(version).split(".")[0])


def is_keras2() -> bool:
    """Whether ``tf.keras`` is Keras 2 (tf_keras with ``TF_USE_LEGACY_KERAS=1``); False when ``tf.keras``
    cannot be imported (TF_USE_LEGACY_KERAS=1 without tf_keras installed)."""
    try:
        return major_version(user_keras()) == 2
    except ImportError:
        return False


def is_keras2_model(obj: Any) -> bool:
    """Whether ``obj`` is a tf_keras (Keras 2) ``Model``; False when tf_keras was never imported."""
    tf_keras = sys.modules.get("tf_keras")
    model = getattr(tf_keras, "Model", None) if tf_keras is not None else None
    return isinstance(model, type) and isinstance(obj, model)


def _tf_keras_optimizer_bases() -> tuple[type, ...]:
    """tf_keras's optimizer base classes (the one of TF >= 2.11, then the legacy OptimizerV2), or ()
    when the program has not imported tf_keras (then no object can be a Keras 2 optimizer)."""
    module = sys.modules.get("tf_keras")
    if module is None:
        return ()
    return module.optimizers.Optimizer, module.optimizers.legacy.Optimizer


def keras2_optimizer_kind(optimizer: Any) -> str | None:
    """"legacy" for a ``tf.keras.optimizers.legacy`` optimizer (OptimizerV2), "current" for the other
    Keras 2 optimizers (``tf.keras.optimizers.*`` of tf_keras), None for anything else."""
    bases = _tf_keras_optimizer_bases()
    if not bases:
        return None
    if isinstance(optimizer, bases[1]):
        return "legacy"
    return "current" if isinstance(optimizer, bases[0]) else None


def is_keras3_optimizer(optimizer: Any) -> bool:
    try:
        import keras
    except ImportError:  # pragma: no cover - Keras 3 comes with TensorFlow 2.16+
        return False
    return major_version(keras) >= 3 and isinstance(optimizer, keras.optimizers.Optimizer)


def optimizer_variables(optimizer: Any) -> list[Any]:
    """An optimizer's variables: a property in Keras 3 and tf_keras's optimizers, a method in the
    legacy Keras 2 ones."""
    variables = optimizer.variables
    return list(variables() if callable(variables) and not isinstance(variables, (list, tuple)) else variables)


def is_sgd(optimizer: Any) -> bool:
    """A Keras 3 ``SGD`` or tf_keras's current ``SGD`` (whose velocity slots are ``momentums``)."""
    classes = []
    try:
        import keras
        classes.append(keras.optimizers.SGD)
    except ImportError:  # pragma: no cover
        pass
    if "tf_keras" in sys.modules:
        classes.append(sys.modules["tf_keras"].optimizers.SGD)
    return isinstance(optimizer, tuple(classes))
