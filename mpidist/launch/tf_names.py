"""``tf.distribute``'s strategy names under ``mpidist run``: they build mpidist's strategies.

When the program imports TensorFlow (never before: see post_import.py), TensorFlow's public API
modules get mpidist's classes under TensorFlow's names::

    tf.distribute.MultiWorkerMirroredStrategy                -> mpidist.MultiWorkerMirroredStrategy
    tf.distribute.MirroredStrategy                           -> mpidist.MirroredStrategy
    tf.distribute.OneDeviceStrategy                          -> mpidist.OneDeviceStrategy
    tf.distribute.experimental.MultiWorkerMirroredStrategy   -> mpidist.experimental.MultiWorkerMirroredStrategy
    tf.distribute.experimental.CentralStorageStrategy        -> mpidist.experimental.CentralStorageStrategy

(and the same in ``tf.compat.v2.distribute``). mpidist's classes take TensorFlow's constructor
arguments (old spellings included: ``communication=``, ``cluster_resolver=``), build mpidist's
genuine ``tf.distribute.Strategy``, and ``isinstance(s, tf.distribute.MultiWorkerMirroredStrategy)``
holds for what they build. Only TensorFlow's public API modules (``tensorflow._api...``) change:
TensorFlow's own code, which imports its classes from where they are defined, keeps them.
The replacements go through the patch registry (``mpidist.tensorflow.patching.replace``), so
``patching.installed()`` lists them.
"""
from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

__all__ = ["NAMES", "install", "resolved"]

# (API module path under tf, attribute) -> mpidist's public name
NAMES: dict[tuple[str, str], str] = {
    ("distribute", "MultiWorkerMirroredStrategy"): "mpidist.MultiWorkerMirroredStrategy",
    ("distribute", "MirroredStrategy"): "mpidist.MirroredStrategy",
    ("distribute", "OneDeviceStrategy"): "mpidist.OneDeviceStrategy",
    ("distribute.experimental", "MultiWorkerMirroredStrategy"): "mpidist.experimental.MultiWorkerMirroredStrategy",
    ("distribute.experimental", "CentralStorageStrategy"): "mpidist.experimental.CentralStorageStrategy",
}


def _ours(public_name: str) -> Any:
    import mpidist
    owner: Any = mpidist
    for part in public_name.split(".")[1:]:
        owner = getattr(owner, part)
    return owner


def _api_module(tf: ModuleType, path: str) -> Any:
    owner: Any = tf
    for part in path.split("."):
        owner = getattr(owner, part)
    return owner


def install(tf: ModuleType) -> list[str]:
    """Put mpidist's classes in TensorFlow's API modules (``tf``: the imported ``tensorflow``);
    returns ``tf.<path>.<name>`` of each name replaced."""
    from ..tensorflow import patching
    done = []
    for (path, name), public in NAMES.items():
        theirs = _api_module(tf, path).__dict__.get(name)
        ours = _ours(public)
        if theirs is None or theirs is ours:
            continue
        for module in list(sys.modules.values()):  # tf.distribute and every copy (tf.compat.v2.distribute)
            if (getattr(module, "__name__", "").startswith("tensorflow._api.")
                    and getattr(module, "__dict__", {}).get(name) is theirs):
                patching.replace(module, name, ours, checked=patching.TENSORFLOW,
                                 reason="`mpidist run`: the program's tf.distribute strategies are mpidist's")
        done.append(f"tf.{path}.{name}")
    return done


def resolved() -> list[str]:
    """One line per name: ``tf.distribute.X -> mpidist.X`` (for ``mpidist check`` and the start line)."""
    return [f"tf.{path}.{name} -> {public}" for (path, name), public in NAMES.items()]
