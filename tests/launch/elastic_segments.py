"""What the elastic jobs (jobs/elastic_numpy.py, elastic_preempt.py) print, and the check of a run
whose ranks were SIGKILLed: used by tests/launch/test_elastic_jobs.py (mpirun) and
tests/slurm/test_elastic.py (the sbatch template).

Gradients depend on each process's original rank and the step with integer values, so the
expected results are exact: each training segment (from a (re)start of ``train`` to the next)
equals a replay of the gradients of the ranks that took part in it, from the state it started from.
"""
from __future__ import annotations

import json

import numpy as np


def results(output: str) -> list[dict]:
    """The ``RESULT {json}`` lines a job printed, one per surviving rank."""
    return [json.loads(line[len("RESULT "):]) for line in output.splitlines() if line.startswith("RESULT ")]


def gradient(rank: int, step: int) -> np.ndarray:  # as in the jobs
    return (rank + 1) * (step + 1) * np.arange(1, 5, dtype=np.float64)


def replay(w: list, ranks: list[int], start: int, stop: int) -> np.ndarray:
    """The jobs' update from ``w`` at step ``start`` to step ``stop`` with ``ranks`` taking part."""
    w = np.array(w, dtype=np.float64)
    for step in range(start, stop):
        w = w + sum(gradient(r, step) for r in ranks)
    return w


def check_survivors(got: list[dict], n: int, steps: int, kills: dict[int, int], context: object) -> None:
    """The results of a job of ``n`` ranks where rank r was killed at step ``kills[r]``: every
    survivor reports the same final ``w`` and segments, on the survivors' communicator; one segment
    per death plus the first; each segment's ranks are those alive, its start a commit at most one
    step before the death that ended the previous one, and its end the replay of its gradients.
    ``context`` (the job's output) is shown when a check fails."""
    survivors = sorted(set(range(n)) - set(kills))
    assert sorted(r["rank"] for r in got) == survivors, context
    first = got[0]
    for r in got:
        assert (r["w"], r["step"], r["size"]) == (first["w"], steps, len(survivors)), context
        assert _segments(r) == _segments(first), context
    segments = first["segments"]
    assert len(segments) == len(kills) + 1, context  # one recovery per death
    assert segments[0]["step"] == 0, context
    in_order = sorted(kills, key=kills.get)  # the i-th death ends segment i
    for i, (seg, after) in enumerate(zip(segments, segments[1:] + [{"step": steps, "w": first["w"]}])):
        dead = set(in_order[:i])
        assert seg["ranks"] == [r for r in range(n) if r not in dead], context
        # the next segment starts from a commit the dying rank never reached
        np.testing.assert_array_equal(replay(seg["w"], seg["ranks"], seg["step"], after["step"]), after["w"])
    for seg in segments[1:]:  # rolled back to a commit at most one step before the death
        assert seg["step"] in set(kills.values()) | {s - 1 for s in kills.values()}, segments


def _segments(result: dict) -> list[tuple]:
    return [(s["step"], s["w"], s["ranks"]) for s in result["segments"]]  # without their times
