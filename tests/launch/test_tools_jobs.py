"""tools/tf_sweep.py under a real mpirun (a smoke run: no timing is asserted): it starts TensorFlow's
own MultiWorkerMirroredStrategy (TF_CONFIG, a gRPC server in the process), so a job of its own. The
tools are not installed with the package: they run from the repository root, which goes on PYTHONPATH.
(The other tools' smoke runs call their ``main(argv)`` on every rank of the MPI test job:
tests/mpi/test_tools.py.)"""
from __future__ import annotations

import json
import os
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
ENV = {"PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}


def test_tf_sweep_smoke(mpirun, tmp_path):
    """raw MPI vs mpidist vs TensorFlow's own MWMS (cluster from MPI, no TF_CONFIG by hand) at one size."""
    png = tmp_path / "tf.png"
    job = mpirun(2, "-m", "tools.tf_sweep", "--min", "4KB", "--max", "4KB", "--seconds", "0.05",
                 "--json", "--plot", str(png), env=ENV)
    assert job.returncode == 0, job.output
    rows = json.JSONDecoder().raw_decode(job.output[job.output.index("["):])[0]  # stdout first, then TF's log
    assert [r["bytes"] for r in rows] == [4096]
    assert all(rows[0][k] > 0 for k in ("raw MPI", "mpidist", "TF MWMS"))
    assert png.stat().st_size > 1000
