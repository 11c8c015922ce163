"""A Horovod-era program that needs no TensorFlow: `horovod.run` of a function (as Horovod's examples
call it), `horovod.__version__`, TF_CONFIG. For the launch tests of `mpidist run` and `mpidist
horovodrun` (one node, two Slurm nodes).

Usage: probe.py NUM_PROC [ARGS...]   prints "PROBE {json}" on every rank"""
import json
import os
import socket
import sys

import horovod


def work(x):
    from mpi4py import MPI
    return [x, MPI.COMM_WORLD.Get_rank(), socket.gethostname()]


results = horovod.run(work, args=(7,), num_proc=int(sys.argv[1]))
config = json.loads(os.environ["TF_CONFIG"])
print("PROBE " + json.dumps({"results": results, "version": horovod.__version__, "task": config["task"],
                             "workers": len(config["cluster"]["worker"]), "args": sys.argv[2:],
                             "tensorflow": "tensorflow" in sys.modules, "fusion": os.environ.get(
                                 "HOROVOD_FUSION_THRESHOLD")}), flush=True)
