"""Argument checks shared by every layer: one function per kind of value, one message format.

This is the bottom layer: it imports nothing from mpidist, so topology, collectives, the settings
(``mpidist.rc``) and the layers above all use the same checks. Each function returns the value in
its normal form or raises ``ValueError`` (``TypeError`` where noted) whose message names the
caller (``where``), the argument, what was expected and what came::

    NcclAllReduce: `num_packs` must be an integer >= 0, got -1

Integers are Python ints or NumPy integers (``numbers.Integral``), never bools; numbers are
ints, floats or NumPy numbers, never bools.

**One meaning per value of ``timeout_seconds``**, in every layer (engine calls, CallOptions,
CommunicationOptions, ``rc.timeout_seconds`` and ``MPIDIST_TIMEOUT_SECONDS``):

- ``None``: not set here; the next default applies (a call's options, then the strategy's
  CommunicationOptions, then ``rc.timeout_seconds``; ``rc``'s own ``None`` means no deadline);
- ``0``: no deadline, whatever the defaults say (TensorFlow documents 0 as "no timeout");
- ``> 0``: the deadline of each collective, in seconds.

**And of ``bytes_per_pack``**, by the same rule (engine calls, CallOptions, CommunicationOptions,
CollectiveHints, ``MPIAllReduce``; ``rc.bytes_per_pack`` is the last default):

- ``None``: not set here; the next default applies (TensorFlow's own options objects cannot say
  "not set": their 0, TensorFlow's default, is taken as None where they come in);
- ``0``: automatic packing (mpidist/collectives/packing.py), whatever the defaults say;
- ``> 0``: packs of up to that many bytes.
"""
from __future__ import annotations

import numbers
import signal
from typing import Any, Iterable, Literal, overload

NO_DEADLINE = 0.0  # what check_timeout returns for "no deadline, whatever the defaults say"


def is_integer(value: Any) -> bool:
    """Whether ``value`` is an integer (Python or NumPy), not a bool."""
    if type(value) is int:  # the common case, without the ABC check
        return True
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and type(value).__name__ != "bool_"


def is_number(value: Any) -> bool:
    """Whether ``value`` is a real number (Python or NumPy), not a bool."""
    if type(value) is float or type(value) is int:  # the common cases, without the ABC check
        return True
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and type(value).__name__ != "bool_"


@overload
def check_int_at_least(value: Any, where: str, name: str, low: int, *, optional: Literal[False] = False) -> int: ...
@overload
def check_int_at_least(value: Any, where: str, name: str, low: int, *, optional: bool) -> int | None: ...
def check_int_at_least(value: Any, where: str, name: str, low: int, *, optional: bool = False) -> int | None:
    """An integer >= ``low`` as a Python int; ``None`` passes through when ``optional``."""
    if value is None and optional:
        return None
    if not is_integer(value) or value < low:
        raise ValueError(f"{where}: `{name}` must be an integer >= {low}{' or None' if optional else ''}, "
                         f"got {value!r}")
    return int(value)


@overload
def check_nonneg_int(value: Any, where: str, name: str, *, optional: Literal[False] = False) -> int: ...
@overload
def check_nonneg_int(value: Any, where: str, name: str, *, optional: bool) -> int | None: ...
def check_nonneg_int(value: Any, where: str, name: str, *, optional: bool = False) -> int | None:
    """An integer >= 0 as a Python int; ``None`` passes through when ``optional``."""
    return check_int_at_least(value, where, name, 0, optional=optional)


@overload
def check_bytes_per_pack(value: Any, where: str, *, optional: Literal[False] = False) -> int: ...
@overload
def check_bytes_per_pack(value: Any, where: str, *, optional: bool) -> int | None: ...
def check_bytes_per_pack(value: Any, where: str, *, optional: bool = False) -> int | None:
    """``bytes_per_pack``: an integer >= 0 (0: automatic packing); None when ``optional``."""
    return check_nonneg_int(value, where, "bytes_per_pack", optional=optional)


@overload
def check_num_packs(value: Any, where: str, *, optional: Literal[False] = False) -> int: ...
@overload
def check_num_packs(value: Any, where: str, *, optional: bool) -> int | None: ...
def check_num_packs(value: Any, where: str, *, optional: bool = False) -> int | None:
    """``num_packs``: an integer >= 0 (0: every leaf alone); None when ``optional``."""
    return check_nonneg_int(value, where, "num_packs", optional=optional)


def check_timeout(value: Any, where: str, name: str = "timeout_seconds") -> float | None:
    """``timeout_seconds`` (see the module docstring): None stays None, 0 gives ``NO_DEADLINE``
    (0.0), a number > 0 gives float seconds; anything else is a ValueError."""
    if value is None:
        return None
    if not is_number(value) or not value >= 0 or value != value:
        raise ValueError(f"{where}: `{name}` must be None, 0 (no deadline) or seconds > 0, got {value!r}")
    return float(value)


def parse_timeout_text(value: Any, where: str, name: str) -> float | None:
    """:func:`check_timeout` for a setting that may come as text (environment variables):
    "", "none" and "0" mean no deadline (None), other text must be a number >= 0."""
    number = value
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("", "none"):
            return None
        try:
            number = float(text)
        except ValueError:
            number = None
        if number is None or not number >= 0:
            raise ValueError(f"{where}: `{name}` must be None, 0 (no deadline) or seconds > 0, got {value!r}")
    seconds = check_timeout(number, where, name)
    return None if seconds == NO_DEADLINE else seconds


def check_choice(value: Any, where: str, name: str, allowed: Iterable[str], *, upper: bool = False) -> str:
    """One of ``allowed`` (lower-case names), given in any case or as an enum member with that name;
    ``upper``: the message shows the names in upper case (enum-like options: AUTO, RING, NCCL)."""
    allowed = tuple(allowed)
    text = getattr(value, "name", value)
    if isinstance(text, str) and text.strip().lower() in allowed:
        return text.strip().lower()
    shown = ", ".join(a.upper() if upper else a for a in allowed)
    raise ValueError(f"{where}: `{name}` must be one of {shown}, got {value!r}")


COMPRESSIONS = ("none", "float16", "bfloat16")  # the normal forms of a `compression` value
_COMPRESSION_ALIASES = {"none": "none", "off": "none", "float16": "float16", "fp16": "float16",
                        "half": "float16", "bfloat16": "bfloat16", "bf16": "bfloat16"}


def check_compression(value: Any, where: str, name: str = "compression", *, optional: bool = False) -> str | None:
    """``compression`` (float32 allreduce data on the wire): "none", "float16" or "bfloat16".

    Given in any case, as the aliases off, fp16/half and bf16, or as a dtype-like object of that
    name (``numpy.float16``, ``tf.bfloat16``); ``None`` passes through when ``optional`` (not
    set here: the next default applies), else it means "none"."""
    if value is None:
        return None if optional else "none"
    text = getattr(value, "name", None) or getattr(value, "__name__", None) or value  # tf.DType, np.dtype, type
    found = _COMPRESSION_ALIASES.get(text.strip().lower()) if isinstance(text, str) else None
    if found is None:
        raise ValueError(f"{where}: `{name}` must be one of none, float16, bfloat16 (or off, fp16, half, bf16)"
                         f"{' or None' if optional else ''}, got {value!r}")
    return found


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def check_flag(value: Any, where: str, name: str) -> bool:
    """A boolean, given as a bool or as text (1/0, true/false, yes/no, on/off)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"{where}: `{name}` must be a boolean (1/0, true/false), got {value!r}")


def check_rank(value: Any, where: str, name: str, size: int) -> int:
    """A rank of a communicator of ``size`` ranks, as a Python int."""
    if type(value) is int and 0 <= value < size:
        return value
    if not is_integer(value) or not 0 <= value < size:
        raise ValueError(f"{where}: `{name}` must be a rank in [0, {size}), got {value!r}")
    return int(value)


_UNCATCHABLE = ("SIGKILL", "SIGSTOP")


def check_signal_names(value: Any, where: str, name: str) -> tuple[str, ...]:
    """Signals a handler can catch, as their names (``("SIGTERM", "SIGUSR1")``), given as text
    (``"TERM,USR1"``, ``"SIGTERM SIGUSR1"``), signal numbers or ``signal.Signals``; at least one."""
    if isinstance(value, str):
        items: list[Any] = value.replace(",", " ").split()
    else:
        items = list(value) if isinstance(value, (list, tuple)) else [value]
    names = []
    for item in items:
        if isinstance(item, signal.Signals) or is_integer(item):
            try:
                found = signal.Signals(int(item)).name
            except ValueError:
                found = ""
        else:
            text = str(item).strip().upper()
            found = text if text.startswith("SIG") else "SIG" + text
            found = found if isinstance(getattr(signal, found, None), signal.Signals) else ""
        if not found or found in _UNCATCHABLE:
            raise ValueError(f"{where}: `{name}` must name signals a handler can catch (e.g. TERM,USR1), got "
                             f"{item!r} in {value!r}")
        if found not in names:
            names.append(found)
    if not names:
        raise ValueError(f"{where}: `{name}` must name at least one signal (e.g. TERM), got {value!r}")
    return tuple(names)
