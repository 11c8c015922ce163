"""An engine that records its calls, for the tests that check what reaches the engine.

``effective(kwargs)``: the per-call options one engine call was given, as one dict: the set fields
of ``options=`` (a CallOptions, what every layer passes since issue 24), with explicit keyword
arguments over them; so ``kw.get("bytes_per_pack")`` reads the same however the value travelled.
"""
from __future__ import annotations

from typing import Any

_FIELDS = ("bytes_per_pack", "num_packs", "algorithm", "timeout_seconds", "compression")


def effective(kwargs: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in kwargs.items() if k != "options"}
    options = kwargs.get("options")
    if options is not None:
        for name in _FIELDS:
            if out.get(name) is None and getattr(options, name) is not None:
                out[name] = getattr(options, name)
        if options.implementation != "auto":
            out.setdefault("implementation", options.implementation)
    return out


class SpyEngine:
    """Wraps an engine: records every method call's name and effective keyword arguments."""

    def __init__(self, engine: Any) -> None:
        self._engine, self.calls = engine, []

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._engine, name)
        if not callable(target):
            return target

        def spy(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, effective(kwargs)))
            return target(*args, **kwargs)
        return spy
