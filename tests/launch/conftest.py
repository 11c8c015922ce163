"""Fixtures of the tests that start their own mpirun jobs; the helpers live in launching.py (a name
no other test directory uses, so several test directories can be collected in one run)."""
from launching import mpirun  # noqa: F401  (the fixture)
