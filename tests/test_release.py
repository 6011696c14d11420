"""A release, not a diary: one version, release notes cut by version, archives that install.

The version has one owner, ``artifactd.__version__``: pyproject.toml reads it
(``[tool.setuptools.dynamic]``), ``artifactd --version`` prints it, and the
newest release in CHANGELOG.md states it. The changelog follows Keep a
Changelog 1.1: ``## [Unreleased]`` first, then ``## [X.Y.Z] - YYYY-MM-DD``,
newest first; each section has at most one list of each kind, in the format's
order; a release's notes say what a user sees (no test or source paths, no
issue numbers) and stay short. The slow test builds the sdist and, from it,
the wheel (``python -m build``, as a release does), installs the wheel with
its core dependencies into a fresh virtual environment without the system's
packages, and runs the installed program there.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path, PurePosixPath

import pytest
from conftest import REPO, built_natively, clean_env, run_artifactd

from artifactd import __version__
from artifactd.images.wheels import source_ignore

if sys.version_info >= (3, 11):
    import tomllib
else:  # pytest itself depends on tomli below 3.11
    import tomli as tomllib

#: ``MAJOR.MINOR.PATCH`` (SemVer without pre-release or build parts).
SEMVER = re.compile(r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)")
#: A release's heading: ``## [X.Y.Z] - YYYY-MM-DD``.
RELEASE = re.compile(r"## \[(?P<version>[^\]]+)\] - (?P<date>\S+)")
#: Keep a Changelog's kinds of change, in its order.
KINDS = ("Added", "Changed", "Deprecated", "Removed", "Fixed", "Security")
#: What a release's notes do not name: test files, source paths, issue numbers.
INTERNAL = re.compile(r"(?<![\w.])(?:tests|artifactd)/\w|\bissues? \d+")
#: A release's notes are read in one sitting (the diary the first release
#: replaced ran to about 1,000 lines).
MAX_RELEASE_LINES = 120


def changelog_problems(text: str, version: str) -> list[str]:
    """Return what is wrong with changelog ``text`` for the package at ``version``."""
    problems: list[str] = []
    sections: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("## "):
            sections.append((line, []))
        elif sections:
            sections[-1][1].append(line)
    if not sections or sections[0][0] != "## [Unreleased]":
        problems.append("the first section is not '## [Unreleased]'")
    releases: list[tuple[tuple[int, ...], datetime.date | None]] = []
    for heading, lines in sections:
        kinds = [line[4:].strip() for line in lines if line.startswith("### ")]
        if set(kinds) - set(KINDS) or kinds != sorted(set(kinds), key=KINDS.index):
            problems.append(f"{heading}: sections {kinds}, want each of {KINDS} at most once, so")
        if heading != "## [Unreleased]":
            problems += _release_problems(heading, lines, releases)
    newest = ".".join(map(str, releases[0][0])) if releases else None
    if newest != version:
        problems.append(f"the newest release is {newest}, the package is {version}")
    return problems


def _release_problems(
    heading: str, lines: list[str], above: list[tuple[tuple[int, ...], datetime.date | None]]
) -> list[str]:
    """What is wrong with one release's section; appends its number and date to ``above``."""
    match = RELEASE.fullmatch(heading)
    if match is None or SEMVER.fullmatch(match["version"]) is None:
        return [f"{heading!r}: not '## [MAJOR.MINOR.PATCH] - YYYY-MM-DD'"]
    problems = []
    number = tuple(int(part) for part in match["version"].split("."))
    date = _date(match["date"])
    if date is None:
        problems.append(f"{heading}: {match['date']!r} is not a date")
    if above and not (number < above[-1][0] and _not_after(date, above[-1][1])):
        problems.append(f"{heading}: not older than the release above it")
    above.append((number, date))
    if len(lines) > MAX_RELEASE_LINES:
        problems.append(f"{heading}: {len(lines)} lines, at most {MAX_RELEASE_LINES}")
    internal = sorted({m[0] for line in lines for m in INTERNAL.finditer(line)})
    if internal:
        problems.append(f"{heading}: names what users do not see: {internal}")
    return problems


def _date(text: str) -> datetime.date | None:
    try:
        return datetime.date.fromisoformat(text)
    except ValueError:
        return None


def _not_after(date: datetime.date | None, other: datetime.date | None) -> bool:
    """Whether ``date`` is not after ``other`` (an unreadable date is reported on its own)."""
    return date is None or other is None or date <= other


def test_the_version_has_one_owner() -> None:
    """pyproject.toml states no version of its own; it reads ``artifactd.__version__``."""
    doc = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    assert "version" not in doc["project"], "the version lives in artifactd/__init__.py only"
    assert "version" in doc["project"].get("dynamic", [])
    assert doc["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "artifactd.__version__"}
    assert SEMVER.fullmatch(__version__), __version__


def test_the_changelog_is_cut_into_releases() -> None:
    text = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")
    assert changelog_problems(text, __version__) == []


RELEASED = """# Changelog

## [Unreleased]

### Added
- a thing

## [0.2.0] - 2026-12-05

### Added
- a feature

### Fixed
- a bug

## [0.1.0] - 2026-12-03

### Added
- the first release
"""


@pytest.mark.parametrize(
    ("change", "version", "problem"),
    [
        (("", ""), "0.2.0", None),
        (("", ""), "0.3.0", "the newest release is 0.2.0, the package is 0.3.0"),
        (("### Fixed\n- a bug\n", "### Fixed\n- a bug\n\n### Added\n- more\n"), "0.2.0", "once"),
        (("### Fixed", "### Bugs"), "0.2.0", "'Bugs'"),
        (("## [Unreleased]\n\n### Added\n- a thing\n\n", ""), "0.2.0", "first section"),
        (("[0.1.0] - 2026-12-03", "[0.3.0] - 2026-12-03"), "0.2.0", "not older"),
        (("[0.1.0] - 2026-12-03", "[0.1.0] - 2026-12-06"), "0.2.0", "not older"),
        (("[0.1.0] - 2026-12-03", "[0.1] - 2026-12-03"), "0.2.0", "MAJOR.MINOR.PATCH"),
        (("2026-12-05", "2026-13-05"), "0.2.0", "not a date"),
        (("- a bug", "- a bug (tests/test_x.py)"), "0.2.0", "tests/"),
        (("- a bug", "- a bug in `artifactd/restore/install.py`"), "0.2.0", "artifactd/r"),
        (("- a bug", "- a bug (issue 12)"), "0.2.0", "issue 12"),
        (("- a bug", "- a bug" + "\n  more" * MAX_RELEASE_LINES), "0.2.0", "lines, at most"),
        (("- a thing", "- a thing (tests/test_x.py, issue 29)"), "0.2.0", None),
    ],
)
def test_changelog_problems_finds_each_rule_broken(
    change: tuple[str, str], version: str, problem: str | None
) -> None:
    """Each rule of :func:`changelog_problems`, broken once in a well-formed changelog.

    Unreleased may name anything: it is the working list the next release is cut from.
    """
    found = changelog_problems(RELEASED.replace(*change, 1), version)
    if problem is None:
        assert found == []
    else:
        assert len(found) == 1, found
        assert problem in found[0]


def test_the_command_line_prints_the_owners_version() -> None:
    proc = run_artifactd("--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"artifactd, version {__version__}\n"


def _run(argv: list[str | Path], *, env: dict[str, str], cwd: Path) -> str:
    """Run a packaging step; its output on success, a failed assertion with its tail otherwise."""
    proc = subprocess.run(
        [str(a) for a in argv], env=env, cwd=cwd, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, (
        f"{argv}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n" + (proc.stderr[-3000:])
    )
    return proc.stdout


#: Asked of the installed package, inside the fresh environment.
INSTALLED = """
import importlib.metadata, importlib.util, json, sys
import artifactd
from artifactd.format import unpack
from artifactd.images.build import template_text
print(json.dumps({
    "file": artifactd.__file__,
    "metadata": importlib.metadata.version("artifactd"),
    "torch": importlib.util.find_spec("torch") is not None,
    "templates": {k: template_text(k) for k in ("init", "runtime")},
    "prefix": sys.prefix,
    "batch_writer": unpack._write_natively is not None,
}))
"""


@pytest.mark.slow
def test_the_sdist_and_the_wheel_install_and_run_in_a_clean_venv(tmp_path: Path) -> None:
    """Build as a release does, install the wheel in a fresh venv, run ``artifactd`` there.

    The source is this checkout as ``image build`` copies it for ``pip wheel``
    (:func:`~artifactd.images.wheels.source_ignore`), plus the state a working
    checkout carries (a venv, a local store, bytecode, a stale ``build/``), which
    neither archive may take. The wheel is built from the sdist, so it holding
    every module and template shows the sdist holds what the wheel needs.
    """
    source = tmp_path / "source"
    shutil.copytree(REPO, source, symlinks=True, ignore=source_ignore(REPO))
    planted = [
        ".venv/bin/python",
        ".artifactd/store/index.json",
        "artifactd/__pycache__/errors.cpython-311.pyc",
        "build/lib/artifactd/stale.py",
    ]
    for rel in planted:
        (source / rel).parent.mkdir(parents=True, exist_ok=True)
        (source / rel).write_text("state, not source\n")
    env = {k: v for k, v in clean_env().items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PYTHONNOUSERSITE"] = "1"
    dist = tmp_path / "dist"
    _run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", dist, source],
        env=env,
        cwd=tmp_path,
    )
    sdist = dist / f"artifactd-{__version__}.tar.gz"
    # The batch writer (artifactd/format/_batchwrite.c) makes it a wheel for this Python
    # and platform where it builds, and a pure one where it cannot.
    (wheel,) = dist.glob(f"artifactd-{__version__}-*.whl")
    assert sorted(p.name for p in dist.iterdir()) == sorted([sdist.name, wheel.name])
    native = built_natively()
    tag = f"cp{sys.version_info[0]}{sys.version_info[1]}-" if native else "py3-none-any"
    assert wheel.name.removeprefix(f"artifactd-{__version__}-").startswith(tag), wheel.name

    modules = {p.relative_to(REPO).as_posix() for p in (REPO / "artifactd").rglob("*.py")}
    templates = {p.name for p in (REPO / "dockerfiles").glob("*.j2")}
    assert templates, "dockerfiles/*.j2"

    with tarfile.open(sdist) as archive:
        top = f"artifactd-{__version__}/"
        in_sdist = {m.name.removeprefix(top) for m in archive.getmembers() if m.isfile()}
    assert modules <= in_sdist, sorted(modules - in_sdist)
    assert {"artifactd/format/_batchwrite.c", "artifactd/format/_batchwrite.pyi"} <= in_sdist
    wanted = {"pyproject.toml", "README.md", "CHANGELOG.md", "registry-schema/FORMAT.md"}
    assert wanted | {f"dockerfiles/{t}" for t in templates} <= in_sdist
    # At the root only: artifactd/build/ is a package of the source.
    state = {".venv", ".artifactd", "tests", "build", "dist", ".git"}
    leaked = sorted(
        n
        for n in in_sdist
        if PurePosixPath(n).parts[0] in state or "__pycache__" in n or n.endswith(".pyc")
    )
    assert leaked == []

    with zipfile.ZipFile(wheel) as archive:
        in_wheel = set(archive.namelist())
        metadata = archive.read(f"artifactd-{__version__}.dist-info/METADATA").decode()
    assert modules <= in_wheel, sorted(modules - in_wheel)
    assert {f"artifactd/dockerfiles/{t}" for t in templates} | {"artifactd/py.typed"} <= in_wheel
    assert "artifactd/format/_batchwrite.pyi" in in_wheel
    compiled = [
        n for n in in_wheel if n.startswith("artifactd/format/_batchwrite.") and n.endswith(".so")
    ]
    assert len(compiled) == native, compiled
    assert [n for n in in_wheel if "stale" in n or n.endswith(".pyc")] == []
    assert f"\nVersion: {__version__}\n" in metadata
    core = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    core = [line for line in core if "extra ==" not in line]
    assert core and not [line for line in core if "torch" in line or "triton" in line], core

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], env=env, cwd=tmp_path)
    assert "include-system-site-packages = false" in (venv / "pyvenv.cfg").read_text()
    python = venv / "bin" / "python"
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-input"]
    _run([*install, "--disable-pip-version-check", str(wheel)], env=env, cwd=tmp_path)

    out = _run([venv / "bin" / "artifactd", "--version"], env=env, cwd=tmp_path)
    assert out == f"artifactd, version {__version__}\n"
    # Every command's module imports with the core dependencies alone.
    assert "fingerprint" in _run([venv / "bin" / "artifactd", "--help"], env=env, cwd=tmp_path)
    # The pod-start fast path runs from the wheel.
    out = _run([venv / "bin" / "artifactd", "fingerprint", "--hash"], env=env, cwd=tmp_path)
    assert re.fullmatch(r"[0-9a-f]{16,64}\n", out), out
    doc = json.loads(_run([python, "-c", INSTALLED], env=env, cwd=tmp_path))
    assert Path(doc["file"]).is_relative_to(venv), doc["file"]
    assert doc["metadata"] == __version__
    assert doc["torch"] is False
    assert doc["batch_writer"] is native
    for kind, text in doc["templates"].items():
        assert text == (REPO / "dockerfiles" / f"{kind}.Dockerfile.j2").read_text(), kind
    assert os.path.realpath(doc["prefix"]) == os.path.realpath(venv)


@pytest.mark.slow
def test_without_a_c_compiler_the_wheel_is_pure_and_runs_on_the_python_loop(
    tmp_path: Path,
) -> None:
    """The batch writer is optional: with no compiler (``CC=false``) the build goes on.

    The wheel then holds no compiled module and is tagged ``py3-none-any``
    (setup.py), not for one Python it does not need, and the installed
    artifactd extracts with the Python loop.
    """
    source = tmp_path / "source"
    shutil.copytree(REPO, source, symlinks=True, ignore=source_ignore(REPO))
    env = {k: v for k, v in clean_env().items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env |= {"PYTHONNOUSERSITE": "1", "CC": "false"}
    dist = tmp_path / "dist"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    _run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", dist, source],
        env=env,
        cwd=tmp_path,
    )
    (wheel,) = dist.glob("artifactd-*.whl")
    assert wheel.name == f"artifactd-{__version__}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        assert [n for n in archive.namelist() if n.endswith(".so")] == []
        assert (
            "Root-Is-Purelib: true"
            in archive.read(f"artifactd-{__version__}.dist-info/WHEEL").decode()
        )

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], env=env, cwd=tmp_path)
    python = venv / "bin" / "python"
    _run([*pip, "--python", python, "install", "--no-deps", wheel], env=env, cwd=tmp_path)
    # The dependencies from this environment, as plain paths (no .pth file there is read).
    deps = sysconfig.get_path("purelib", vars={"base": sys.prefix, "platbase": sys.prefix})
    site = _run(
        [python, "-c", "import site; print(site.getsitepackages()[0])"], env=env, cwd=tmp_path
    )
    Path(site.strip(), "deps.pth").write_text(f"{deps}\n")
    doc = json.loads(_run([python, "-c", INSTALLED], env=env, cwd=tmp_path))
    assert Path(doc["file"]).is_relative_to(venv), doc["file"]
    assert doc["batch_writer"] is False
