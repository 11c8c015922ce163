"""Input layer: datasets distributed by rank, InputContext. Importing it installs the strategies'
input methods (the strategies layer below cannot import this one)."""
from ..strategies import base as _base
from . import api as _api
from .context import InputContext, InputOptions, InputReplicationMode
from .distributed import ArraySpec, DistributedDataset, DistributedIterator, Optional, OutOfRangeError
from .numpy_dataset import BatchedNumpyDataset, NumpyDataset

_base.register_input_layer(_api)

__all__ = ["InputContext", "InputOptions", "InputReplicationMode", "ArraySpec", "DistributedDataset",
           "DistributedIterator", "Optional", "OutOfRangeError", "BatchedNumpyDataset", "NumpyDataset"]
