"""Run-time settings: one ``rc`` object, overridable by ``MPIDIST_<NAME>`` variables.

Modelled on ``mpi4py.rc``: the names are fixed, a misspelt name is an error (in code and in
the environment), and every value is checked when it is set::

    import mpidist
    mpidist.rc.algorithm = "hierarchical"          # or MPIDIST_ALGORITHM=hierarchical
    with mpidist.rc.override(timeout_seconds=5):   # scoped change, e.g. in tests
        ...

Settings that shape a collective (algorithm, packing) must be equal on every rank; the
agreement check reports a rank whose settings differ.
"""
from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Iterator, Mapping

from .validation import (
    check_choice,
    check_compression,
    check_flag,
    check_nonneg_int,
    check_signal_names,
    parse_timeout_text,
)

_PREFIX = "MPIDIST_"


def _choice(*allowed: str) -> Callable[[str, Any], str]:
    def parse(name: str, value: Any) -> str:
        return check_choice(str(value), "mpidist.rc", name, allowed)
    return parse


def _nonneg_int(name: str, value: Any) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())  # from the environment
    return check_nonneg_int(value, "mpidist.rc", name)


def _positive_int(name: str, value: Any) -> int:
    number = _nonneg_int(name, value)
    if number < 1:
        raise ValueError(f"mpidist.rc: `{name}` must be an integer >= 1, got {value!r}")
    return number


def _optional_bytes(name: str, value: Any) -> int | None:
    """A byte count, or None (None, "" and "model" from the environment) for the cost model's choice."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "model")):
        return None
    return _nonneg_int(name, value)


def _tristate(name: str, value: Any) -> str:
    text = str(value).strip().lower()
    if text == "auto":
        return text
    try:
        return "yes" if check_flag(value, "mpidist.rc", name) else "no"
    except ValueError:
        raise ValueError(f"mpidist.rc: `{name}` must be auto, yes or no (1/0, true/false), got {value!r}") from None


def _flag(name: str, value: Any) -> bool:
    return check_flag(value, "mpidist.rc", name)


def _optional_seconds(name: str, value: Any) -> float | None:
    """Seconds > 0, or None for never: None, 0, "", "none" and "0" all mean never."""
    return parse_timeout_text(value, "mpidist.rc", name)


def _compression(name: str, value: Any) -> str:
    """none, float16 or bfloat16 (aliases: see validation.check_compression); None and "" mean none."""
    if isinstance(value, str) and not value.strip():
        return "none"
    return check_compression(value, "mpidist.rc", name)  # type: ignore[return-value]  # None only if optional


def _signals(name: str, value: Any) -> tuple[str, ...]:
    return check_signal_names(value, "mpidist.rc", name)


def _path(name: str, value: Any) -> str:
    if value is None:
        return ""
    if not isinstance(value, (str, os.PathLike)):
        raise ValueError(f"mpidist.rc: `{name}` must be a file path or empty, got {value!r}")
    return os.fspath(value).strip()


# name -> (default, parser, one-line description)
_SPECS: dict[str, tuple[Any, Callable[[str, Any], Any], str]] = {
    "algorithm": ("auto", _choice("auto", "flat", "hierarchical"),
                  "collective algorithm: auto (by topology and size), flat (the MPI library's own), "
                  "hierarchical (inside node, across node leaders, back inside node)"),
    "hierarchical_threshold": (None, _optional_bytes,
                               "None (MPIDIST_HIERARCHICAL_THRESHOLD=model) = auto picks flat or hierarchical per "
                               "buffer size by the cost model (collectives/algorithms/choice.py); a byte count = "
                               "the fixed rule: hierarchical from this many bytes per buffer when the job spans "
                               "several nodes and some node has several ranks; must be equal on every rank"),
    "nics_per_node": (1, _positive_int,
                      "network interfaces each node's ranks use across nodes: auto's cost model shares a "
                      "node's off-node traffic among them (more NICs favour flat); must be equal on every rank"),
    "iallreduce_threshold": (32 << 20, _nonneg_int,
                             "flat allreduces of at least this many bytes per buffer run as MPI_Iallreduce + "
                             "wait instead of MPI_Allreduce (2-3x faster from 32 MB at 2 ranks with Open MPI 5 "
                             "here, a toss-up below); 0 = always; must be equal on every rank"),
    "bytes_per_pack": (0, _nonneg_int,
                       "default pack size for nested collectives in bytes (and TensorFlow's backprop bucket size); "
                       "0 = automatic: every leaf fused into packs of up to 64 MiB, no buckets"),
    "local_size": (0, _nonneg_int,
                   "fake nodes of this many consecutive ranks (testing the hierarchical path on "
                   "one machine); 0 = nodes from MPI_Comm_split_type(COMM_TYPE_SHARED)"),
    "check_agreement": (True, _flag,
                        "check that every rank issues the same collective before any result is returned "
                        "(one 24-byte allreduce; overlapped with the data on repeats of the previous signature)"),
    "buffer_pool_bytes": (512 << 20, _nonneg_int,
                          "result buffers of 256 KiB and more are recycled once the caller drops them, "
                          "up to this many bytes in all (0: always allocate)"),
    "framework": ("auto", _choice("auto", "numpy", "tensorflow"),
                  "what strategies are built on: auto (TensorFlow strategies when the program has imported "
                  "TensorFlow, NumPy ones otherwise), numpy, or tensorflow"),
    "abort_on_error": (True, _flag,
                       "an uncaught exception on one rank aborts the whole MPI job (MPI_Abort), so the "
                       "other ranks do not wait forever"),
    "bind_gpu": (True, _flag,
                 "when the program has imported CuPy and sees GPUs, a strategy makes GPU "
                 "local_rank % n_gpus current on each rank; false: leave the current device alone"),
    "cuda_aware_mpi": ("auto", _tristate,
                       "whether MPI may read GPU memory: auto (ask the library where it can tell), yes, no"),
    "stall_seconds": (60.0, _optional_seconds,
                      "log which ranks have not arrived when a collective has waited this long (and where the chief "
                      "is when a rank has waited this long for its save); None or 0 = never"),
    "stall_abort_seconds": (None, _optional_seconds,
                            "abort the job when a collective, or a rank waiting for the chief's save, has waited "
                            "this long; None or 0 = never"),
    "timeout_seconds": (None, _optional_seconds,
                        "default deadline of every collective, and of a rank's wait for the chief's save; None or "
                        "0 = wait forever (a call's own timeout_seconds=0 also means no deadline, over this default)"),
    "compression": ("none", _compression,
                    "float32 SUM/MEAN allreduce data travels as float16 or bfloat16 (summed in float32 "
                    "after decompression; other dtypes and ops travel unchanged): none, float16, bfloat16"),
    "timeline": ("", _path,
                 "write a Chrome/Perfetto trace of every collective to this path, one file per rank "
                 "('{rank}' in the path is replaced by the rank, else '.rank<N>' goes before the suffix); "
                 "empty = off"),
    "preemption_signals": (("SIGTERM",), _signals,
                           "the signals that make TensorFlow's PreemptionCheckpointHandler save and exit under "
                           "mpidist strategies when its TerminationConfig has no termination_watcher_fn: SIGTERM "
                           "(TensorFlow's); TERM,USR1 also takes SIGUSR1, which mpirun forwards to the ranks "
                           "without killing them"),
}


class Settings:
    """The ``mpidist.rc`` settings object; see the module docstring."""

    __slots__ = tuple(_SPECS) + ("generation",)  # plain attribute reads: the engine reads them every call

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self.reset(environ)

    def reset(self, environ: Mapping[str, str] | None = None) -> None:
        """Back to the defaults, then apply ``MPIDIST_<NAME>`` from ``environ`` (default os.environ)."""
        env = os.environ if environ is None else environ
        unknown = sorted(k for k in env if k.startswith(_PREFIX) and k[len(_PREFIX):].lower() not in _SPECS)
        if unknown:
            known = ", ".join(_PREFIX + n.upper() for n in _SPECS)
            raise ValueError(f"mpidist.rc: unknown setting(s) {', '.join(unknown)} in the environment; "
                             f"known: {known}")
        values = {name: spec[0] for name, spec in _SPECS.items()}
        for name, (_, parse, _) in _SPECS.items():
            key = _PREFIX + name.upper()
            if key in env:
                values[name] = parse(key, env[key])
        for name, value in values.items():
            object.__setattr__(self, name, value)
        self._changed()

    def _changed(self) -> None:
        """Count changes, so caches of anything derived from settings know when to rebuild."""
        object.__setattr__(self, "generation", getattr(self, "generation", 0) + 1)

    def __getattr__(self, name: str) -> Any:  # only reached for names that are not settings
        raise AttributeError(f"mpidist.rc has no setting {name!r}; known: {', '.join(_SPECS)}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in _SPECS:
            raise AttributeError(f"mpidist.rc has no setting {name!r}; known: {', '.join(_SPECS)}")
        object.__setattr__(self, name, _SPECS[name][1](name, value))
        self._changed()

    def __call__(self, **kwargs: Any) -> None:
        """Set several settings at once: ``rc(algorithm="flat", bytes_per_pack=1 << 20)``."""
        for name, value in kwargs.items():
            setattr(self, name, value)

    @contextlib.contextmanager
    def override(self, **kwargs: Any) -> Iterator[Settings]:
        """Change settings inside a ``with`` block; restores the previous values on exit."""
        saved = self.as_dict()
        try:
            self(**kwargs)
            yield self
        finally:
            for name, value in saved.items():
                object.__setattr__(self, name, value)
            self._changed()

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _SPECS}

    @staticmethod
    def describe() -> dict[str, str]:
        """Setting name -> what it does (for ``python -m mpidist info`` and the docs)."""
        return {name: spec[2] for name, spec in _SPECS.items()}

    def __repr__(self) -> str:
        return "rc(" + ", ".join(f"{k}={v!r}" for k, v in self.as_dict().items()) + ")"


rc = Settings()
