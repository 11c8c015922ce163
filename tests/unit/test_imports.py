"""No import circles in mpidist: the graph of every import statement (module level and inside
functions alike, since a lazy import that closes a circle only hides it) has no cycle.

An edge ``a -> b`` means module ``a`` uses module ``b``: ``import b``, ``from b import name``,
``from pkg import b`` (b a submodule: an edge to b alone). An edge to a package is an edge to its
``__init__``, and exists where a name is taken from the package itself (``from pkg import name``,
``import pkg``). Ancestors are left out: a module's own, and those of the module it imports
(Python runs ``pkg/__init__`` before ``pkg.b`` whatever the statement says, for ``from pkg import
b`` as for ``from pkg.b import x``; that ``__init__`` re-exporting names from elsewhere is not a use
of them by ``a``).
"""
from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def module_files(root: pathlib.Path, package: str = "mpidist") -> dict[str, tuple[bool, pathlib.Path]]:
    """Dotted module name -> (is a package, its file), for every module of ``package``."""
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts.pop()
        found[".".join(parts)] = (is_pkg, path)
    return found


def imported_names(name: str, is_pkg: bool, tree: ast.AST, modules: dict | None = None) -> set[str]:
    """Every dotted name an import statement anywhere in ``tree`` uses, relative imports resolved:
    for ``from stem import x``, ``stem.x`` when that is a module of ``modules``, else ``stem``."""
    package = name if is_pkg else name.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                stem = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            for alias in node.names:
                dotted = f"{stem}.{alias.name}"
                out.add(dotted if modules is not None and dotted in modules else stem)
    return out


def import_graph(modules: dict[str, tuple[bool, pathlib.Path]]) -> dict[str, set[str]]:
    """Module -> the modules of ``modules`` it imports (see the module docstring)."""
    graph = {}
    for name, (is_pkg, path) in modules.items():
        text = path.read_text()
        ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        targets = set()
        for target in imported_names(name, is_pkg, ast.parse(text), modules):
            while target not in modules and "." in target:  # "pkg.mod.Class" -> "pkg.mod"
                target = target.rsplit(".", 1)[0]
            if target in modules and target != name and target not in ancestors:
                targets.add(target)
        graph[name] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative), each as one
    closed path through it, e.g. ``[a, b, c, a]``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(_path_through(graph, set(component)))
    return found


def _path_through(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest cycle from the component's first module back to it (breadth-first)."""
    first = min(component)
    previous: dict[str, str] = {}
    queue = [first]
    while queue:
        node = queue.pop(0)
        for child in sorted(graph[node] & component):
            if child == first:
                path = [node]
                while path[-1] != first:
                    path.append(previous[path[-1]])
                return path[::-1] + [first]
            if child not in previous:
                previous[child] = node
                queue.append(child)
    raise AssertionError(f"no cycle through {first} in its own component")  # cannot happen


def test_mpidist_has_no_import_cycles():
    graph = import_graph(module_files(ROOT))
    assert len(graph) > 50 and graph["mpidist.strategies.base"]  # the graph really was built
    found = cycles(graph)
    assert not found, "import cycles (break each: move the shared part down, or register from above):\n" + \
        "\n".join("  " + " -> ".join(c) for c in found)


def test_finds_a_cycle_closed_by_a_function_level_import(tmp_path):
    """The checker itself: a lazy import inside a function still closes a circle."""
    pkg = tmp_path / "mpidist"
    (pkg / "sub").mkdir(parents=True)
    sources = {
        "mpidist": "from .sub import a\n",
        "mpidist.sub": "",
        "mpidist.sub.a": "from . import b\n",
        "mpidist.sub.b": "def f():\n    from .c import thing\n    return thing\n",
        "mpidist.sub.c": "from ..sub.a import x\n",
        "mpidist.sub.d": "import mpidist.sub.a\n",
    }
    for name, text in sources.items():
        parts = name.split(".")
        path = tmp_path.joinpath(*parts, "__init__.py") if name in ("mpidist", "mpidist.sub") \
            else tmp_path.joinpath(*parts).with_suffix(".py")
        path.write_text(text)
    graph = import_graph(module_files(tmp_path))
    assert graph["mpidist.sub.b"] == {"mpidist.sub.c"}
    assert graph["mpidist.sub.a"] == {"mpidist.sub.b"}  # its parent package is not an edge
    assert cycles(graph) == [["mpidist.sub.a", "mpidist.sub.b", "mpidist.sub.c", "mpidist.sub.a"]]
    del sources["mpidist.sub.c"]
    (tmp_path / "mpidist" / "sub" / "c.py").write_text("x = 1\n")
    assert cycles(import_graph(module_files(tmp_path))) == []


def test_tools_have_no_import_cycles():
    graph = import_graph(module_files(ROOT, "tools"))
    assert "tools.costmodel.fit" in graph
    assert not cycles(graph), cycles(graph)
