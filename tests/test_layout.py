"""The package is laid out by stage, and stays that way.

* ``artifactd/`` itself holds only the package's face and a few cross-cutting
  modules (errors, constants, events, hashing...): at most 15 files.
* No module is over 700 lines unless its docstring says why (a paragraph
  starting "Why one module of over 700 lines").
* No import cycle among artifactd's modules at module level: the graph is built
  from each module's top-level imports (imports inside functions and under
  ``if TYPE_CHECKING:`` are not edges, they run later or never).
"""

from __future__ import annotations

import ast
from pathlib import Path

import artifactd

PACKAGE = Path(artifactd.__file__).resolve().parent
MAX_TOP_LEVEL = 15
MAX_LINES = 700
REASON = "Why one module of over 700 lines"


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _top_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """The imports that run when the module is imported: not in functions, not type-only."""
    found: list[ast.Import | ast.ImportFrom] = []
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                todo.extend(node.body)
            todo.extend(node.orelse)
        elif isinstance(node, (ast.Try, ast.With)):
            todo.extend(node.body)
            if isinstance(node, ast.Try):
                for handler in node.handlers:
                    todo.extend(handler.body)
                todo.extend(node.orelse)
                todo.extend(node.finalbody)
        elif isinstance(node, ast.ClassDef):
            todo.extend(node.body)
    return found


def _targets(name: str, node: ast.Import | ast.ImportFrom, modules: set[str]) -> set[str]:
    """The artifactd modules an import statement names."""
    wanted: set[str] = set()
    if isinstance(node, ast.Import):
        wanted = {alias.name for alias in node.names}
    else:
        if node.level:
            base = name.split(".")
            is_package = _modules()[name].name == "__init__.py"
            base = base[: len(base) - node.level + (1 if is_package else 0)]
            source = ".".join([*base, node.module] if node.module else base)
        else:
            source = node.module or ""
        wanted = {source} | {f"{source}.{alias.name}" for alias in node.names}
    # The import names its module exactly; the packages above it are loaded
    # first too, but a package importing its own submodules is how packages work,
    # and a submodule that wants its package's names says so explicitly.
    return {dotted for dotted in wanted if dotted in modules and dotted != name}


def import_graph() -> dict[str, set[str]]:
    """Module -> the artifactd modules it imports at module level."""
    modules = _modules()
    names = set(modules)
    return {
        name: set().union(
            *(_targets(name, n, names) for n in _top_level_imports(ast.parse(path.read_text())))
        )
        for name, path in modules.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (or a self-loop)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_package_top_level_is_small() -> None:
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL, f"{len(top)} modules directly in artifactd/: {top}"


def test_no_module_is_over_700_lines_without_a_stated_reason() -> None:
    too_long = []
    for name, path in _modules().items():
        text = path.read_text()
        lines = text.count("\n")
        if lines > MAX_LINES and REASON not in (ast.get_docstring(ast.parse(text)) or ""):
            too_long.append(f"{name}: {lines} lines")
    assert too_long == [], too_long


def test_no_module_level_import_cycles() -> None:
    found = cycles(import_graph())
    assert found == [], "import cycles among artifactd modules:\n" + "\n".join(
        " <-> ".join(c) for c in found
    )


def test_the_graph_sees_imports() -> None:
    """The checker is not vacuous: it finds known edges and a planted cycle."""
    graph = import_graph()
    assert "artifactd.fingerprint.key" in graph["artifactd.fingerprint.probe"]
    assert "artifactd.restore.resolve" in graph["artifactd.restore.policy"]
    planted = {k: set(v) for k, v in graph.items()}
    planted["artifactd.fingerprint.key"].add("artifactd.fingerprint.probe")
    assert ["artifactd.fingerprint.key", "artifactd.fingerprint.probe"] in cycles(planted)


def test_every_package_ships_in_the_wheel() -> None:
    """pyproject lists packages explicitly: a stage's folder missing there is missing from pip."""
    import tomllib

    listed = set(
        tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["setuptools"][
            "packages"
        ]
    )
    packages = {name for name, path in _modules().items() if path.name == "__init__.py"}
    assert packages - listed == set()
