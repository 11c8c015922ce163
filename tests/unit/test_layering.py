"""Imports flow one way: topology → collectives → cross-device → values → input → strategies →
tensorflow (its core → its keras/ patches) → horovod → the public namespace (the strategy classes)
and the command line. A lower layer never
reaches a higher one: not by an import statement, not by a module name in a string
(``importlib.import_module("mpidist.x")``, ``__import__``, ``sys.modules["mpidist.x"]``), not by
an import whose module name is computed (where it cannot be checked), and no module registers
anything with another package when it is imported (the upper layer handing the lower one a
function or module to call back). Nor does it import TensorFlow/CuPy at import time. Every package
and module directly under mpidist/ has a place in LAYERS: a new one fails here until it is given one."""
from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2] / "mpidist"
TOP = 9
LAYERS = {  # first dotted component after "mpidist." -> layer: exactly what exists under mpidist/
    "_version": 0, "errors": 0, "_config": 0, "validation": 0, "files": 0,
    "topology": 1, "collectives": 2, "cluster_resolver": 2, "cross_device": 3, "values": 4, "input": 5,
    "strategies": 6,
    # the TensorFlow integration, Keras's patches included (mpidist/tensorflow/keras): ordered inside by SUBLAYERS
    "tensorflow": 7,
    "horovod": 8,
    # the public namespace (frameworks: the framework choice) and the command line (run and horovodrun:
    # launch; check, info, bench, soak, timeline)
    "frameworks": TOP, "cross_device_ops": TOP, "on_tensorflow": TOP, "checkpoint": TOP, "experimental": TOP, "overlap": TOP,
    "__main__": TOP, "launch": TOP, "check": TOP, "info": TOP, "bench": TOP, "soak": TOP, "timeline": TOP,
    "elastic": TOP,
}
# Inside a package: the first component after "mpidist.<package>." -> sub-layer (0 when not named; the
# package's own __init__ re-exports, above them all). mpidist.tensorflow: the core (strategy, extended,
# checkpoint, the patch registry) -> keras/ (the Keras patches, which use the core); the strategy classes
# that install the patches are in the top layer (frameworks, on_tensorflow).
SUBLAYERS = {"tensorflow": {"keras": 1}}
HEAVY = ("tensorflow", "keras", "cupy", "cupyx", "jax", "torch")
DYNAMIC = "<a module name computed at run time>"
# modules whose import_module(name) takes a computed name, and why that cannot reach mpidist
COMPUTED_IMPORTS = {
    "mpidist.tensorflow._tf_private": "TensorFlow's private modules, by the names in its own table",
    "mpidist.tensorflow.patching": "tf_keras's private modules, by the names in its own table (TF_KERAS_INTERNALS)",
    "mpidist.launch.aliases": "mpidist.horovod's modules, by the horovod.* name a program imports (a layer below)",
}
INTEGRATIONS = {"tensorflow", "horovod"}  # framework packages: may import their framework


def layer(module: str) -> int:
    parts = module.split(".")
    if len(parts) == 1:
        return TOP  # mpidist/__init__.py: the public namespace
    if parts[1] not in LAYERS:
        raise KeyError(f"{module}: mpidist.{parts[1]} has no layer in LAYERS (tests/unit/test_layering.py)")
    return LAYERS[parts[1]]


def sublayer(module: str, is_pkg: bool = False) -> float:
    """The sub-layer of ``module`` inside its package (SUBLAYERS); a package's own __init__ is above all."""
    parts = module.split(".")
    table = SUBLAYERS.get(parts[1], {}) if len(parts) > 1 else {}
    if len(parts) == 2:
        return float("inf")
    return table.get(parts[2], 0)


def modules():
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        parts = list(rel.parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts.pop()
        yield ".".join(parts), is_pkg, path


def imports(name: str, is_pkg: bool, tree: ast.AST):
    """(imported module, at module level?) for every import statement in the module."""
    package = name if is_pkg else name.rsplit(".", 1)[0]
    top_level = {id(n) for n in ast.walk(tree) if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    funcs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    nested = {id(x) for f in funcs for x in ast.walk(f) if x is not f}
    for node in ast.walk(tree):
        module_level = id(node) in top_level and id(node) not in nested
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, module_level
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            if not (name == stem or name.startswith(stem + ".")):  # its own packages are loaded already
                yield stem, module_level
            for alias in node.names:  # "from .x import y" may import submodule (or subpackage) y
                if is_module(f"{stem}.{alias.name}"):
                    yield f"{stem}.{alias.name}", module_level
        elif isinstance(node, ast.Call) and _call_name(node.func) in ("import_module", "__import__"):
            yield _imported_by_call(node, package, _string_constants(tree)), module_level
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("mpidist.") \
                and is_module(node.value):  # a module named in a string: a side door (sys.modules[...], a table)
            yield node.value, False


def _call_name(func: ast.AST) -> str | None:
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _string_constants(tree: ast.AST) -> dict[str, str]:
    """Module-level ``NAME = "string"`` assignments (what an import_module(NAME) may name)."""
    return {t.id: n.value.value for n in getattr(tree, "body", []) if isinstance(n, ast.Assign)
            and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
            for t in n.targets if isinstance(t, ast.Name)}


def _imported_by_call(call: ast.Call, package: str, constants: dict[str, str]) -> str:
    """The module ``import_module(name, package)`` / ``__import__(name)`` loads, or DYNAMIC."""
    arg = call.args[0] if call.args else None
    name = arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else \
        constants.get(arg.id) if isinstance(arg, ast.Name) else None
    if name is None:
        return DYNAMIC
    if name.startswith("."):  # relative to the package argument: this module's package is all we allow
        level = len(name) - len(name.lstrip("."))
        base = package.split(".")
        return ".".join(base[: len(base) - level + 1] + ([name.lstrip(".")] if name.lstrip(".") else []))
    return name


def is_module(dotted: str) -> bool:
    path = ROOT.parent.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


ALL = list(modules())


@pytest.mark.parametrize("name, is_pkg, path", ALL, ids=[m[0] for m in ALL])
def test_no_upward_or_heavy_imports(name, is_pkg, path):
    own = layer(name)
    for target, module_level in imports(name, is_pkg, ast.parse(path.read_text())):
        if target == DYNAMIC:
            assert own == TOP or name in COMPUTED_IMPORTS, \
                f"{name} (layer {own}) imports a module whose name it computes: nothing can check that it " \
                f"does not reach a higher layer (import it by name, or list it in COMPUTED_IMPORTS with why)"
        elif target == "mpidist" or target.startswith("mpidist."):
            if name.split(".")[:2] == target.split(".")[:2]:  # inside its own package: by SUBLAYERS
                assert name.split(".")[1] not in SUBLAYERS or sublayer(target) <= sublayer(name, is_pkg), \
                    f"{name} (sub-layer {sublayer(name, is_pkg)} of mpidist.{name.split('.')[1]}) imports {target} " \
                    f"(sub-layer {sublayer(target)})"
                continue
            assert layer(target) <= own, f"{name} (layer {own}) imports {target} (layer {layer(target)})"
        elif module_level and (name.split(".") + [""])[1] not in INTEGRATIONS:
            assert target.split(".")[0] not in HEAVY, f"{name} imports {target} at import time"


def registrations(name: str, tree: ast.AST, imported_from: dict[str, str]):
    """Calls a module makes when it is imported (statements outside functions and classes) to a
    function of another mpidist package, or setattr on one of its objects: ``(call text, package)``."""
    own = ".".join(name.split(".")[:2])
    work = list(getattr(tree, "body", []))
    while work:
        node = work.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            call = node.value
            target = call.args[0] if _call_name(call.func) == "setattr" and call.args else call.func
            while isinstance(target, (ast.Attribute, ast.Call, ast.Subscript)):
                target = target.value if not isinstance(target, ast.Call) else target.func
            source = imported_from.get(target.id, "") if isinstance(target, ast.Name) else ""
            if source.startswith("mpidist") and ".".join(source.split(".")[:2]) != own:
                yield ast.unparse(call), source
        work.extend(child for child in ast.iter_child_nodes(node) if isinstance(child, ast.stmt))


def imported_from(name: str, is_pkg: bool, tree: ast.AST) -> dict[str, str]:
    """Local name -> the mpidist module (or package) it was imported from, for module-level imports."""
    package = name if is_pkg else name.rsplit(".", 1)[0]
    found = {}
    for node in getattr(tree, "body", []):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")
            stem = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else [])) \
                if node.level else node.module or ""
            for alias in node.names:
                dotted = f"{stem}.{alias.name}"
                found[alias.asname or alias.name] = dotted if is_module(dotted) else stem
        elif isinstance(node, ast.Import):
            for alias in node.names:
                found[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else \
                    alias.name.split(".")[0]
    return found


@pytest.mark.parametrize("name, is_pkg, path", ALL, ids=[m[0] for m in ALL])
def test_importing_a_module_registers_nothing_elsewhere(name, is_pkg, path):
    """A registry filled at import time (``lower.register_x(this)``) lets a lower layer call a
    higher one unseen by the import graph: importing a module changes no other package's state."""
    tree = ast.parse(path.read_text())
    found = list(registrations(name, tree, imported_from(name, is_pkg, tree)))
    assert not found, f"{name} calls into another package when imported: {found}"


def test_layer_map_matches_the_package_exactly():
    """Every package or module directly under mpidist/ has a layer, and every layer entry exists."""
    present = {p.stem if p.is_file() else p.name for p in ROOT.iterdir()
               if (p.is_file() and p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").is_file()}
    assert present - set(LAYERS) == set(), "give these a layer in LAYERS"
    assert set(LAYERS) - present == set(), "these LAYERS entries name nothing under mpidist/"
    assert INTEGRATIONS <= set(LAYERS)


def test_layer_map_catches_an_upward_import():
    tree = ast.parse("from ..strategies import x\nimport tensorflow")
    found = list(imports("mpidist.collectives.engine", False, tree))
    assert ("mpidist.strategies", True) in found and ("tensorflow", True) in found
    assert layer("mpidist.strategies") > layer("mpidist.collectives.engine")


def test_sublayers_catch_an_upward_import_inside_tensorflow():
    """The core may not import the Keras patches, nor either of them the strategy classes (top layer)."""
    for name, code in (("mpidist.tensorflow.strategy", "from .keras import patching_user\n"),
                       ("mpidist.tensorflow.preemption", "from .. import on_tensorflow\n"),
                       ("mpidist.tensorflow.keras.shuffle", "from ...on_tensorflow import MirroredStrategy\n")):
        tree = ast.parse(code)
        found = [t for t, _ in imports(name, False, tree) if t.startswith("mpidist.")]
        assert found and any(layer(t) > layer(name) or sublayer(t) > sublayer(name) for t in found), (name, found)
    assert sublayer("mpidist.tensorflow.keras.shuffle") < sublayer("mpidist.tensorflow", True)


def test_layer_map_reads_module_names_in_strings():
    """The side doors strategies/backends.py and cross_device/ops.py had: a plugin loaded by name."""
    tree = ast.parse("import importlib, sys\nPLUGIN = 'mpidist.tensorflow'\n"
                     "def load():\n    return importlib.import_module(PLUGIN)\n"
                     "def keras():\n    return __import__('mpidist.tensorflow.keras')\n"
                     "def loaded():\n    return sys.modules.get('mpidist.horovod')\n"
                     "def rel():\n    return importlib.import_module('..frameworks', __package__)\n"
                     "def any_of(name):\n    return importlib.import_module(name)\n")
    found = set(imports("mpidist.strategies.backends", False, tree))
    assert {("mpidist.tensorflow", False), ("mpidist.tensorflow.keras", False), ("mpidist.horovod", False),
            ("mpidist.frameworks", False), (DYNAMIC, False)} <= found
    assert all(layer(t) > layer("mpidist.strategies") for t, _ in found if t.startswith("mpidist."))


def test_registrations_at_import_time_are_found():
    """The side doors mpidist.input, experimental and tensorflow/cross_device.py had."""
    code = ("from ..strategies import base as _base\nfrom ..strategies.concrete import register as _reg\n"
            "from ..cross_device import ops as ops_lib\nfrom . import api\nimport logging\n"
            "_base.register_input_layer(api)\n_reg(api)\nlogging.getLogger('mpidist').info('x')\n"
            "for n in ('reduce',):\n    setattr(ops_lib.CrossDeviceOps, n, None)\n"
            "api.local_call()\n")
    tree = ast.parse(code)
    found = list(registrations("mpidist.input", tree, imported_from("mpidist.input", True, tree)))
    assert sorted(source for _, source in found) == ["mpidist.cross_device.ops", "mpidist.strategies.base",
                                                     "mpidist.strategies.concrete"], found


def test_import_and_use_without_tensorflow():
    code = ("import sys, numpy as np, mpidist\n"
            "e = mpidist.Engine()\n"
            "assert e.allreduce({'a': np.ones(3)}, 'mean')['a'].tolist() == [1, 1, 1]\n"
            "heavy = [m for m in ('tensorflow', 'keras', 'cupy') if m in sys.modules]\n"
            "assert not heavy, heavy\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_modules_stay_small():
    big = {name: n for name, _, path in ALL if (n := len(path.read_text().splitlines())) > 450}
    assert not big, f"split these modules by topic: {big}"
