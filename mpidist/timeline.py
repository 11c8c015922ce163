"""``python -m mpidist timeline merge OUT.json TRACE...``: join the ranks' timeline files into one.

``MPIDIST_TIMELINE=path`` makes every rank write its own trace (see
``mpidist/collectives/timeline.py``). Each file loads on its own in chrome://tracing or
https://ui.perfetto.dev; merged, the ranks show as processes side by side on one time axis (the
timestamps are wall-clock microseconds, comparable across the ranks of a node, and across nodes
as far as their clocks agree). Files cut short by a killed job (no closing bracket) are read too.
"""
from __future__ import annotations

import argparse
import glob
import json
import sys
from typing import Any

from . import files


def read_trace(path: str) -> list[dict[str, Any]]:
    """The events of one trace file in JSON array format, complete or cut short."""
    with open(path, encoding="utf-8") as f:
        text = f.read().strip()
    if not text.startswith("["):
        raise ValueError(f"timeline merge: `{path}` is not a trace in JSON array format (starts with {text[:20]!r})")
    if not text.endswith("]"):
        text = text.rstrip(",\n ") + "]"
    return json.loads(text)


def merge(paths: list[str]) -> dict[str, Any]:
    events: list[dict[str, Any]] = []
    for path in paths:
        events.extend(read_trace(path))
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mpidist timeline", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("merge", help="join per-rank trace files into one")
    m.add_argument("out", help="the merged trace to write")
    m.add_argument("traces", nargs="+", help="per-rank files (shell patterns are expanded)")
    args = parser.parse_args(argv)
    paths = sorted({p for pattern in args.traces for p in (glob.glob(pattern) or [pattern])})
    try:
        merged = merge(paths)
    except (OSError, ValueError) as exc:
        print(f"mpidist timeline merge: {exc}", file=sys.stderr)
        return 1

    def dump(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(merged, f)

    files.write_atomically(args.out, dump)
    print(f"wrote {args.out}: {len(merged['traceEvents'])} events from {len(paths)} file(s)")
    return 0
