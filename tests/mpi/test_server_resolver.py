"""MPIClusterResolver's roles by rank and the job end mpidist.Server.join() waits for.

Expectations are computed from rank and size at run time; runs at any -n. (The full
ParameterServerStrategy job is tests/launch/test_server_jobs.py.)
"""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest

tf = pytest.importorskip("tensorflow")

import mpidist  # noqa: E402
from mpidist.cluster_resolver import MPIClusterResolver  # noqa: E402

pytestmark = pytest.mark.mpi


def expected_roles(ps: int, size: int) -> list[str]:
    return ["ps"] * ps + ["chief"] + ["worker"] * (size - ps - 1)


def test_default_is_every_rank_a_worker(comm):
    resolver = MPIClusterResolver(comm, host="127.0.0.1")
    rank, size = comm.Get_rank(), comm.Get_size()
    assert (resolver.task_type, resolver.task_id) == ("worker", rank)
    assert not resolver.has_roles and not resolver.serving
    workers = resolver.cluster_spec().as_dict()["worker"]
    assert len(workers) == size and all(a.startswith("127.0.0.1:") for a in workers)
    assert len(set(workers)) == size  # one port each
    assert resolver.master() == f"grpc://{workers[rank]}"
    assert resolver.tf_config() == {"cluster": {"worker": workers}, "task": {"type": "worker", "index": rank}}
    with pytest.raises(RuntimeError, match="MPIClusterResolver.shutdown: only a resolver with roles"):
        resolver.shutdown()


@pytest.mark.parametrize("ps", [0, 1, 2])
def test_ps_roles_by_rank(comm, ps):
    rank, size = comm.Get_rank(), comm.Get_size()
    if ps >= size:
        with pytest.raises(ValueError, match=r"MPIClusterResolver: `ps` must be an int in \[0, "):
            MPIClusterResolver(comm, ps=ps, host="127.0.0.1")
        return
    roles = expected_roles(ps, size) if ps else ["chief"] + ["worker"] * (size - 1)
    resolver = MPIClusterResolver(comm, **({"ps": ps} if ps else {"roles": roles}), host="127.0.0.1")
    addresses = comm.allgather(resolver.master())
    assert resolver.task_type == roles[rank]
    assert resolver.task_id == roles[:rank].count(roles[rank])
    assert resolver.serving == (roles[rank] in ("ps", "worker")) and resolver.has_roles
    spec = resolver.cluster_spec().as_dict()
    for job in set(roles):
        ranks = [r for r, t in enumerate(roles) if t == job]
        assert spec[job] == [addresses[r][len("grpc://"):] for r in ranks]
        assert [resolver.rank_of(job, i) for i in range(len(ranks))] == ranks
    assert resolver.tf_config()["task"] == {"type": roles[rank], "index": resolver.task_id}
    resolver.shutdown()  # every rank enters the job end once: returns on every rank
    resolver.shutdown()  # a second call only waits (already complete)


def test_role_errors(comm):
    size = comm.Get_size()
    with pytest.raises(ValueError, match="MPIClusterResolver: `roles` must list one task type per rank"):
        MPIClusterResolver(comm, roles=["chief"] * (size + 1))
    with pytest.raises(ValueError, match="MPIClusterResolver: `roles` must be task types from"):
        MPIClusterResolver(comm, roles=["boss"] * size)
    with pytest.raises(ValueError, match="MPIClusterResolver: give `ps` or `roles`, not both"):
        MPIClusterResolver(comm, ps=1, roles=["chief"] * size)
    if size > 1:
        with pytest.raises(ValueError, match="MPIClusterResolver: `roles` names 2 chiefs"):
            MPIClusterResolver(comm, roles=["chief", "chief"] + ["worker"] * (size - 2))
    bad_host = "192.0.2.1" if comm.Get_rank() == size - 1 else "127.0.0.1"  # TEST-NET: not this machine's
    with pytest.raises(OSError, match=f"MPIClusterResolver: no free TCP port on `host` .* \\(rank {size - 1}: "):
        MPIClusterResolver(comm, host=bad_host)  # the error on every rank, not a hang in the exchange
    with pytest.raises(ValueError, match="MPIClusterResolver.master: `task_type` must be one of"):
        MPIClusterResolver(comm, host="127.0.0.1").master("ps")
    if size > 1:  # one fixed port for every rank of one host: an error on every rank, naming two ranks
        with pytest.raises(ValueError, match=r"MPIClusterResolver: ranks 0 and 1 both serve at 127\.0\.0\.1:"):
            MPIClusterResolver(comm, host="127.0.0.1", port=45678)


def test_free_ports_are_distinct_on_one_host(comm):
    """Each rank's port is held until every rank has chosen, so ranks on one host never get the
    same one (a CI run once saw ranks 0 and 1 both handed a port the first had just released)."""
    for _ in range(20):
        workers = MPIClusterResolver(comm, host="127.0.0.1").cluster_spec().as_dict()["worker"]
        assert len(set(workers)) == comm.Get_size(), workers


def test_server_from_resolver_and_join(comm):
    """A serving rank's Server(resolver) is TF's Server for its task; join() returns once every
    rank (the non-serving ones through shutdown()) has reached the job end."""
    rank, size = comm.Get_rank(), comm.Get_size()
    ps = 1 if size > 1 else 0
    resolver = MPIClusterResolver(comm, ps=ps, host="127.0.0.1") if ps else \
        MPIClusterResolver(comm, roles=["worker"], host="127.0.0.1")
    if resolver.serving:
        server = mpidist.Server(resolver, start=False)
        assert isinstance(server, tf.distribute.Server)
        assert server.server_def.job_name == resolver.task_type
        assert server.server_def.task_index == resolver.task_id
        assert server.cluster_resolver is resolver
        server.join()
    else:
        resolver.shutdown()


def test_server_join_needs_a_resolver_with_roles(comm):
    plain = MPIClusterResolver(comm, host="127.0.0.1")
    server = mpidist.Server(plain.cluster_spec(), job_name="worker", task_index=comm.Get_rank(), start=False)
    with pytest.raises(RuntimeError, match="Server.join: the job's end comes from an MPIClusterResolver with roles"):
        server.join()
    with pytest.raises(TypeError, match="Server: `cluster_resolver` must be an mpidist MPIClusterResolver"):
        mpidist.Server(plain.cluster_spec(), job_name="worker", task_index=0, start=False, cluster_resolver=object())
