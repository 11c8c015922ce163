"""Topology layer: communicators from MPI, launcher diagnostics, failure ends the job."""
from . import abort
from .communicators import Topology, validate_comm
from .launchers import Launcher, check_world_size, detect as detect_launcher

__all__ = ["abort", "Topology", "validate_comm", "Launcher", "check_world_size", "detect_launcher"]
