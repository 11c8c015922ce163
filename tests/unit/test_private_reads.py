"""No module reaches into another object's or another module's private names.

Objects talk through public accessors (``extended.engine``, ``context.rank``, ``value.local_value``,
...). Checked by parsing every file under mpidist/ with ``ast``:

- ``X._name`` (read, write or delete) where ``X`` is not ``self`` or ``cls``;
- ``getattr/hasattr/setattr/delattr(X, "_name")`` on anything;
- ``from module import _name``.

Dunder names (``__name__``, ``__version__``) are public. The only exceptions are TensorFlow's and
Keras's own private internals, which stay confined to the modules listed in CONFINED, and the
few standard-library names in STDLIB.
"""
from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2] / "mpidist"

# Modules whose whole purpose is wrapping TensorFlow/Keras private internals (and nothing else).
CONFINED = {"tensorflow/_tf_private.py", "keras/patching.py"}
# Standard-library private names that are the documented way to do something.
STDLIB = {("sys", "_getframe"), ("sys", "_current_frames"), ("os", "_exit")}
# namedtuple's public API is spelled with one underscore.
NAMEDTUPLE = {"_fields", "_make", "_replace", "_asdict", "_field_defaults"}
# The confined modules themselves may be imported (their own names are public).
CONFINED_MODULES = {"_tf_private"}
ATTR_FUNCS = {"getattr", "hasattr", "setattr", "delattr"}


def _private(name: str) -> bool:
    return (name.startswith("_") and not (name.startswith("__") and name.endswith("__"))
            and name not in NAMEDTUPLE)


def _own(base: ast.expr) -> bool:
    """``self``, ``cls`` or ``super()``: the object's own attributes."""
    if isinstance(base, ast.Name):
        return base.id in ("self", "cls")
    return isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id == "super"


def violations(path: pathlib.Path) -> list[str]:
    rel = path.relative_to(ROOT).as_posix()
    if rel in CONFINED:
        return []
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        where = f"mpidist/{rel}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Attribute) and _private(node.attr):
            base = node.value
            if _own(base) or (isinstance(base, ast.Name) and (base.id, node.attr) in STDLIB):
                continue
            found.append(f"{where}: {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ATTR_FUNCS:
            if len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
                if _private(node.args[1].value) and not _own(node.args[0]):
                    found.append(f"{where}: {ast.unparse(node)}")
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if _private(alias.name) and alias.name not in CONFINED_MODULES:
                    found.append(f"{where}: from {'.' * node.level}{node.module or ''} import {alias.name}")
    return found


def test_checker_catches_each_form(tmp_path):
    bad = ROOT / "__probe_private_reads__.py"
    source = (
        "from .x import _hidden\n"
        "def f(ext, value):\n"
        "    ext._engine.run()\n"
        "    self._strategy.extended._rank\n"
        "    getattr(value, '_values')\n"
        "    value._values[0] = 1\n"
        "    return self._ok, cls._ok, super()._ok, value.__class__, sys._getframe(1), getattr(self, '_ok')\n"
    )
    bad.write_text(source)
    try:
        found = violations(bad)
    finally:
        bad.unlink()
    text = "\n".join(found)
    assert len(found) == 5, text
    for fragment in ("_hidden", "ext._engine", "extended._rank", "self._strategy.extended",
                     "getattr(value, '_values')", "value._values"):
        assert fragment in text, (fragment, text)
    assert "_ok" not in text and "_getframe" not in text


def test_no_private_reads_across_objects_or_modules():
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        found.extend(violations(path))
    assert not found, f"{len(found)} private names used across objects/modules:\n" + "\n".join(found)
