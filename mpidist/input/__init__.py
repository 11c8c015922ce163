"""Input layer: datasets distributed by rank, InputContext, and the functions behind the strategies'
dataset methods (api.py, which the strategies layer above calls)."""
from . import api
from .context import InputContext, InputOptions, InputReplicationMode
from .distributed import ArraySpec, DistributedDataset, DistributedIterator, Optional, OutOfRangeError
from .numpy_dataset import BatchedNumpyDataset, NumpyDataset

__all__ = ["api", "InputContext", "InputOptions", "InputReplicationMode", "ArraySpec", "DistributedDataset",
           "DistributedIterator", "Optional", "OutOfRangeError", "BatchedNumpyDataset", "NumpyDataset"]
