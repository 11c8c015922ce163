"""The late-rank protocol of the deadline tests: the last rank joins a collective only once every
other rank has seen its deadline pass, however long that took there (tracing a tf.function, say).

    if comm.Get_rank() == late:
        arrive_late(comm, late)
        ...                        # the collective: completes, the others' requests are still posted
    else:
        with expiring(comm, late):
            ...                    # the collective with a short deadline: expect DeadlineExceededError

Never by sleeping: the other ranks send a message when their deadline has passed (``expiring``
sends it whatever happened in the block, so a failure there never leaves the late rank waiting),
then wait until the late rank's arrival has completed their abandoned requests.
"""
from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator

from mpidist.collectives import deadline

EXPIRED = 7301  # tag of "my deadline has passed", sent to the late rank on the test's communicator


def arrive_late(comm: Any, late: int) -> None:
    """On the late rank: return once every other rank has said its deadline passed."""
    for other in range(comm.Get_size()):
        if other != late:
            comm.recv(source=other, tag=EXPIRED)


@contextlib.contextmanager
def expiring(comm: Any, late: int) -> Iterator[None]:
    """On the other ranks: run the block (whose deadline is to pass), tell the late rank, then wait
    until its arrival has completed the requests the deadline abandoned."""
    try:
        yield
    finally:  # a failure in the block must not leave the late rank waiting
        comm.send(None, dest=late, tag=EXPIRED)
    while deadline.pending():  # polls the abandoned requests; the late rank's arrival completes them
        time.sleep(0.01)
