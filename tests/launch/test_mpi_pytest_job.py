"""tests/mpi_pytest.py, which runs tests/mpi under mpirun: a test that hangs on one rank is named,
with its stack, and the job ends (instead of waiting for the step's time limit to kill it unnamed)."""
from __future__ import annotations

import pathlib

from launching import JOBS

RUNNER = pathlib.Path(JOBS).parents[1] / "mpi_pytest.py"

HANGING = '''
from mpi4py import MPI


def test_fine():
    MPI.COMM_WORLD.Barrier()


def test_hangs_on_the_last_rank():
    comm = MPI.COMM_WORLD
    if comm.Get_rank() == comm.Get_size() - 1:
        comm.recv(source=0, tag=77)  # never sent
'''


def test_a_hung_test_is_named_and_ends_the_job(mpirun, tmp_path):
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_hang.py").write_text(HANGING)
    report = tmp_path / "hang.txt"
    env = {"MPITEST_TEST_TIMEOUT": "5", "MPITEST_DUMP_GRACE": "2", "MPITEST_GRACE": "600",
           "MPITEST_HANG_REPORT": str(report), "MPITEST_LABEL": "hang_demo"}
    job = mpirun(2, str(RUNNER), "-q", "--rootdir", str(tmp_path), str(tests / "test_hang.py"),
                 timeout=240, env=env)  # a hang would be TimeoutExpired: rank 0 waits 600 s
    assert job.returncode != 0, job.output
    name = "tests/test_hang.py::test_hangs_on_the_last_rank"
    expected = f"rank 1: {name} still running after 5 s, at tests/test_hang.py:12 in test_hangs_on_the_last_rank"
    assert expected in job.output
    assert "Thread" in job.output and "test_hang.py\", line 12" in job.output  # every thread's stack
    assert report.read_text() == expected + "\n"  # rank 0 passed both tests: only rank 1 reports
    assert "aborting the job (MPITEST_TEST_TIMEOUT)" in job.output
