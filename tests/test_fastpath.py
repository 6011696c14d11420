"""The pod-start fast path imports only what :mod:`artifactd.cli.fast` says it may.

Read from the code, not run: every import statement of ``artifactd/cli/fast.py``
and of each module its :data:`~artifactd.cli.fast.LIGHT` names, at module level
and inside functions (imports under ``if TYPE_CHECKING:`` never run), is held
to the lists the module declares and its docstring names. A module that
starts importing something heavy fails here with the module, the line and the
list it would have to join; ``tests/test_startup.py`` checks the same rule on
real pod starts.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path

from test_layout import _is_type_checking, _modules, _top_level_imports

from artifactd.cli import fast
from artifactd.hashing import SMALL_SHA256_MODULE

FAST = "artifactd.cli.fast"


def _type_only(tree: ast.Module) -> set[int]:
    """The ids of the import statements under ``if TYPE_CHECKING:`` (they never run)."""
    return {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and _is_type_checking(node.test)
        for inner in ast.walk(node)
    }


def imports(name: str, source: str) -> Iterator[tuple[str, bool, int]]:
    """Each module an import statement of module ``name`` loads: (module, at module level, line)."""
    modules = _modules()
    tree = ast.parse(source)
    top = {id(node) for node in _top_level_imports(tree)}
    skip = _type_only(tree)
    package = name if modules.get(name, Path()).name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if id(node) in skip or not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Import):
            found = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join([*parts[: len(parts) - node.level + 1], *filter(None, [base])])
            # ``from pkg import mod`` loads the module pkg.mod; ``from mod import name``, mod.
            found = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                for alias in node.names
            ]
        for module in dict.fromkeys(found):
            yield module, id(node) in top, node.lineno


def allowed(module: str, *, at_top: bool) -> bool:
    """Whether the fast path may import ``module`` there (the rule of the module's docstring)."""
    if module.startswith("artifactd"):
        return module in fast.LIGHT or module == FAST or (not at_top and module in fast.LATER)
    root = module.split(".", maxsplit=1)[0]
    if at_top:  # module level: only what costs next to nothing (FLOOR)
        return root in fast.FLOOR
    return root in fast.STDLIB | fast.GPU | fast.LATER


def violations(name: str, source: str) -> list[str]:
    """Every import of module ``name`` (given its ``source``) the rule refuses, as messages."""
    return [
        f"{name}:{line}: imports {module} {'at module level' if top else 'in a function'}; "
        f"{'not in FLOOR or LIGHT' if top else 'not in STDLIB, GPU, LIGHT or LATER'}"
        for module, top, line in imports(name, source)
        if not allowed(module, at_top=top)
    ]


def installing_violations(name: str, source: str) -> list[str]:
    """Every module-level import of an INSTALLING module ``name`` the second rule refuses."""
    found = []
    for module, top, line in imports(name, source):
        if not top:
            continue  # its functions are ordinary code: the run-time test holds a restore's
        if module.startswith("artifactd"):
            ok = module in fast.LIGHT | fast.INSTALLING
        else:
            ok = module.split(".", maxsplit=1)[0] in fast.FLOOR | fast.INSTALL_FLOOR
        if not ok:
            found.append(
                f"{name}:{line}: imports {module} at module level; "
                "not in FLOOR, INSTALL_FLOOR, LIGHT or INSTALLING"
            )
    return found


def test_a_restore_that_installs_imports_only_what_it_declares() -> None:
    modules = _modules()
    found = []
    for name in sorted(fast.INSTALLING):
        found += installing_violations(name, modules[name].read_text())
    assert found == [], "\n".join(found)


def test_the_installing_checker_sees_what_it_must_refuse() -> None:
    """Not vacuous: costly module-level imports planted in an installing module are caught."""
    name = "artifactd.restore.journal"
    source = _modules()[name].read_text()
    assert installing_violations(name, source) == []
    for code in (
        "import typing\n",
        "from pathlib import Path\n",
        "import tarfile\n",
        "from artifactd.format import archive\n",
    ):
        assert len(installing_violations(name, source + "\n" + code)) == 1, code
    for code in (
        "import hashlib\n",
        "from artifactd.format import light\n",
        "def f() -> None:\n    import re\n",
        "TYPE_CHECKING = False\nif TYPE_CHECKING:\n    import typing\n",
    ):
        assert installing_violations(name, source + "\n" + code) == [], code


def test_the_fast_path_imports_only_what_it_declares() -> None:
    modules = _modules()
    found = []
    for name in sorted(fast.LIGHT | {FAST}):
        found += violations(name, modules[name].read_text())
    assert found == [], "\n".join(found)


def test_the_floor_checker_sees_what_it_must_refuse() -> None:
    """Not vacuous: a costly import planted at module level of a light module is caught."""
    name = "artifactd.fingerprint.key"
    source = _modules()[name].read_text()
    assert violations(name, source) == []
    for code in (
        "import typing\n",
        "from pathlib import Path\n",
        "import artifactd.format.unpack\n",
    ):
        assert len(violations(name, source + "\n" + code)) == 1, code
    for code in (
        "TYPE_CHECKING = False\nif TYPE_CHECKING:\n    import typing\n",
        "def f() -> None:\n    import re\n",
    ):
        assert violations(name, source + "\n" + code) == [], code


def test_the_declared_lists_name_real_modules_each_once() -> None:
    modules = set(_modules())
    for name in fast.LIGHT | fast.INSTALLING | {m for m in fast.LATER if m.startswith("artifactd")}:
        assert name in modules, f"{name} is not a module of the package"
    # CPython's own SHA-256 is one private module under two names (3.12 renamed it):
    # the other Python's name is the one that may be missing here.
    other = {"_sha2", "_sha256"} - {SMALL_SHA256_MODULE}
    assert len(other) == 1
    for name in fast.STDLIB - other | {"ctypes", "dataclasses", "shutil", "tempfile", "traceback"}:
        assert name in sys.stdlib_module_names, name
    assert not fast.LIGHT & fast.LATER
    assert not fast.LIGHT & fast.INSTALLING
    assert sys.stdlib_module_names >= fast.INSTALL_FLOOR
    assert not fast.INSTALL_FLOOR & fast.FLOOR
    assert not fast.STDLIB & (fast.LATER | fast.GPU)
    assert fast.FLOOR <= fast.STDLIB
    # Importing a module loads its packages first: they are on the path too.
    for name in fast.LIGHT | {FAST}:
        parents = [name.rsplit(".", n)[0] for n in range(1, name.count(".") + 1)]
        assert set(parents) <= fast.LIGHT, f"{name}: a parent package is not in LIGHT"


def test_the_docstring_names_exactly_the_declared_modules() -> None:
    doc = fast.__doc__ or ""
    listed = doc[doc.index("What it may import") :]
    named = set(re.findall(r"``([\w.]+)``", listed))
    declared = fast.STDLIB | fast.GPU | fast.LIGHT | fast.LATER | fast.FLOOR
    declared |= fast.INSTALLING | fast.INSTALL_FLOOR
    assert declared - named == set(), "declared but not in the docstring"
    assert {n for n in named if n.startswith("artifactd")} - declared == set(), "stale names"


def test_the_checker_sees_what_it_must_refuse() -> None:
    """Not vacuous: planted imports in a light module are caught, where the rule says."""
    name = "artifactd.restore.resolve"
    source = _modules()[name].read_text()
    assert violations(name, source) == []
    assert ("artifactd.fingerprint.diff", False) in {(m, t) for m, t, _ in imports(name, source)}
    planted = {
        "import click\n": "click at module level",
        "from artifactd.fingerprint.model import Fingerprint\n": "LATER at module level",
        "def f() -> None:\n    import requests\n": "a heavy module in a function",
        "def f() -> None:\n    from artifactd.build import merge\n": "an unlisted module",
        "try:\n    import zstandard\nexcept ImportError:\n    pass\n": "under try",
    }
    for code, why in planted.items():
        assert len(violations(name, source + "\n" + code)) == 1, why
    allowed_later = "def f() -> None:\n    from artifactd.fingerprint.model import Fingerprint\n"
    assert violations(name, source + "\n" + allowed_later) == []
    type_only = "TYPE_CHECKING = False\nif TYPE_CHECKING:\n    import click\n"
    assert violations(name, source + "\n" + type_only) == []
