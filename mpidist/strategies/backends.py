"""Framework backends: with TensorFlow loaded, strategies are genuine tf.distribute.Strategy objects.

The TensorFlow integration lives in the top layer (``mpidist.tensorflow``), which lower layers must
not import by name. It is loaded here as a plugin, by module path, only when the program has
already imported TensorFlow (or ``rc.framework`` says "tensorflow"); with it, ``mpidist.keras``
(the Keras fidelity patches, top layer) is installed on each strategy built.
"""
from __future__ import annotations

import importlib
import sys
from typing import Any

from .._config import rc

TF_PLUGIN = "mpidist.tensorflow"
KERAS_PLUGIN = "mpidist.keras"  # Keras / tf.train.Checkpoint fidelity, installed on every TF strategy


def tensorflow_loaded() -> bool:
    """Whether strategies are built on TensorFlow: ``rc.framework``, "auto" = TF already imported."""
    if rc.framework == "auto":
        return "tensorflow" in sys.modules
    if rc.framework == "tensorflow":
        importlib.import_module("tensorflow")
        return True
    return False


def make_tf_strategy(kind: str, engine: Any, options: Any, **extra: Any) -> Any:
    """Build the TensorFlow strategy of ``kind`` (see mpidist.tensorflow.make_strategy)."""
    plugin = importlib.import_module(TF_PLUGIN)
    strategy = plugin.make_strategy(kind, engine, options, **extra)
    importlib.import_module(KERAS_PLUGIN).install(strategy)  # collective: the ranks agree on shuffle seeds
    return strategy
