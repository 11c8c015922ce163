"""Imports flow one way: topology → collectives → cross-device → values → strategies → input /
tensorflow → the public namespace and the command line. A lower layer never imports a higher one,
nor TensorFlow/CuPy at import time. Every package and module directly under mpidist/ has a place in
LAYERS: a new one fails here until it is given one."""
from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2] / "mpidist"
TOP = 9
LAYERS = {  # first dotted component after "mpidist." -> layer: exactly what exists under mpidist/
    "_version": 0, "errors": 0, "_config": 0, "validation": 0,
    "topology": 1, "collectives": 2, "cross_device": 3, "values": 4, "strategies": 5,
    "input": 6, "tensorflow": 6, "keras": 7, "horovod": 8,
    # the public namespace and the command line (check, info, bench, soak, timeline)
    "cluster_resolver": TOP, "checkpoint": TOP, "experimental": TOP, "numpy": TOP, "overlap": TOP,
    "__main__": TOP, "check": TOP, "info": TOP, "bench": TOP, "soak": TOP, "timeline": TOP, "elastic": TOP,
}
HEAVY = ("tensorflow", "keras", "cupy", "cupyx", "jax", "torch")
INTEGRATIONS = {"tensorflow", "keras", "horovod"}  # framework packages: may import their framework


def layer(module: str) -> int:
    parts = module.split(".")
    if len(parts) == 1:
        return TOP  # mpidist/__init__.py: the public namespace
    if parts[1] not in LAYERS:
        raise KeyError(f"{module}: mpidist.{parts[1]} has no layer in LAYERS (tests/unit/test_layering.py)")
    return LAYERS[parts[1]]


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


def is_module(dotted: str) -> bool:
    path = ROOT.parent.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


ALL = list(modules())


@pytest.mark.parametrize("name, is_pkg, path", ALL, ids=[m[0] for m in ALL])
def test_no_upward_or_heavy_imports(name, is_pkg, path):
    own = layer(name)
    for target, module_level in imports(name, is_pkg, ast.parse(path.read_text())):
        if target == "mpidist" or target.startswith("mpidist."):
            if name.split(".")[:2] == target.split(".")[:2]:
                continue  # inside its own layer
            assert layer(target) <= own, f"{name} (layer {own}) imports {target} (layer {layer(target)})"
        elif module_level and (name.split(".") + [""])[1] not in INTEGRATIONS:
            assert target.split(".")[0] not in HEAVY, f"{name} imports {target} at import time"


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
