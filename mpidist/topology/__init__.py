"""Topology layer: communicators from MPI, launcher diagnostics, failure ends the job."""
from . import abort, mpi_library
from .communicators import Topology, validate_comm
from .launchers import Launcher, check_world_size
from .launchers import detect as detect_launcher

__all__ = ["abort", "mpi_library", "Topology", "validate_comm", "Launcher", "check_world_size", "detect_launcher"]
