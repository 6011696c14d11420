"""One name, one idea: no two modules of artifactd define a public type of the same name.

Two classes called ``FamilyVerdict`` (a diff's hit/miss per family and a pod's
"was the restored cache used?") and two ``Verdict`` types once lived on the
same import path, each meaning something else; a reader who knew one misread
the other. A public name here is a class, or a type alias (``X = Literal[...]``,
``X = A | B``, ``X: TypeAlias = ...``, ``type X = ...``, ``NewType``,
``TypeVar``) whose name does not start with ``_``, defined at a module's top
level (or in an ``if``/``try`` block there, ``if TYPE_CHECKING:`` included).
Read from the files, not imported. A name two modules must share goes in
:data:`ALLOWED` with the reason.
"""

from __future__ import annotations

import ast
from collections import defaultdict

from test_layout import PACKAGE

#: Public type names two or more modules may each define, and why. Empty: every
#: name so far could say which idea it is.
ALLOWED: dict[str, str] = {}

#: Calls whose result, bound to a CapWords name, is a type.
_TYPE_FACTORIES = {"NewType", "TypeVar", "ParamSpec", "TypeVarTuple", "NamedTuple", "TypedDict"}


def _is_type_name(name: str) -> bool:
    """A CapWords public name (``Verdict``), not a constant (``KINDS``) or private (``_X``)."""
    return name[:1].isupper() and not name.isupper() and not name.startswith("_")


def _is_type_expression(value: ast.expr) -> bool:
    if isinstance(value, ast.Subscript):  # Literal[...], Callable[...], dict[str, int]
        return True
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.BitOr):  # A | B
        return True
    if isinstance(value, ast.Call):
        func = value.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        return name in _TYPE_FACTORIES
    return False


def public_types(source: str) -> set[str]:
    """The public classes and type aliases a module's source defines at its top level."""
    found: set[str] = set()
    todo: list[ast.stmt] = list(ast.parse(source).body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.ClassDef):
            names = [node.name]
        elif isinstance(node, ast.Assign) and _is_type_expression(node.value):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            alias = "TypeAlias" in ast.unparse(node.annotation)
            names = [node.target.id] if alias else []
        elif type(node).__name__ == "TypeAlias":  # ``type X = ...`` (Python 3.12)
            names = [node.name.id]  # type: ignore[attr-defined]
        else:
            if isinstance(node, ast.If | ast.Try):
                todo.extend(node.body)
                todo.extend(node.orelse)
                if isinstance(node, ast.Try):
                    todo.extend(node.finalbody)
                    for handler in node.handlers:
                        todo.extend(handler.body)
            continue
        found.update(n for n in names if _is_type_name(n) or isinstance(node, ast.ClassDef))
    return {n for n in found if not n.startswith("_")}


def same_names(sources: dict[str, str]) -> dict[str, list[str]]:
    """Each public type name that more than one of ``sources`` ({module: source}) defines."""
    where: dict[str, list[str]] = defaultdict(list)
    for module, source in sorted(sources.items()):
        for name in public_types(source):
            where[name].append(module)
    return {name: modules for name, modules in sorted(where.items()) if len(modules) > 1}


def _package_sources() -> dict[str, str]:
    return {
        str(path.relative_to(PACKAGE.parent)): path.read_text(encoding="utf-8")
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def test_no_two_modules_define_a_public_type_of_the_same_name() -> None:
    twice = {n: m for n, m in same_names(_package_sources()).items() if n not in ALLOWED}
    assert not twice, (
        "one name, one idea: these public types are defined in more than one module; "
        "rename each after what it means (or add the name to ALLOWED with a reason): "
        + "; ".join(f"{name} in {', '.join(modules)}" for name, modules in twice.items())
    )


def test_every_allowed_name_is_still_defined_twice() -> None:
    stale = set(ALLOWED) - set(same_names(_package_sources()))
    assert not stale, f"ALLOWED names no longer defined twice, drop them: {sorted(stale)}"


def test_the_name_check_sees_what_it_must_refuse() -> None:
    sources = {
        "a.py": (
            "from typing import Literal, TYPE_CHECKING\n"
            "class FamilyVerdict: ...\n"
            'Verdict = Literal["hit", "miss"]\n'
            "Either = int | str\n"
            "if TYPE_CHECKING:\n"
            "    class Hidden: ...\n"
            "KINDS = ('a', 'b')\n"
            "_Private = Literal['x']\n"
            "class _Inner: ...\n"
            "limit = 3\n"
        ),
        "b.py": (
            "from typing import Literal, NewType, TypeAlias\n"
            "class FamilyVerdict:\n"
            "    class Nested: ...\n"
            'Verdict: TypeAlias = Literal["used"]\n'
            "Either = NewType('Either', int)\n"
            "try:\n"
            "    class Hidden: ...\n"
            "except ImportError:\n"
            "    pass\n"
            "KINDS = ('c',)\n"
            "_Private = Literal['y']\n"
            "class _Inner: ...\n"
            "limit = 4\n"
            "def f():\n"
            "    class Local: ...\n"
        ),
        "c.py": "class Nested: ...\nclass Local: ...\n",
    }
    assert same_names(sources) == {
        "Either": ["a.py", "b.py"],
        "FamilyVerdict": ["a.py", "b.py"],
        "Hidden": ["a.py", "b.py"],
        "Verdict": ["a.py", "b.py"],
    }
