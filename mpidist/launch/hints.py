"""A one-line hint when a program written for Keras 2 fails under Keras 3.

Most Horovod programs, Horovod's own examples among them, are Keras 2 code: ``opt.variables()``,
``compile(experimental_run_tf_function=False)``, ``optimizers.Adam(lr=...)``,
``tf.keras.optimizers.legacy``, ``fit_generator``. Keras 3 rejects those lines whatever runs the
collectives. When the program's uncaught exception comes from such a line and ``tf.keras`` is
Keras 3, ``mpidist run`` adds one line naming the file, the line and what to do (``--keras 2``).
"""
from __future__ import annotations

import linecache
import os
import re
import sys
import sysconfig
from types import TracebackType

__all__ = ["keras2_hint", "KERAS2_SPELLINGS"]

# (pattern on the program's line, what it is)
KERAS2_SPELLINGS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\.variables\(\s*\)"), "optimizer.variables() (a list in Keras 3, not a method)"),
    (re.compile(r"experimental_run_tf_function"), "compile(experimental_run_tf_function=...)"),
    (re.compile(r"\blr\s*="), "an optimizer's lr= (learning_rate= in Keras 3)"),
    (re.compile(r"optimizers\.legacy"), "keras.optimizers.legacy"),
    (re.compile(r"\.(fit|evaluate|predict)_generator\("), "Model.fit_generator and friends"),
    (re.compile(r"\.get_updates\(|\._decayed_lr\("), "an optimizer_v2 method"),
)
_LIBRARY_DIRS = tuple(os.path.realpath(p) for p in {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"],
                                                    sysconfig.get_paths()["platlib"]})
_MPIDIST_DIR = os.path.realpath(os.path.dirname(os.path.dirname(__file__)))


def _keras3_in_use() -> bool:
    if os.environ.get("TF_USE_LEGACY_KERAS", "").strip().lower() in ("1", "true", "yes"):
        return False
    keras = sys.modules.get("keras")
    return keras is not None and str(getattr(keras, "__version__", "")).startswith("3.")


def _program_frame(tb: TracebackType | None) -> tuple[str, int] | None:
    """(file, line) of the innermost frame of the program itself (not a library, not mpidist)."""
    found = None
    while tb is not None:
        path = os.path.realpath(tb.tb_frame.f_code.co_filename)
        if not path.startswith(_LIBRARY_DIRS) and not path.startswith(_MPIDIST_DIR + os.sep) and "<" not in path:
            found = (tb.tb_frame.f_code.co_filename, tb.tb_lineno)
        tb = tb.tb_next
    return found


def keras2_hint(error: BaseException) -> str | None:
    """The hint for ``error`` (see the module docstring), or None when it does not apply."""
    if not isinstance(error, Exception) or not _keras3_in_use():
        return None
    where = _program_frame(error.__traceback__)
    if where is None:
        return None
    path, line = where
    text = linecache.getline(path, line).strip()
    for pattern, what in KERAS2_SPELLINGS:
        if pattern.search(text):
            return (f"mpidist run: {os.path.basename(path)}:{line} is Keras 2 code ({what}), which Keras 3 rejects; "
                    f"run it under Keras 2: `mpidist run --keras 2 ...` (needs `pip install tf_keras`)")
    return None
