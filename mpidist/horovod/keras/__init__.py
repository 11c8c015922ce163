"""``mpidist.horovod.keras``: the same module as ``mpidist.horovod.tensorflow.keras`` (Horovod's alias)."""
import sys

from ..tensorflow import keras as _keras

sys.modules[__name__] = _keras
