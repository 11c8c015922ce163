"""Tests of the slurm/ templates on a real single-node Slurm (a package, so its conftest and
cluster modules never shadow those of other test directories)."""
