"""mpidist: the tf.distribute programming model on MPI. This module only re-exports."""
from ._version import __version__
from ._config import rc
from . import errors
from .collectives import Engine, Op
from .topology import Topology

__all__ = ["__version__", "rc", "errors", "Engine", "Op", "Topology"]
