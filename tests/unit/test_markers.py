"""Where a test file runs is said by pytest markers, declared in one place (pyproject.toml) and read
by tests/run's ``-m`` expressions (tests/README.md): a file named for the Keras 2 step carries its
marker (else it would silently never run), a file of that step skips itself elsewhere, every marker
a test file or tests/run uses is declared, and --strict-markers makes any other name an error."""
from __future__ import annotations

import ast
import pathlib
import re

import pytest

TESTS = pathlib.Path(__file__).resolve().parents[1]
RUN = TESTS / "run"
# markers of pytest itself and of its plugins the tests use (pytest-mpi's `mpi`)
PLUGIN_MARKERS = {"parametrize", "skip", "skipif", "xfail", "usefixtures", "filterwarnings", "mpi"}
# the markers tests/run selects by, each with the step it decides
SELECTING = {"keras2", "node_layout", "two_nodes"}


def marker_names(node: ast.AST) -> set[str]:
    """The X of every ``pytest.mark.X`` under ``node``."""
    return {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute)
            and n.value.attr == "mark" and isinstance(n.value.value, ast.Name) and n.value.value.id == "pytest"}


def module_markers(path: pathlib.Path) -> set[str]:
    """The markers of a file's module-level ``pytestmark`` (read from its source: a Keras 2 file skips
    itself at import elsewhere, before pytest could see its marks)."""
    found: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in targets):
                found |= marker_names(node.value)
    return found


def declared(pytestconfig) -> set[str]:
    return {line.split(":")[0].split("(")[0].strip() for line in pytestconfig.getini("markers")}


MPI_FILES = sorted((TESTS / "mpi").glob("test_*.py"))


def test_the_markers_tests_run_selects_by_are_declared_with_strict_markers(pytestconfig):
    names = declared(pytestconfig)
    assert SELECTING <= names, SELECTING - names
    assert "--strict-markers" in pytestconfig.getini("addopts")


def test_tests_run_selects_by_declared_markers_and_names_no_file_of_tests_mpi():
    text = RUN.read_text()
    # `-m EXPR` of pytest, not `"$PYTHON" -m MODULE`
    expressions = re.findall(r'(?<!"\$PYTHON" )-m ("[^"]*"|\w+)', text)
    used = {word for e in expressions for word in e.strip('"').split() if word not in ("and", "or", "not")}
    assert used == SELECTING, expressions  # each marker decides a step
    assert not re.findall(r"tests/mpi/test_\w+\.py", text), "tests/run names files: mark them instead"


@pytest.mark.parametrize("path", [p for p in MPI_FILES if p.name.startswith("test_keras2_")], ids=lambda p: p.name)
def test_every_keras2_file_carries_the_keras2_marker(path):
    assert "keras2" in module_markers(path), f"{path.name}: pytestmark lacks pytest.mark.keras2: it would never run"


@pytest.mark.parametrize("path", [p for p in MPI_FILES if "keras2" in module_markers(p)], ids=lambda p: p.name)
def test_every_keras2_marked_file_skips_itself_outside_keras_2(path):
    """The other tests/mpi launches run every file: a Keras 2 file must skip itself there (at import,
    before its Keras 2 code runs) instead of failing under Keras 3."""
    source = path.read_text()
    assert "is_keras2()" in source and "allow_module_level=True" in source, path.name


def test_every_marker_a_test_uses_is_declared(pytestconfig):
    names = declared(pytestconfig) | PLUGIN_MARKERS
    for path in sorted(TESTS.rglob("*.py")):
        if ".logs" in path.parts:
            continue
        unknown = marker_names(ast.parse(path.read_text())) - names
        assert not unknown, f"{path.relative_to(TESTS)}: undeclared marker(s) {sorted(unknown)} (pyproject.toml)"


def test_the_markers_are_found_where_the_readme_says():
    readme = (TESTS / "README.md").read_text()
    for name in SELECTING:
        assert f"`{name}`" in readme, name
