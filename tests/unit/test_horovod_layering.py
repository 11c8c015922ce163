"""mpidist.horovod sits above every library layer: none of them imports it; the command line
(``mpidist bench v1``, ``mpidist run``), the one layer above, imports it only inside a function, when
that command runs; ``import mpidist`` does not load it, ``import mpidist.horovod`` loads no
framework, and it takes only public names from the rest of mpidist."""
from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2] / "mpidist"
HOROVOD = ROOT / "horovod"


COMMAND_LINE = {"__main__", "launch", "bench", "check", "info", "soak", "timeline"}  # mpidist.<these>


def _imports(path: pathlib.Path, top_level_only: bool = False):
    """(absolute module, imported names) of every import in ``path`` (with ``top_level_only``, only
    those outside functions: what importing the module runs)."""
    rel = path.relative_to(ROOT.parent).with_suffix("")
    package = list(rel.parts[:-1]) if rel.parts[-1] != "__init__" else list(rel.parts[:-1])
    tree = ast.parse(path.read_text())
    nodes = ast.walk(tree)
    if top_level_only:
        inside = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                  for n in ast.walk(f)}
        nodes = (n for n in ast.walk(tree) if id(n) not in inside)
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            yield module, [a.name for a in node.names]


def _others():
    return [p for p in sorted(ROOT.rglob("*.py")) if HOROVOD not in p.parents]


@pytest.mark.parametrize("path", _others(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_lower_layer_imports_horovod(path):
    command_line = path.relative_to(ROOT).parts[0].removesuffix(".py") in COMMAND_LINE
    for module, names in _imports(path, top_level_only=command_line):
        full = [module] + [f"{module}.{n}" for n in names]
        assert not any(m == "mpidist.horovod" or m.startswith("mpidist.horovod.") for m in full), \
            f"{path.relative_to(ROOT)} imports {module} {names}"


@pytest.mark.parametrize("path", sorted(HOROVOD.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_horovod_uses_only_public_names_of_other_layers(path):
    for module, names in _imports(path):
        if not module.startswith("mpidist") or module.startswith("mpidist.horovod"):
            continue
        private = [n for n in names if n.startswith("_")]
        assert not private, f"{path.relative_to(ROOT)} takes private names {private} from {module}"


def test_scanner_resolves_relative_imports():
    sample = ROOT / "strategies" / "base.py"
    found = [m for m, _ in _imports(sample)]
    assert any(m.startswith("mpidist.") for m in found)  # the scanner resolves relative imports


def test_import_mpidist_does_not_load_horovod_or_frameworks():
    code = ("import sys, mpidist\n"
            "assert not [m for m in sys.modules if m.startswith('mpidist.horovod')]\n"
            "import mpidist.horovod\n"
            "heavy = [m for m in ('tensorflow', 'keras') if m in sys.modules]\n"
            "assert not heavy, heavy\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
