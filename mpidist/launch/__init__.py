"""``mpidist run`` and ``mpidist horovodrun``: people's programs and job scripts, unchanged, on MPI.

This package only re-exports; see run.py (the program launcher inside each rank) and
horovodrun.py (horovodrun's command line as an mpirun/srun command). Nothing here imports
TensorFlow. Documented in docs/launch.md.
"""
from .run import main, resolution

__all__ = ["main", "resolution"]
