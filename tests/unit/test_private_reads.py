"""No module reaches into another object's or another module's private names.

Objects talk through public accessors (``extended.engine``, ``context.rank``, ``value.local_value``,
...). Checked by parsing every file under mpidist/ with ``ast``:

- ``X._name`` (read, write or delete) where ``X`` is not ``self`` or ``cls``;
- ``getattr/hasattr/setattr/delattr(X, "_name")`` on anything;
- ``from module import _name``.

Dunder names (``__name__``, ``__version__``) are public. The only exceptions are TensorFlow's and
Keras's own private internals, which stay confined to the modules listed in CONFINED, and the
few standard-library names in STDLIB.

``self._name`` is an object's own attribute only when it is mpidist's: ``base_violations`` reports
the private names of a Keras/TF base class or patched object read off ``self`` (they must go
through ``patching.get_private`` & co. or ``_tf_private``, whose tables list them):

- in a patch function (``self`` is a parameter of a function that is not a method of a class of
  the module: the patched Keras/TF object), any ``self._name`` except mpidist's own ``_mpidist_*``;
- in a method, ``self._name``/``cls._name``/``super()._name`` that neither the module nor the
  mpidist modules it imports define (``def``/``class _name``, ``_name = ...`` in a class body,
  ``self._name = ...`` in a method): it can only come from a Keras/TF base class;
- any name of the tables (``KERAS_PRIVATE``, ``TF_PRIVATE``) off ``self`` unless the module
  overrides it (``def _name``) or it is an attribute of a class of its own without bases (assigning
  one in a subclass does not make it the module's), and off ``super()`` always;
- an accessor (``get_private``/``set_private``/``call_private``) or ``patching.patch`` of a private
  name that is not in the tables.
"""
from __future__ import annotations

import ast
import functools
import pathlib
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[2] / "mpidist"

# Modules whose whole purpose is wrapping TensorFlow/Keras private internals (and nothing else).
CONFINED = {"tensorflow/_tf_private.py", "tensorflow/patching.py"}
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


def _table_names(rel: str, table: str) -> set[str]:
    """The names (dict values: tuples of strings) of ``table`` in mpidist/``rel``, read without importing it."""
    tree = ast.parse((ROOT / rel).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == table \
                and isinstance(node.value, ast.Dict):
            return {name for value in node.value.values for name in ast.literal_eval(value)}
    raise AssertionError(f"mpidist/{rel} has no {table} table")


KERAS_NAMES = _table_names("tensorflow/patching.py", "KERAS_PRIVATE")
TABLE_NAMES = KERAS_NAMES | _table_names("tensorflow/_tf_private.py", "TF_PRIVATE")
ACCESSORS = {"get_private", "set_private", "call_private", "patch", "replace"}


def _is_super(node: ast.expr) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"


def _self_name(node: ast.expr) -> str | None:
    return node.id if isinstance(node, ast.Name) and node.id in ("self", "cls") else None


def _method_of(node: ast.AST, name: str, parents: dict[ast.AST, ast.AST]) -> ast.ClassDef | None | bool:
    """The class whose method has the parameter ``name`` (self/cls) seen at ``node``; False when ``self``
    is the parameter of a function outside a class body (a patch function); else None."""
    scope = parents.get(node)
    while scope is not None:
        if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            params = scope.args.posonlyargs + scope.args.args + scope.args.kwonlyargs
            if any(arg.arg == name for arg in params):
                owner = parents.get(scope)
                if isinstance(owner, ast.ClassDef):
                    return owner
                return False if name == "self" else None  # cls outside a class: a class factory's
        scope = parents.get(scope)
    return None


def _uses(tree: ast.Module) -> list[tuple[ast.AST, str, str, Any]]:
    """Every private name used off self/cls/super() or named to an accessor: (node, name,
    "load"/"store"/"super"/"accessor"/"patch", where), ``where`` as ``_method_of`` says."""
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    uses: list[tuple[ast.AST, str, str, Any]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            who = _self_name(node.value)
            if who is not None:
                how = "load" if isinstance(node.ctx, ast.Load) else "store"
                uses.append((node, node.attr, how, _method_of(node, who, parents)))
            elif _is_super(node.value):
                uses.append((node, node.attr, "super", None))
        elif isinstance(node, ast.Call) and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
                and isinstance(node.args[1].value, str) and _private(node.args[1].value):
            func, name = node.func, node.args[1].value
            called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            who = _self_name(node.args[0])
            if called in ATTR_FUNCS | {"__setattr__"} and who is not None:
                how = "store" if called in ("setattr", "__setattr__") else "load"
                uses.append((node, name, how, _method_of(node, who, parents)))
            elif called in ACCESSORS and isinstance(func, ast.Attribute):
                uses.append((node, name, "patch" if called in ("patch", "replace") else "accessor", None))
    return uses


@functools.cache
def own_names(path: pathlib.Path) -> set[str]:
    """The private names a module defines: ``def``/``class``, class-body assignments, and what its
    methods assign on self/cls (not a table name, in a class with bases: that is a base's attribute)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    own = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                targets = item.targets if isinstance(item, ast.Assign) else \
                    [item.target] if isinstance(item, ast.AnnAssign) and item.value is not None else []
                own.update(t.id for t in targets if isinstance(t, ast.Name))
    for _, name, how, where in _uses(tree):
        if how == "store" and where is not False and (name not in TABLE_NAMES or not getattr(where, "bases", None)):
            own.add(name)
    return {name for name in own if _private(name)}


def _imported(path: pathlib.Path, tree: ast.Module, seen: set[pathlib.Path] | None = None) -> set[pathlib.Path]:
    """The mpidist modules ``path`` imports relatively (``from .x import y``: x, and y when it is a
    module; a package's ``__init__`` and, in turn, what it imports)."""
    found = {path} if seen is None else seen
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            package = path.parent
            for _ in range(node.level - 1):
                package = package.parent
            base = package.joinpath(*node.module.split(".")) if node.module else package
            named = [base / alias.name for alias in node.names]
            for candidate in ([base] if node.module else []) + named:  # not the package of ``from . import x``
                for file in (candidate.with_suffix(".py"), candidate / "__init__.py"):
                    if file.is_file() and file not in found:
                        found.add(file)
                        if file.name == "__init__.py":
                            _imported(file, ast.parse(file.read_text()), found)
    return found


def base_violations(path: pathlib.Path) -> list[str]:
    """Private names of a Keras/TF base class or patched object read off ``self`` (module docstring)."""
    rel = path.relative_to(ROOT).as_posix()
    if rel in CONFINED:
        return []
    tree = ast.parse(path.read_text(), filename=str(path))
    overridden = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    own = own_names(path)
    for module in _imported(path, tree):  # mpidist base classes of other modules
        own |= own_names(module)
    found = []
    for node, name, how, where in _uses(tree):
        text = f"mpidist/{rel}:{getattr(node, 'lineno', '?')}: {ast.unparse(node)}"
        if how in ("accessor", "patch"):
            if name not in (TABLE_NAMES if how == "patch" else KERAS_NAMES):
                found.append(f"{text} ({name} is not in patching.KERAS_PRIVATE)")
        elif where is False:
            if not name.startswith("_mpidist_"):
                found.append(f"{text} (a private name of the patched Keras/TF object)")
        elif how == "super" and name in TABLE_NAMES:
            found.append(f"{text} (a Keras/TF private method: use patching.call_private(super(), ...))")
        elif name in TABLE_NAMES and not (name in overridden or name in own):
            found.append(f"{text} (a Keras/TF private name: use patching's or _tf_private's accessors)")
        elif how != "store" and name not in own:
            found.append(f"{text} (not defined in this module: a base class's private name)")
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


def test_base_checker_catches_each_form():
    bad = ROOT / "__probe_base_reads__.py"
    source = (
        "def patch(original):\n"
        "    def method(self, x):\n"
        "        self._keras_thing(x)\n"  # patch function: a Keras private name
        "        self._mpidist_mine = getattr(self, '_mpidist_mine', 0)\n"  # our own, namespaced
        "        patching.call_private(self, '_unlisted')\n"  # accessor of a name not in the tables
        "        patching.call_private(self, '_load_model')\n"  # listed: fine
        "    return method\n"
        "class Layer(keras.layers.Layer):\n"
        "    _level = 1\n"
        "    def build(self):\n"
        "        self._mine = self._level\n"
        "        return self._mine, self._helper(), self._reduction_axes\n"  # last: a Keras base's
        "    def _helper(self):\n"
        "        self._training_metadata_path = 1\n"  # a table name, written: not ours
        "        return super()._moments(), self._trainable_variables\n"  # a table name off super(); base's
        "    def _compute_gradients(self):\n"
        "        return self._compute_gradients, super()._build_own()\n"  # overridden here: fine; super: base's
    )
    bad.write_text(source)
    try:
        found = base_violations(bad)
    finally:
        bad.unlink()
    text = "\n".join(found)
    assert len(found) == 7, text
    for fragment in ("self._keras_thing", "'_unlisted')", "self._reduction_axes", "self._training_metadata_path",
                     "super()._moments", "self._trainable_variables", "super()._build_own"):
        assert fragment in text, (fragment, text)
    for fragment in ("_mpidist_mine", "_load_model", "self._mine", "_level", "self._helper", "self._compute_gradients"):
        assert fragment not in text, (fragment, text)


def test_no_private_names_of_keras_or_tf_bases_off_self():
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        found.extend(base_violations(path))
    assert not found, (f"{len(found)} private names of Keras/TF base classes or patched objects read off self "
                       "(list them in patching.KERAS_PRIVATE / _tf_private.TF_PRIVATE and use the accessors):\n"
                       + "\n".join(found))
