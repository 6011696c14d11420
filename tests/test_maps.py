"""The maps a reader follows are held to the code they describe, so they cannot go stale.

* Each package's docstring (``artifactd/<package>/__init__.py``) has a
  ``Modules:`` list: one bullet per module of the package, ``* :mod:`~artifactd.
  <package>.<module>`: a few words``, and nothing else. Read from the files,
  not imported: a module added, moved or removed fails here, naming the package.
* The module map (the table of ``docs/dev/index.md``, "Development") has a row per
  package whose cell names each of its modules as ```name` (what it is)``,
  and a last row naming the top-level modules; every name there is a module.
* Each ``scope_revision`` the docs state (README, ``docs/``,
  ``registry-schema/``) is the family's in the code, and ``docs/families.md``
  states every revision above the first.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from test_layout import PACKAGE

from artifactd.families import FAMILIES

ROOT = PACKAGE.parent
BULLET = re.compile(r"\* :mod:`~(artifactd\.\w+\.\w+)`: (\S.*)")
#: A module named in a cell of the module map: ```name` (what it is)``.
CELL_MODULE = re.compile(r"`([a-z_][a-z0-9_]*)` \(")
#: A revision stated with the family it belongs to: ```vllm` and `sglang` scope_revision 3``.
STATED = re.compile(r"((?:`[a-z][a-z0-9-]*`(?:,\s+|\s+and\s+)?)+)\s+scope_revision\s+(\d+)")
#: Any number stated as a scope revision, in whatever words.
ANY_NUMBER = re.compile(r"scope[_\s]revision`?(?:\s+(?:is|of|to)|:)?\s+(\d+)", re.IGNORECASE)
DOCS = ["README.md", "docs/**/*.md", "registry-schema/*.md"]
#: The page whose table is the module map.
MAP_PAGE = "docs/dev/index.md"


def packages() -> dict[str, Path]:
    """Every package of artifactd (a directory with ``__init__.py``) by dotted name."""
    return {
        ".".join(init.parent.relative_to(ROOT).parts): init.parent
        for init in sorted(PACKAGE.rglob("__init__.py"))
        if init.parent != PACKAGE
    }


def package_modules(directory: Path) -> set[str]:
    """The modules of the package at ``directory``: its ``.py`` files and its subpackages."""
    names = {p.stem for p in directory.glob("*.py") if p.stem not in {"__init__", "__main__"}}
    return names | {p.parent.name for p in directory.glob("*/__init__.py")}


def docstring_map(package: str, doc: str) -> tuple[dict[str, str], list[str]]:
    """The ``Modules:`` list of a package docstring: {module: words}, and its problems."""
    lines = doc.splitlines()
    if "Modules:" not in lines:
        return {}, [f"{package}: no 'Modules:' list in the package docstring"]
    start = lines.index("Modules:") + 1
    while start < len(lines) and not lines[start].strip():
        start += 1
    listed: dict[str, str] = {}
    problems = []
    for line in lines[start:]:
        if not line.strip():
            break
        if line.startswith("  "):  # a bullet's continuation line
            continue
        match = BULLET.fullmatch(line)
        if match is None:
            problems.append(f"{package}: not a '* :mod:`~{package}.NAME`: words' bullet: {line!r}")
            continue
        dotted, words = match.groups()
        parent, _, module = dotted.rpartition(".")
        if parent != package:
            problems.append(f"{package}: lists {dotted}, a module of another package")
        elif module in listed:
            problems.append(f"{package}: lists {module} twice")
        elif len(words.split()) < 2:
            problems.append(f"{package}: {module} needs a few words, not {words!r}")
        listed[module] = words
    return listed, problems


def test_each_package_docstring_lists_exactly_its_modules() -> None:
    problems = []
    for package, directory in packages().items():
        doc = ast.get_docstring(ast.parse((directory / "__init__.py").read_text())) or ""
        listed, found = docstring_map(package, doc)
        problems += found
        modules = package_modules(directory)
        problems += [
            f"{package}: {m} is not in the docstring's list" for m in sorted(modules - set(listed))
        ]
        problems += [
            f"{package}: lists {m}, which is no module" for m in sorted(set(listed) - modules)
        ]
    assert problems == [], "\n".join(problems)


def test_the_docstring_map_check_sees_what_it_must_refuse() -> None:
    """Not vacuous: a stale, missing, wordless, foreign or malformed entry is caught."""
    good = (
        "Intro.\n\nModules:\n\n* :mod:`~artifactd.x.a`: the a\n  continued.\n"
        "* :mod:`~artifactd.x.b`: the b\n\nMore."
    )
    assert docstring_map("artifactd.x", good) == ({"a": "the a", "b": "the b"}, [])
    bad = {
        "Modules:\n* :mod:`~artifactd.x.a`: a\n": "a few words",
        "Modules:\n* :mod:`~artifactd.y.a`: the a\n": "another package",
        "Modules:\n* :mod:`~artifactd.x.a`: the a\n* :mod:`~artifactd.x.a`: the a\n": "twice",
        "Modules:\n* the a module\n": "bullet",
        "No list at all.": "no 'Modules:'",
    }
    for doc, why in bad.items():
        _, problems = docstring_map("artifactd.x", doc)
        assert len(problems) == 1 and why in problems[0], (doc, problems)


def readme_map() -> list[tuple[str, str]]:
    """The rows (where, what) of the module map (``docs/dev/index.md``)."""
    section = (ROOT / MAP_PAGE).read_text()
    table = section[section.index("| where | what |") :].split("\n\n", 1)[0]
    rows = []
    for line in table.splitlines()[2:]:
        where, what = (cell.strip() for cell in line.strip().strip("|").split("|", 1))
        rows.append((where, what))
    return rows


def map_problems(rows: list[tuple[str, str]]) -> list[str]:
    """What the map gets wrong: a package without a row, a module missing or named but absent."""
    problems = []
    seen: set[str] = set()
    top = {p.stem for p in PACKAGE.glob("*.py") if p.stem not in {"__init__", "__main__"}}
    for where, what in rows:
        dirs = re.findall(r"`artifactd/([\w/]+)/`", where)
        if not dirs:  # the top-level modules: named in the first cell
            named, modules, label = set(re.findall(r"`(\w+)`", where)), top, "artifactd"
        elif len(dirs) == 1:
            package = "artifactd." + dirs[0].replace("/", ".")
            directory = PACKAGE.parent / "artifactd" / dirs[0]
            named, modules, label = set(CELL_MODULE.findall(what)), set(), package
            if directory.is_dir():
                modules = package_modules(directory)
            seen.add(package)
        else:
            problems.append(f"one package per row: {where}")
            continue
        problems += [f"{label}: {m} is not in the module map" for m in sorted(modules - named)]
        problems += [
            f"{label}: the module map names {m}, which is no module"
            for m in sorted(named - modules)
        ]
        if not dirs:
            seen.add("top")
    problems += [f"{p}: no row in the module map" for p in sorted(set(packages()) - seen)]
    if "top" not in seen:
        problems.append("no row for the top-level modules in the module map")
    return problems


def test_the_readme_module_map_names_every_module_and_only_modules() -> None:
    problems = map_problems(readme_map())
    assert problems == [], "\n".join(problems)


def test_the_readme_map_check_sees_what_it_must_refuse() -> None:
    rows = readme_map()
    assert map_problems(rows) == []
    for i, (where, what) in enumerate(rows):
        if where == "`artifactd/restore/`":
            stale = [
                *rows[:i],
                (where, what + ", `gone` (a module that is not there)"),
                *rows[i + 1 :],
            ]
            missing = [
                *rows[:i],
                (where, what.replace("`marker` (", "`marker`, (")),
                *rows[i + 1 :],
            ]
            assert map_problems(stale) == [
                "artifactd.restore: the module map names gone, which is no module"
            ]
            assert map_problems(missing) == ["artifactd.restore: marker is not in the module map"]
            assert map_problems([*rows[:i], *rows[i + 1 :]]) == [
                "artifactd.restore: no row in the module map"
            ]
            break
    else:
        raise AssertionError("no restore row in the module map")


def stated_revisions(text: str) -> tuple[dict[str, set[int]], list[str]]:
    """Each family's revision ``text`` states, and each number it states in another form."""
    stated: dict[str, set[int]] = {}
    spans = []
    for match in STATED.finditer(text):
        spans.append(match.span())
        for family in re.findall(r"`([a-z][a-z0-9-]*)`", match.group(1)):
            stated.setdefault(family, set()).add(int(match.group(2)))
    unread = [
        text[max(0, m.start() - 40) : m.end()].replace("\n", " ")
        for m in ANY_NUMBER.finditer(text)
        if not any(start <= m.start() < end for start, end in spans)
    ]
    return stated, unread


def test_each_scope_revision_the_docs_state_is_the_code_s() -> None:
    problems = []
    per_doc = {}
    for pattern in DOCS:
        for path in sorted(ROOT.glob(pattern)):
            stated, unread = stated_revisions(path.read_text())
            rel = path.relative_to(ROOT).as_posix()
            per_doc[rel] = stated
            problems += [
                f"{rel}: '...{u}': state it as `family` scope_revision N, so it is checked"
                for u in unread
            ]
            for family, numbers in sorted(stated.items()):
                if family not in FAMILIES:
                    problems.append(f"{rel}: scope_revision of {family!r}, no family")
                    continue
                code = FAMILIES[family].scope_revision
                problems += [
                    f"{rel}: {family} scope_revision {n}; the code says {code}"
                    for n in sorted(numbers - {code})
                ]
    families_md = per_doc.get("docs/families.md", {})
    problems += [
        f"docs/families.md: states no scope_revision of {name} ({family.scope_revision})"
        for name, family in FAMILIES.items()
        if family.scope_revision > 1 and name not in families_md
    ]
    assert problems == [], "\n".join(problems)
    assert sum(len(s) for s in per_doc.values()) >= 3, (
        "the docs state no revisions: the regex broke"
    )


def test_the_revision_reader_sees_what_it_must_refuse() -> None:
    stated, unread = stated_revisions(
        "as `vllm` and `sglang` scope_revision 3 says; (`flashinfer`\nscope_revision 2);"
        " their `scope_revision` is 2 since; the scope\nrevision of 4; its scope revision"
    )
    assert stated == {"vllm": {3}, "sglang": {3}, "flashinfer": {2}}
    assert len(unread) == 2
