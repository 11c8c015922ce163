"""What one check found on one rank, the job's verdict from every rank's, and the chief's report.

A check ends in one of four states on each rank:

- ``ok``: present and correct (against a host reference), with a one-line timing;
- ``broken``: present but wrong, failing or hanging (the check raised, or a result differed from
  the reference): the command exits non-zero;
- ``missing``: not there (not installed, not enabled), with the one-line fix; not an error;
- ``skipped``: does not apply here (no GPU, TensorFlow sees none), with why.

The job's state of a check is the worst of its ranks' (broken > missing > skipped > ok), and its
text names the ranks that differ, so every rank reaches the same verdict and the same exit status.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

STATES = ("ok", "skipped", "missing", "broken")  # worst last
LABELS = {"ok": "OK", "skipped": "SKIPPED", "missing": "MISSING", "broken": "BROKEN"}


@dataclass(frozen=True)
class Outcome:
    """One rank's result of one check."""
    state: str
    detail: str                 # what was verified, or the error, or why it is missing / skipped
    timing: str | None = None   # "4 MB float32 sum: 1.02 ms" (this rank's median), ok only
    seconds: float | None = None  # the timed call's median on this rank (the report shows the slowest)
    fix: str | None = None      # the one-line fix, for missing and broken

    def __post_init__(self) -> None:
        if self.state not in STATES:
            raise ValueError(f"Outcome: `state` must be one of {', '.join(STATES)}, got {self.state!r}")


def ok(detail: str, timing: str | None = None, seconds: float | None = None) -> Outcome:
    return Outcome("ok", detail, timing, seconds)


def broken(detail: str, fix: str | None = None) -> Outcome:
    return Outcome("broken", detail, fix=fix)


def missing(detail: str, fix: str) -> Outcome:
    return Outcome("missing", detail, fix=fix)


def skipped(detail: str) -> Outcome:
    return Outcome("skipped", detail)


@dataclass(frozen=True)
class Verdict:
    """The job's result of one check, identical on every rank (from every rank's Outcome)."""
    name: str
    state: str
    detail: str
    timing: str | None
    fix: str | None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _ranks(ranks: Sequence[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))


def combine(name: str, outcomes: Sequence[Outcome]) -> Verdict:
    """The job's verdict from ``outcomes[r]``, rank r's outcome (the same on every rank)."""
    worst = max((o.state for o in outcomes), key=STATES.index)
    which = [r for r, o in enumerate(outcomes) if o.state == worst]
    first = outcomes[which[0]]
    detail = first.detail
    if len(which) < len(outcomes):  # only some ranks: say which, and what the others saw
        others = sorted({o.detail for o in outcomes if o.state != worst})
        detail = f"on {_ranks(which)}: {detail} (the other ranks: {'; '.join(others)})"
    else:  # every rank: one text where they agree, else each rank's
        texts = {o.detail for o in outcomes}
        if len(texts) > 1:
            detail = "; ".join(f"rank {r}: {o.detail}" for r, o in enumerate(outcomes))
    timing = None
    if worst == "ok" and first.timing is not None:
        slowest = max(range(len(outcomes)), key=lambda r: outcomes[r].seconds or 0.0)
        slow = outcomes[slowest].timing
        assert slow is not None, "every rank's ok() of one check carries a timing when the first does"
        timing = slow + (f"; slowest rank {slowest}" if len(outcomes) > 1 else "")
    return Verdict(name, worst, detail, timing, first.fix)


def failed(verdicts: Sequence[Verdict]) -> bool:
    """Whether something present is broken (the command's exit status is then non-zero)."""
    return any(v.state == "broken" for v in verdicts)


def format_verdict(v: Verdict) -> str:
    """One check's lines: state, name and detail; then its timing, or the fix."""
    lines = [f"{LABELS[v.state]:<8} {v.name}: {v.detail}"]
    if v.timing:
        lines.append(f"{'':<8} time: {v.timing}")
    if v.fix and v.state in ("missing", "broken"):
        lines.append(f"{'':<8} fix: {v.fix}")
    return "\n".join(lines)


def format_summary(verdicts: Sequence[Verdict]) -> str:
    """What works, what is missing (with the fix), what was skipped and why, what is broken."""
    by_state = {s: [v for v in verdicts if v.state == s] for s in STATES}
    lines = ["", f"works ({len(by_state['ok'])}): " + (", ".join(v.name for v in by_state["ok"]) or "nothing")]
    if by_state["missing"]:
        lines.append(f"missing ({len(by_state['missing'])}), each with its fix:")
        lines.extend(f"  {v.name}: {v.fix}" for v in by_state["missing"])
    if by_state["skipped"]:
        lines.append(f"skipped ({len(by_state['skipped'])}):")
        lines.extend(f"  {v.name}: {v.detail}" for v in by_state["skipped"])
    if by_state["broken"]:
        lines.append(f"BROKEN ({len(by_state['broken'])}):")
        lines.extend(f"  {v.name}: {v.fix or v.detail}" for v in by_state["broken"])
        lines.append("result: BROKEN: something present does not work (exit status 1)")
    else:
        lines.append("result: everything present works (exit status 0)")
    return "\n".join(lines)
