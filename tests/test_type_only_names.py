"""A name imported for type checkers only is never used where the code runs.

Modules on the pod-start path import their types under ``if TYPE_CHECKING:``
with ``TYPE_CHECKING = False`` (``artifactd/cli/fast.py`` says why): such a
name exists for mypy and not at run time, and mypy cannot tell when code uses
it at run time (with ``from __future__ import annotations`` every annotation
is a string). This reads every module: a name bound only under
``if TYPE_CHECKING:`` may appear in annotations and in that block, nowhere else.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "artifactd"


def _is_type_checking(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.If)
        and isinstance(node.test, ast.Name)
        and (node.test.id == "TYPE_CHECKING")
    )


def _bound(nodes: list[ast.stmt]) -> set[str]:
    names: set[str] = set()
    for statement in nodes:
        for node in ast.walk(statement):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names |= {(a.asname or a.name).split(".")[0] for a in node.names}
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def _annotation_ids(tree: ast.Module) -> set[int]:
    """Every node inside an annotation or a TYPE_CHECKING block (never evaluated)."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        parts: list[ast.AST | None] = []
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            a = node.args
            parts += [x.annotation for x in [*a.posonlyargs, *a.args, *a.kwonlyargs]]
            parts += [x.annotation for x in (a.vararg, a.kwarg) if x is not None]
            parts.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            parts.append(node.annotation)
        elif _is_type_checking(node):
            parts.append(node)
        inside |= {id(sub) for part in parts if part is not None for sub in ast.walk(part)}
    return inside


def type_only_uses(source: str) -> list[tuple[int, str]]:
    """(line, name) of each run-time use of a name bound only for type checkers."""
    tree = ast.parse(source)
    type_only: set[str] = set()
    run_time: set[str] = set()
    for statement in tree.body:
        if isinstance(statement, ast.If) and _is_type_checking(statement):
            type_only |= _bound(list(statement.body))
            run_time |= _bound(list(statement.orelse))
        else:
            run_time |= _bound([statement])
    only = type_only - run_time
    skip = _annotation_ids(tree)
    return sorted(
        (node.lineno, node.id)
        for node in ast.walk(tree)
        if isinstance(node, ast.Name) and node.id in only and id(node) not in skip
    )


def test_no_module_uses_a_type_only_name_at_run_time() -> None:
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {name}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, name in type_only_uses(path.read_text())
    ]
    assert found == [], "\n".join(found)


def test_the_check_sees_a_run_time_use() -> None:
    source = (
        "from __future__ import annotations\n"
        "TYPE_CHECKING = False\n"
        "if TYPE_CHECKING:\n"
        "    from pathlib import Path\n"
        "def f(x: Path) -> Path:\n"
        "    y: Path = x\n"
        "    return Path(y)\n"
    )
    assert type_only_uses(source) == [(7, "Path")]
    assert type_only_uses(source.replace("return Path(y)", "return y")) == []
