"""The package is laid out by stage, and stays that way.

* ``artifactd/`` itself holds only the package's face and a few cross-cutting
  modules (errors, constants, events, hashing...): at most 15 files.
* No module is over 700 lines unless its docstring says why (a paragraph
  starting "Why one module of over 700 lines").
* No import cycle among artifactd's modules at module level: the graph is built
  from each module's top-level imports (imports inside functions and under
  ``if TYPE_CHECKING:`` are not edges, they run later or never).
* The stage order is a rule (import-linter's "layers" contract is the model):
  no module imports a module of a higher stage, at module level or inside a
  function; only ``if TYPE_CHECKING:`` imports are exempt. The order is
  :data:`STAGES`; each exception is named in :data:`STAGE_EXCEPTIONS` with its
  reason.
* No run-time import cycle at all (function-local imports counted, the named
  exceptions too): only typing-only pairs may point both ways. An edge is the
  module an import names: ``from pkg import sub`` names ``pkg.sub``, as
  ``import pkg.sub`` does, and ``pkg`` only for a name that is not a submodule.
* Imports sit at module level (ruff's PLC0415 is on): a function-local import
  carries ``# noqa: PLC0415`` and its reason, except in the modules that are lazy
  by design (the fast path, the click command modules), which pyproject.toml
  names, and only those.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Any

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
        submodules = {f"{source}.{alias.name}" for alias in node.names} & modules
        # ``from pkg import sub`` names the module ``pkg.sub``, as ``import
        # pkg.sub`` does; it names ``pkg`` itself only for a name that is not a
        # submodule (a function, a class, a constant of the package).
        whole = len(submodules) < len(node.names) or any(a.name == "*" for a in node.names)
        wanted = submodules | ({source} if whole else set())
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
    if sys.version_info >= (3, 11):
        # lazy: tomllib from 3.11, tomli before (the dev extra)
        import tomllib  # noqa: PLC0415
    else:  # the same parser before 3.11 (the dev extra installs it there)
        # lazy: tomllib from 3.11, tomli before (the dev extra)
        import tomli as tomllib  # noqa: PLC0415

    listed = set(
        tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["setuptools"][
            "packages"
        ]
    )
    packages = {name for name, path in _modules().items() if path.name == "__init__.py"}
    assert packages - listed == set()


# --- The stage order --------------------------------------------------------

#: The stages, lowest first. A module may import its own stage and the stages
#: below it, never one above: at module level, inside a function, or anywhere
#: else that runs (only ``if TYPE_CHECKING:`` imports are exempt: they never
#: run). Each stage names its package, or the modules directly in artifactd/.
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "foundation",
        (
            "artifactd",
            "artifactd.constants",
            "artifactd.errors",
            "artifactd.events",
            "artifactd.hashing",
            "artifactd.fsutil",
            "artifactd.bounds",
            "artifactd.jsontext",
            "artifactd.records",
            "artifactd.boundedhttp",
            "artifactd.megacache",
            "artifactd.workers",
        ),
    ),
    ("families", ("artifactd.families",)),
    ("fingerprint", ("artifactd.fingerprint",)),
    ("format", ("artifactd.format",)),
    ("trust", ("artifactd.trust",)),
    ("stores", ("artifactd.stores",)),
    ("lint", ("artifactd.lint",)),
    ("restore", ("artifactd.restore",)),
    ("images", ("artifactd.images",)),
    ("pod", ("artifactd.pod",)),
    ("build", ("artifactd.build",)),
    ("reports", ("artifactd.reports", "artifactd.schemas")),
    ("cli", ("artifactd.cli", "artifactd.__main__")),
)
STAGE_RULE = " < ".join(name for name, _ in STAGES)

#: Imports allowed against the order, each with its reason: (importer, imported).
_LATER = "moved in a later change: "
STAGE_EXCEPTIONS: dict[tuple[str, str], str] = {
    ("artifactd.pod.readiness", "artifactd.build.matrix"): _LATER
    + "status --matrix finds the serve cell with build.matrix; the lookup belongs in build/ or "
    "the CLI, which would hand pod/ the cell",
    ("artifactd.pod.status", "artifactd.reports"): _LATER
    + "status builds its --json document with reports.jsonable/versioned; those two helpers "
    "belong below pod/ (the report documents stay in reports.py)",
}


def stage_of(module: str) -> int:
    """The rank of ``module``'s stage in :data:`STAGES` (modules directly in artifactd/ by name)."""
    for rank, (_, members) in enumerate(STAGES):
        for member in members:
            if module == member or (member != "artifactd" and module.startswith(member + ".")):
                return rank
    raise AssertionError(f"{module} has no stage: add it to STAGES in tests/test_layout.py")


def _runtime_imports(tree: ast.Module) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import that may run, and whether it is in a function (``TYPE_CHECKING`` skipped)."""
    found: list[tuple[ast.Import | ast.ImportFrom, bool]] = []
    todo: list[tuple[ast.AST, bool]] = [(node, False) for node in tree.body]
    while todo:
        node, local = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append((node, local))
            continue
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            todo.extend((child, local) for child in node.orelse)
            continue
        inner = local or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        todo.extend((child, inner) for child in ast.iter_child_nodes(node))
    return found


def stage_violations(
    exceptions: dict[tuple[str, str], str] = STAGE_EXCEPTIONS,
    extra: dict[str, str] | None = None,
) -> list[str]:
    """Each import of a higher stage, as ``path:LINE imports module (stage X above stage Y)``.

    ``extra`` maps a module name to a source text that replaces (or adds) that
    module, so a test can plant an import.
    """
    modules = _modules()
    sources = {name: path.read_text() for name, path in modules.items()} | (extra or {})
    names = set(sources)
    found: list[tuple[str, int, str]] = []
    for name, text in sorted(sources.items()):
        rank = stage_of(name)
        path = modules.get(name)
        where = (
            path.relative_to(PACKAGE.parent) if path else Path(*name.split(".")).with_suffix(".py")
        )
        for node, _ in _runtime_imports(ast.parse(text)):
            for target in sorted(_targets(name, node, names)):
                above = stage_of(target)
                if above > rank and (name, target) not in exceptions:
                    found.append(
                        (
                            str(where),
                            node.lineno,
                            f"{where}:{node.lineno} imports {target} (stage {STAGES[above][0]} "
                            f"above stage {STAGES[rank][0]}): rule {STAGE_RULE}",
                        )
                    )
    return [line for *_, line in sorted(found)]


def runtime_import_graph() -> dict[str, set[str]]:
    """Module -> the artifactd modules it may import when it runs (function-local included)."""
    modules = _modules()
    names = set(modules)
    return {
        name: set().union(
            *(
                _targets(name, node, names)
                for node, _ in _runtime_imports(ast.parse(path.read_text()))
            )
        )
        for name, path in modules.items()
    }


def test_no_module_imports_a_higher_stage() -> None:
    found = stage_violations()
    assert found == [], "imports against the stage order:\n" + "\n".join(found)


def test_every_stage_exception_is_still_needed() -> None:
    """A named exception whose import is gone is removed, so the list stays the real debt."""
    graph = runtime_import_graph()
    stale = [pair for pair in STAGE_EXCEPTIONS if pair[1] not in graph.get(pair[0], set())]
    assert stale == [], f"exceptions that no import needs any more: {stale}"
    assert all(reason.strip() for reason in STAGE_EXCEPTIONS.values())


def test_the_stage_rule_sees_function_local_imports() -> None:
    """The rule is not vacuous: a planted climb is caught at module level and in a function."""
    planted = {
        "artifactd.format.planted": (
            "from typing import TYPE_CHECKING\n"
            "import artifactd.cli\n"
            "if TYPE_CHECKING:\n"
            "    from artifactd.build import run\n"
            "def f():\n"
            "    def g():\n"
            "        from artifactd.restore.policy import run_restore\n"
        )
    }
    found = [v for v in stage_violations(extra=planted) if "format/planted.py" in v]
    assert [v.split(" (")[0] for v in found] == [
        "artifactd/format/planted.py:2 imports artifactd.cli",
        "artifactd/format/planted.py:7 imports artifactd.restore.policy",
    ], found
    assert "(stage restore above stage format): rule foundation < families" in found[1]


def test_no_runtime_import_cycle() -> None:
    """No run-time cycle at all: function-local imports counted, named exceptions too.

    Only typing-only pairs (``if TYPE_CHECKING:`` imports, which never run) may
    point both ways. A function-local import that closes a circle is still a
    circle: it runs on the first call, and the two modules can no longer be
    understood, tested or moved one without the other.
    """
    found = cycles(runtime_import_graph())
    assert found == [], "run-time import cycles among artifactd modules:\n" + "\n".join(
        " <-> ".join(c) for c in found
    )


def test_the_runtime_graph_sees_function_local_imports() -> None:
    """The cycle check is not vacuous: a function-local edge counts, a typing-only one not."""
    graph = runtime_import_graph()
    # probe.py imports the model inside functions only (pydantic stays off the fast path).
    assert "artifactd.fingerprint.model" in graph["artifactd.fingerprint.probe"]
    assert "artifactd.fingerprint.model" not in import_graph()["artifactd.fingerprint.probe"]
    planted = {k: set(v) for k, v in graph.items()}
    planted["artifactd.fingerprint.model"].add("artifactd.fingerprint.probe")
    assert ["artifactd.fingerprint.model", "artifactd.fingerprint.probe"] in cycles(planted)
    typing_only = ast.parse(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import artifactd.cli\n"
    )
    assert [ast.unparse(n) for n, _ in _runtime_imports(typing_only)] == [
        "from typing import TYPE_CHECKING"
    ]


def test_from_package_import_submodule_names_the_submodule() -> None:
    """``from pkg import sub`` is an edge to ``pkg.sub`` (as ``import pkg.sub``), not to ``pkg``."""
    names = set(_modules())
    node = ast.parse("from artifactd.cli import render").body[0]
    assert isinstance(node, ast.ImportFrom)
    assert _targets("artifactd.cli.stores", node, names) == {"artifactd.cli.render"}
    node = ast.parse("from artifactd.cli import main, cli").body[0]
    assert isinstance(node, ast.ImportFrom)
    assert _targets("artifactd.__main__", node, names) == {"artifactd.cli", "artifactd.cli.main"}


# --- Imports at module level -------------------------------------------------

#: The modules that are lazy by design, excepted from ruff's PLC0415 in
#: pyproject.toml: the pod-start fast path and the click command modules that
#: the app registers (each imports the library its commands call inside them).
LAZY_BY_DESIGN = "artifactd.cli.fast"


def _ruff_config() -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib  # noqa: PLC0415  # lazy: tomllib from 3.11, tomli before (the dev extra)
    else:
        import tomli as tomllib  # noqa: PLC0415
    lint: dict[str, Any] = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"][
        "ruff"
    ]["lint"]
    return lint


def _has_reason(lines: list[str], lineno: int) -> bool:
    """``# noqa: PLC0415`` on the import's line and a reason: after it, or in a comment above.

    The comment above may head a run of such imports (blank lines between
    isort's groups included).
    """
    line = lines[lineno - 1]
    if "# noqa: PLC0415" not in line:
        return False
    if "#" in line.split("# noqa: PLC0415", 1)[1]:
        return True
    above = lineno - 2
    while above >= 0 and (not lines[above].strip() or "# noqa: PLC0415" in lines[above]):
        if "# noqa: PLC0415" in lines[above] and "#" in lines[above].split("# noqa: PLC0415")[1]:
            return True
        above -= 1
    return above >= 0 and lines[above].strip().startswith("#")


def test_imports_sit_at_module_level_unless_a_reason_is_given() -> None:
    """PLC0415 is on; a function-local import says why, except in the lazy-by-design modules."""
    lint = _ruff_config()
    assert "PLC0415" not in lint.get("ignore", []), "PLC0415 is ignored project-wide"
    excepted = sorted(
        pattern for pattern, codes in lint["per-file-ignores"].items() if "PLC0415" in codes
    )
    from artifactd.cli import app  # noqa: PLC0415  # lazy: click, for this test only

    commands = sorted(
        name.rsplit(".", 1)[1]
        for name in runtime_import_graph()["artifactd.cli.app"]
        if name != "artifactd.cli.group"
    )
    assert set(commands) <= set(app.__all__)
    assert excepted == [
        "artifactd/cli/fast.py",
        "artifactd/cli/{" + ",".join(commands) + "}.py",
    ], "only the fast path and the command modules are lazy by design"
    excepted_modules = {LAZY_BY_DESIGN} | {f"artifactd.cli.{c}" for c in commands}
    unexplained = []
    for name, path in _modules().items():
        if name in excepted_modules:
            continue
        lines = path.read_text().splitlines()
        for node, local in _runtime_imports(ast.parse(path.read_text())):
            if local and not _has_reason(lines, node.lineno):
                unexplained.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert unexplained == [], "function-local imports without noqa and a reason:\n" + "\n".join(
        sorted(unexplained)
    )
