"""Horovod's HOROVOD_* environment variables, mapped onto ``mpidist.rc`` at ``hvd.init()``.

- HOROVOD_FUSION_THRESHOLD (bytes) -> ``rc.bytes_per_pack`` (0 keeps mpidist's automatic packing);
- HOROVOD_TIMELINE (path) -> ``rc.timeline``;
- HOROVOD_STALL_CHECK_TIME_SECONDS -> ``rc.stall_seconds``; HOROVOD_STALL_CHECK_DISABLE=1 -> None;
- HOROVOD_STALL_SHUTDOWN_TIME_SECONDS -> ``rc.stall_abort_seconds`` (0: never);
- HOROVOD_HIERARCHICAL_ALLREDUCE=1 -> ``rc.algorithm = "hierarchical"``, 0 -> "flat".

Every other HOROVOD_* variable is accepted and logged once at debug level (it has no meaning here).
An MPIDIST_* variable set for the same setting wins.
"""
from __future__ import annotations

import logging
import os
from typing import Callable, Mapping

from ..._config import rc

_log = logging.getLogger("mpidist")
_logged: set[str] = set()


def _seconds(value: str) -> float | None:
    seconds = float(value)
    return None if seconds <= 0 else seconds


_MAP: dict[str, tuple[str, Callable[[str], object]]] = {
    "HOROVOD_FUSION_THRESHOLD": ("bytes_per_pack", int),
    "HOROVOD_TIMELINE": ("timeline", str),
    "HOROVOD_STALL_CHECK_TIME_SECONDS": ("stall_seconds", _seconds),
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": ("stall_abort_seconds", _seconds),
    "HOROVOD_HIERARCHICAL_ALLREDUCE": ("algorithm", lambda v: "hierarchical" if v.strip() not in ("", "0") else "flat"),
}


def apply(environ: Mapping[str, str] | None = None) -> dict[str, object]:
    """Set ``rc`` from the HOROVOD_* variables in ``environ`` (default os.environ); returns what was set."""
    env = os.environ if environ is None else environ
    changed: dict[str, object] = {}
    for name, value in sorted(env.items()):
        if not name.startswith("HOROVOD_"):
            continue
        if name == "HOROVOD_STALL_CHECK_DISABLE":
            if value.strip() not in ("", "0") and "MPIDIST_STALL_SECONDS" not in env:
                changed["stall_seconds"] = None
            continue
        if name not in _MAP:
            if name not in _logged:
                _logged.add(name)
                _log.debug("horovod: %s=%s has no meaning on mpidist; ignored", name, value)
            continue
        setting, parse = _MAP[name]
        if "MPIDIST_" + setting.upper() in env:
            continue
        try:
            changed[setting] = parse(value)
        except ValueError:
            raise ValueError(f"hvd.init: environment variable {name} must be a number, got {value!r}") from None
    if changed:
        rc(**changed)
        _log.debug("horovod: settings from HOROVOD_* variables: %s", changed)
    return changed
