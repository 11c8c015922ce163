"""The agreement's state machine (collectives/agreement.py) against a scripted communicator: which
outcome each rank takes from an exchange, when it drains, and what it remembers.

The communicator here plays "the other ranks": it answers every exchange with the MIN of this
rank's triple and the triples it is given, and records every MPI call, so a test can check that a
rank which did not speculate replays exactly the speculated calls before the report.
"""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from mpidist.collectives.agreement import Agreement
from mpidist.errors import CollectiveMismatchError


class _Done:
    def Wait(self) -> None:
        pass

    def Test(self) -> bool:
        return True


class ScriptedComm:
    """Exchanges reduce this rank's triple with ``others`` (one triple per other rank)."""

    def __init__(self) -> None:
        self.others: list[list[int]] = []
        self.calls: list[tuple] = []

    def Iallreduce(self, send, recv, op) -> _Done:
        if send.dtype == np.int64 and send.size == 3:  # the agreement exchange
            recv[...] = np.min(np.array([send.tolist()] + self.others, dtype=np.int64), axis=0)
            self.calls.append(("exchange",))
        else:
            self.calls.append(("Iallreduce", send.dtype, send.size, op))
        return _Done()

    def Allreduce(self, send, recv, op) -> None:
        self.calls.append(("Allreduce", send.dtype, send.size, op))

    def allgather(self, text):
        self.calls.append(("allgather",))
        return [text, "another collective"]


RECIPE = ((np.dtype(np.float32), 1000, MPI.SUM, False), (np.dtype(np.float64), 10, MPI.SUM, True))


def make(last=None):
    comm = ScriptedComm()
    agreed = Agreement(comm, describe=lambda key: f"described {key}")  # type: ignore[arg-type]
    agreed.last = last
    return comm, agreed


def triple(h: int, speculated: bool) -> list[int]:
    return [h, -h, -int(speculated)]


def test_agreed_exchange_remembers_the_signature_and_its_recipe():
    comm, agreed = make()
    agreed.check(7, None, ("k",), "allreduce", RECIPE)
    assert agreed.last == (7, RECIPE) and agreed.speculates(7) and not agreed.speculates(8)


def test_a_recipe_given_as_a_function_is_built_only_after_the_check():
    comm, agreed = make()
    comm.others = [triple(9, False)]
    built = []
    with pytest.raises(CollectiveMismatchError):
        agreed.check(7, None, ("k",), "allreduce", lambda: built.append(1) or RECIPE)
    assert built == [] and agreed.last is None


def test_no_speculation_without_a_recipe():
    comm, agreed = make(last=(7, None))
    assert not agreed.speculates(7)


def test_a_rank_that_did_not_speculate_drains_the_speculated_calls_then_reports():
    comm, agreed = make(last=(7, RECIPE))
    comm.others = [triple(7, True)]  # the other rank repeated signature 7 and moved its data already
    with pytest.raises(CollectiveMismatchError, match="ranks issued different collectives"):
        agreed.check(8, None, ("k",), "allreduce", None)
    assert comm.calls == [("exchange",), ("Allreduce", np.dtype(np.float32), 1000, MPI.SUM),
                          ("Iallreduce", np.dtype(np.float64), 10, MPI.SUM), ("allgather",)]
    assert agreed.last is None  # and nobody speculates on the next call


def test_no_drain_when_nobody_speculated():
    comm, agreed = make(last=(7, RECIPE))
    comm.others = [triple(9, False)]
    with pytest.raises(CollectiveMismatchError):
        agreed.check(8, None, ("k",), "allreduce", None)
    assert comm.calls == [("exchange",), ("allgather",)]


def test_a_speculating_rank_reports_without_draining():
    comm, agreed = make(last=(7, RECIPE))
    comm.others = [triple(8, False)]
    ran = []
    with pytest.raises(CollectiveMismatchError):
        agreed.bind(7, ("k",), "allreduce", RECIPE, lambda x: ran.append("data") or "result")(None)
    assert ran == ["data"]  # the data moved, but its result never came back
    assert comm.calls == [("exchange",), ("allgather",)] and agreed.last is None


def test_speculation_returns_the_result_once_everyone_agreed():
    comm, agreed = make(last=(7, RECIPE))
    comm.others = [triple(7, True)]
    assert agreed.bind(7, ("k",), "allreduce", RECIPE, lambda x: "result")(None) == "result"
    assert agreed.last == (7, RECIPE)


def test_a_drain_without_the_recipe_is_a_clear_error_not_a_hang():
    comm, agreed = make(last=(7, None))  # cannot happen while `last` is equal on every rank
    comm.others = [triple(7, True)]
    with pytest.raises(CollectiveMismatchError, match="cannot be recovered"):
        agreed.check(8, None, ("k",), "allreduce", None)
