"""``TF_CONFIG`` under ``mpidist run``: written from MPI, because programs read it themselves.

TensorFlow's multi-worker tutorials size their global batch from ``json.loads(os.environ
["TF_CONFIG"])["cluster"]["worker"]``. ``mpidist run`` exports a TF_CONFIG equal to the cluster MPI
describes: one "worker" task per rank of COMM_WORLD, ``task.index`` = the rank, each address the
rank's host and a free port (``MPIClusterResolver.tf_config()``; nothing listens there unless the
program starts a server).

A TF_CONFIG the user set is read first. When it describes the same cluster shape (as many
chief + worker tasks as ranks, and this rank's task at this rank's place: a "chief" first, then the
workers in order, as TensorFlow numbers them), it stays. Otherwise it is replaced and the chief
logs one warning naming each difference (and each rank whose task differed).
"""
from __future__ import annotations

import json
import logging
import os
from typing import Any

from ..cluster_resolver import MPIClusterResolver, place_in_cluster

__all__ = ["differences", "export"]

_log = logging.getLogger("mpidist")
VARIABLE = "TF_CONFIG"


def differences(text: str, rank: int, size: int) -> list[str]:
    """What in the TF_CONFIG ``text`` disagrees with an MPI job of ``size`` ranks seen from ``rank``
    (empty: it agrees)."""
    try:
        config = json.loads(text)
        cluster = config.get("cluster", {}) if isinstance(config, dict) else None
        task = config.get("task", {}) if isinstance(config, dict) else None
        if not isinstance(cluster, dict) or not isinstance(task, dict):
            raise ValueError("`cluster` and `task` must be objects")
    except ValueError as error:
        return [f"it is not a TF_CONFIG ({error})"]
    found = []
    tasks = len(cluster.get("chief", [])) + len(cluster.get("worker", []))
    if tasks != size:
        found.append(f"it lists {tasks} chief/worker task(s), MPI has {size} rank(s)")
    others = sorted(set(cluster) - {"chief", "worker"})
    if others:
        found.append(f"it has job(s) {', '.join(others)}, which a MultiWorkerMirroredStrategy job does not")
    task_type, task_id = task.get("type"), task.get("index", 0)
    place = place_in_cluster(cluster, task_type, task_id)
    if place != rank:
        found.append(f"rank {rank} is task {task_type}:{task_id} there (replica {place}), not replica {rank}")
    return found


def export(comm: Any) -> dict[str, Any]:
    """Make ``os.environ["TF_CONFIG"]`` describe ``comm``'s ranks (collective over ``comm``); returns
    the TF_CONFIG now in force, parsed."""
    rank, size = comm.Get_rank(), comm.Get_size()
    given = os.environ.get(VARIABLE)
    mine = differences(given, rank, size) if given is not None else []
    everyone = comm.allgather(mine)
    if given is not None and not any(everyone):
        return json.loads(given)  # the user's own agrees with MPI: theirs stays
    config = MPIClusterResolver(comm).tf_config()
    os.environ[VARIABLE] = json.dumps(config)
    if given is not None and rank == 0:
        named = sorted({d for found in everyone for d in found})
        if len(named) > 4:
            named = named[:4] + [f"and {len(named) - 4} more"]
        _log.warning("mpidist run: the TF_CONFIG that was set disagrees with MPI (%s); replaced by one worker "
                     "per rank, task index = rank", "; ".join(named))
    return config
