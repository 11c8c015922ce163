"""``python -m mpidist info``: what mpidist sees, in one table from the chief.

Run it the way the job runs (``mpirun -n 4 python -m mpidist info``, ``srun --mpi=pmix python -m
mpidist info``): MPI library and thread level, the launcher, CUDA-aware MPI, NCCL/CuPy and
TensorFlow availability (TensorFlow is not imported), whether ULFM is active (mpidist.elastic),
settings, which algorithm each allreduce size band gets and the predicted costs behind ``auto``'s
choice (collectives/algorithms/choice.py), and the topology: hosts, nodes and local ranks of every rank.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import platform
from typing import Any

from mpi4py import MPI

from . import __version__
from ._config import rc
from .collectives.algorithms import auto_reason, choice
from .elastic import ulfm
from .topology import Topology, detect_launcher, mpi_library


def _version(*dists: str) -> str | None:
    for dist in dists:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _cupy_nccl() -> dict[str, Any]:
    if importlib.util.find_spec("cupy") is None:
        return {"cupy": None, "nccl": None, "gpus": 0}
    try:
        import cupy
        gpus = cupy.cuda.runtime.getDeviceCount() if cupy.cuda.is_available() else 0
        try:
            from cupy.cuda import nccl
            nccl_version = nccl.get_version()
        except Exception:  # cupy without NCCL
            nccl_version = None
        return {"cupy": cupy.__version__, "nccl": nccl_version, "gpus": gpus}
    except Exception as err:  # broken CUDA install: say so, do not fail
        return {"cupy": f"error: {err}", "nccl": None, "gpus": 0}


def _algorithm_bands(topo: Topology) -> dict[str, Any]:
    """What allreduce ``algorithm`` each size band gets on this job, and why (predicted seconds)."""
    shape = choice.shape_of(topo, rc.nics_per_node)
    rows = choice.bands(shape, rc.hierarchical_threshold, rc.check_agreement)
    if rc.algorithm != "auto":
        return {"setting": rc.algorithm, "reason": f"rc.algorithm={rc.algorithm}",
                "bands": [(n, rc.algorithm, f, h) for n, _, f, h in rows]}
    return {"setting": "auto", "reason": auto_reason(topo), "links": choice.LINKS.description,
            "bands": rows, "costed": shape.hierarchy_possible}


def _time(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.3g} µs"


def _format_bands(algorithm: dict[str, Any]) -> list[str]:
    lines = [f"algorithm     {algorithm['setting']}: {algorithm['reason']}"]
    if algorithm["setting"] == "auto" and not algorithm.get("costed"):
        return lines
    if "links" in algorithm:
        lines.append(f"              predicted with default links ({algorithm['links']})")
    lines.append(f"  {'bytes':>9}  {'gets':<13} {'flat':>10} {'hierarchical':>13}")
    for n, name, flat, hier in algorithm["bands"]:
        costs = f"{_time(flat):>10} {_time(hier):>13}" if (flat or hier) else ""
        lines.append(f"  {choice.size_text(n):>9}  {name:<13} {costs}")
    return lines


def collect(comm: MPI.Intracomm | None = None) -> dict[str, Any]:
    """Everything ``info`` prints (collective over ``comm``); complete on rank 0."""
    topo = Topology(comm)
    launcher = detect_launcher()
    mine = {"rank": topo.rank, "host": topo.processor_name, "node": topo.node_index,
            "local_rank": topo.local_rank, "local_size": topo.local_size, "pid": os.getpid(),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    ranks = topo.comm.gather(mine, root=0)
    report = {
        "mpidist": __version__, "python": platform.python_version(), "numpy": _version("numpy"),
        "mpi4py": _version("mpi4py"), "mpi": mpi_library.describe(),
        "launcher": {"name": launcher.name, "tasks": launcher.tasks, "detail": launcher.detail},
        "world_size": MPI.COMM_WORLD.Get_size(), "num_nodes": topo.num_nodes, "faked_nodes": topo.faked_nodes,
        "tensorflow": _version("tensorflow", "tensorflow-cpu"), "keras": _version("keras"),
        **_cupy_nccl(), "ulfm": dict(zip(("active", "detail"), ulfm.status())), "settings": rc.as_dict(),
        "ranks": ranks, "algorithm": _algorithm_bands(topo),
    }
    topo.free()
    return report


def format_report(report: dict[str, Any]) -> str:
    mpi = report["mpi"]
    aware = {True: "yes", False: "no", None: "unknown"}[mpi["cuda_aware"]]
    launcher = report["launcher"]
    detail = ", " + launcher["detail"] if launcher["detail"] else ""
    faked = " (faked by MPIDIST_LOCAL_SIZE)" if report["faked_nodes"] else ""
    lines = [
        f"mpidist {report['mpidist']}  (Python {report['python']}, NumPy {report['numpy']}, mpi4py {report['mpi4py']})",
        f"MPI           {mpi['library']}",
        f"              standard {mpi['standard']}, thread level {mpi['thread_level']}, {mpi['library_path']}",
        f"launcher      {launcher['name']} ({launcher['tasks']} tasks{detail}); "
        f"MPI world size {report['world_size']}",
        f"CUDA-aware    {aware} ({mpi['cuda_aware_source']})",
        f"CuPy / NCCL   {report['cupy'] or 'not installed'} / {report['nccl'] or 'not available'}; "
        f"GPUs visible: {report['gpus']}",
        f"TensorFlow    {report['tensorflow'] or 'not installed'} (Keras {report['keras'] or '-'}; "
        "not imported by info)",
        f"ULFM          {'yes' if report['ulfm']['active'] else 'no'}: {report['ulfm']['detail']} "
        f"(mpidist.elastic {'survives' if report['ulfm']['active'] else 'cannot survive'} the death of ranks)",
        "settings      " + ", ".join(f"{k}={v}" for k, v in report["settings"].items()),
        *_format_bands(report["algorithm"]),
        f"topology      {report['num_nodes']} node(s){faked}",
        f"  {'rank':>5} {'node':>5} {'local':>6}  {'host':<24} {'pid':>8}  CUDA_VISIBLE_DEVICES",
    ]
    for r in report["ranks"]:
        lines.append(f"  {r['rank']:>5} {r['node']:>5} {str(r['local_rank']) + '/' + str(r['local_size']):>6}  "
                     f"{r['host']:<24} {r['pid']:>8}  {r['cuda_visible_devices'] or '-'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mpidist info", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    report = collect()
    if MPI.COMM_WORLD.Get_rank() == 0:
        print(json.dumps(report, indent=1, default=str) if args.json else format_report(report), flush=True)
    return 0
