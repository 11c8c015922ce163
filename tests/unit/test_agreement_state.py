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

from mpidist.collectives.agreement import FAILED, STANDING, Agreement, Failed, Standing
from mpidist.errors import CollectiveFailedError, CollectiveMismatchError, StandingByError


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


# -- a rank whose call failed before its exchange (Agreement.fail) -------------------------------------

class _Peers(ScriptedComm):
    """The description exchange answers with ``gathered`` for the other rank."""

    def __init__(self, gathered) -> None:
        super().__init__()
        self.gathered = gathered

    def allgather(self, mine):
        self.calls.append(("allgather", mine))
        return [mine, self.gathered]


def make_peers(gathered, last=None):
    comm = _Peers(gathered)
    agreed = Agreement(comm, describe=lambda key: f"described {key}")  # type: ignore[arg-type]
    agreed.last = last
    return comm, agreed


def test_a_failing_rank_sends_the_failed_signature_and_raises_its_own_error():
    comm, agreed = make_peers("allreduce(op=SUM, ...)", last=(7, RECIPE))
    comm.others = [triple(7, False)]
    error = TypeError("allreduce: leaf 0 cannot be converted")
    with pytest.raises(TypeError) as info:
        agreed.fail(None, "allreduce", error)
    assert info.value is error and agreed.exchanges == 1 and agreed.last is None
    sent = comm.calls[-1][1]
    assert isinstance(sent, Failed) and sent.message == str(error) and sent.types[0] == ("builtins", "TypeError")
    assert [c[0] for c in comm.calls] == ["exchange", "allgather"]  # nobody speculated: no drain


def test_a_failing_rank_drains_the_calls_of_ranks_that_speculated():
    comm, agreed = make_peers("allreduce(...)", last=(7, RECIPE))
    comm.others = [triple(7, True)]
    with pytest.raises(ValueError):
        agreed.fail(None, "allreduce", ValueError("bad op"))
    assert [c[0] for c in comm.calls] == ["exchange", "Allreduce", "Iallreduce", "allgather"]


def test_when_every_rank_failed_each_raises_its_own_without_a_description_exchange():
    comm, agreed = make_peers(None, last=(7, RECIPE))
    comm.others = [triple(FAILED, False)]
    with pytest.raises(KeyError):
        agreed.fail(None, "broadcast", KeyError("root"))
    assert comm.calls == [("exchange",)] and agreed.last is None


def test_the_other_ranks_raise_an_error_naming_the_failing_rank_of_its_type():
    failed = Failed(ValueError("alltoall: `splits` must sum to 5"))
    comm, agreed = make_peers(failed, last=(7, RECIPE))
    comm.others = [triple(FAILED, False)]
    with pytest.raises(CollectiveFailedError) as info:
        agreed.check(7, None, ("k",), "alltoall", None)
    error = info.value
    assert isinstance(error, ValueError) and error.rank == 1 and error.where == "alltoall"
    assert "rank 1 failed before the collective" in str(error) and "ValueError: alltoall: `splits`" in str(error)
    assert agreed.last is None  # the same outcome as on the failing rank


def test_the_fast_path_counts_its_exchanges():
    comm, agreed = make(last=(7, RECIPE))
    comm.others = [triple(7, True)]
    run = agreed.bind(7, ("k",), "allreduce", RECIPE, lambda x: "result")
    run(None)
    run(None)
    assert agreed.exchanges == 2


# -- a rank standing by (Agreement.stand_by: Horovod's hvd.join) --------------------------------------

STANDS = [STANDING, int(np.iinfo(np.int64).max), 0]  # a standing rank's exchange: neutral but for its flag


class _Many(ScriptedComm):
    """The description exchange answers with this rank's then ``gathered`` (the other ranks')."""

    def __init__(self, *gathered) -> None:
        super().__init__()
        self.gathered = list(gathered)

    def allgather(self, mine):
        self.calls.append(("allgather", mine))
        return [mine, *self.gathered]


def make_many(*gathered, last=None):
    comm = _Many(*gathered)
    agreed = Agreement(comm, describe=lambda key: f"described {key}")  # type: ignore[arg-type]
    agreed.last = last
    return comm, agreed


def test_while_nobody_stands_by_a_speculated_repeat_exchanges_nothing_more():
    comm, agreed = make(last=(7, RECIPE))
    comm.others = [triple(7, True), triple(7, True)]
    assert agreed.bind(7, ("k",), "allreduce", RECIPE, lambda x: "result")(None) == "result"
    assert comm.calls == [("exchange",)]


def test_a_speculating_rank_meeting_a_standing_rank_drops_its_result_and_raises_standing_by():
    comm, agreed = make_many(Standing(), last=(7, RECIPE))
    comm.others = [STANDS]
    ran = []
    with pytest.raises(StandingByError, match="rank 1 stood by") as info:
        agreed.bind(7, ("k",), "allreduce", RECIPE, lambda x: ran.append("data") or "result")(None)
    assert ran == ["data"] and info.value.ranks == [1] and info.value.where == "allreduce"
    assert [c[0] for c in comm.calls] == ["exchange", "allgather"]  # its data ran: no drain here
    assert agreed.last is None  # the same outcome as on the standing rank: nobody speculates next


def test_an_active_rank_that_did_not_speculate_raises_standing_by_before_its_data():
    comm, agreed = make_many(Standing(), "described ('k',)", last=None)
    comm.others = [STANDS, triple(7, False)]
    with pytest.raises(StandingByError):
        agreed.check(7, None, ("k",), "allreduce", RECIPE)
    assert [c[0] for c in comm.calls] == ["exchange", "allgather"] and agreed.last is None


def test_a_standing_rank_drains_what_the_active_ranks_speculated_and_serves_them():
    comm, agreed = make_many("described ('k',)", last=(7, RECIPE))
    comm.others = [triple(7, True)]
    assert agreed.stand_by(None, "stand_by") is False
    assert comm.calls[:3] == [("exchange",), ("Allreduce", np.dtype(np.float32), 1000, MPI.SUM),
                              ("Iallreduce", np.dtype(np.float64), 10, MPI.SUM)]
    assert isinstance(comm.calls[3][1], Standing) and len(comm.calls) == 4
    assert agreed.last is None and agreed.exchanges == 1


def test_when_every_rank_stands_by_each_returns_true_at_once():
    comm, agreed = make(last=(7, RECIPE))
    comm.others = [STANDS, STANDS]
    assert agreed.stand_by(None, "stand_by") is True
    assert comm.calls == [("exchange",)] and agreed.last is None


def test_active_ranks_that_disagree_while_a_rank_stands_by_fail_on_every_rank():
    comm, agreed = make_many("allreduce ...", "allgather ...")
    comm.others = [triple(7, False), triple(9, False)]
    with pytest.raises(CollectiveMismatchError, match="while a rank had joined") as info:
        agreed.stand_by(None, "stand_by")
    assert not isinstance(info.value, StandingByError)
    comm, agreed = make_many(Standing(), "allgather ...")
    comm.others = [STANDS, triple(9, False)]
    with pytest.raises(CollectiveMismatchError, match="while a rank had joined") as info:
        agreed.check(7, None, ("k",), "allreduce", None)
    assert not isinstance(info.value, StandingByError)


def test_a_failing_rank_beside_a_standing_one_reports_so_that_the_standing_rank_raises_too():
    comm, agreed = make_many(Standing(), last=(7, RECIPE))
    comm.others = [STANDS]  # the hashes' maximum is FAILED, but a rank stands by: no shortcut
    with pytest.raises(KeyError):
        agreed.fail(None, "broadcast", KeyError("root"))
    assert [c[0] for c in comm.calls] == ["exchange", "allgather"] and isinstance(comm.calls[1][1], Failed)
    comm, agreed = make_many(Failed(KeyError("root")))
    comm.others = [triple(FAILED, False)]
    with pytest.raises(CollectiveFailedError, match="rank 1 failed"):
        agreed.stand_by(None, "stand_by")
