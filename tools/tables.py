"""The text tables of the benchmark tools: medians in milliseconds, one line per case.

``timing_rows`` prints one section's cases (name, time, ratios to the section's baselines, extra
text); ``table`` prints a title and every section of a result (each dict of name -> ms).
"""
from __future__ import annotations

import functools
from typing import Callable, Iterable

Baselines = Callable[[str, dict], dict[str, float]]  # (section, rows) -> {label: baseline ms}


def first_row(section: str, rows: dict) -> dict[str, float]:
    """Ratios to the section's first case, unlabelled."""
    return {"": next(iter(rows.values()))}


def timing_rows(rows: dict[str, float], width: int, *, digits: int = 4, baselines: dict[str, float] | None = None,
                extra: Callable[[str, float], str] | None = None) -> list[str]:
    """``  name   12.3456 ms  x 1.00 label ...``: one line per case of ``rows``."""
    lines = []
    for name, ms in rows.items():
        line = f"  {name:<{width}}{ms:>10.{digits}f} ms"
        for label, base in (baselines or {}).items():
            line += f"  x{ms / base:6.2f}" + (f" {label}" if label else "")
        lines.append(line + (extra(name, ms) if extra is not None else ""))
    return lines


def table(title: str, results: dict, width: int, *, digits: int = 4, baselines: Baselines | None = first_row,
          extra: Callable[[str, str, float], str] | None = None, skip: Iterable[str] = ()) -> str:
    """``title``, then every dict of ``results`` (except ``skip``) as a section of ``timing_rows``;
    ``baselines(section, rows)`` gives the ratio columns, ``extra(section, name, ms)`` text after them."""
    lines = [title]
    for key, rows in results.items():
        if not isinstance(rows, dict) or key in set(skip):
            continue
        lines.append(f"\n{key}")
        lines += timing_rows(rows, width, digits=digits, baselines=baselines(key, rows) if baselines else None,
                             extra=functools.partial(extra, key) if extra else None)
    return "\n".join(lines)
