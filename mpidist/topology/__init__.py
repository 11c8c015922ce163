"""Topology layer: communicators from MPI, launcher diagnostics."""
from .communicators import Topology, validate_comm
from .launchers import Launcher, check_world_size, detect as detect_launcher

__all__ = ["Topology", "validate_comm", "Launcher", "check_world_size", "detect_launcher"]
