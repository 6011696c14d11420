"""The wheels the init image installs: artifactd's, built from a checkout, and its dependencies'.

``artifactd image build --kind init`` installs artifactd from wheels in the build
context, never from an index: ``--wheels DIR`` gives them, else ``pip wheel``
builds them from a copy of the source checkout (``--source DIR``, default the one
artifactd runs from), its build state left out.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from artifactd.errors import BuildError, UsageError
from artifactd.events import EventSink

#: Lines of pip's output a failure reports.
LOG_TAIL = 30
#: Left out when a source checkout is copied for ``pip wheel`` (state, not source).
_NOT_SOURCE = (
    ".git",
    ".venv",
    "venv",
    ".artifactd",
    "*.egg-info",
    "__pycache__",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    ".hypothesis",
    ".tox",
    ".nox",
    # The C batch writer as `pip install -e .` builds it in place, for that Python:
    # `pip wheel` builds its own.
    "*.so",
)
#: Left out only at the checkout's root: ``build/`` and ``dist/`` are setuptools'
#: state there, but ``artifactd/build/`` is a package of the source.
_NOT_SOURCE_AT_ROOT = ("build", "dist")


def default_source() -> Path:
    """Return the checkout artifactd runs from (one with a ``pyproject.toml``)."""
    root = Path(__file__).resolve().parents[2]
    if (root / "pyproject.toml").is_file() and (root / "artifactd").is_dir():
        return root
    raise UsageError(
        "artifactd runs from an installed wheel, not a source checkout: nothing to build wheels of",
        hint="pass --source DIR (an artifactd checkout) or --wheels DIR (prebuilt wheels)",
    )


def pip_wheel(source: Path, out: Path, work: Path, on_event: EventSink) -> None:
    """``pip wheel`` a copy of ``source`` (its build state left out) into ``out``."""
    if not (source / "pyproject.toml").is_file():
        raise UsageError(
            f"--source {source}: no pyproject.toml there", hint="point it at an artifactd checkout"
        )
    copy = work / "source"
    shutil.copytree(source, copy, symlinks=True, ignore=source_ignore(source))
    on_event({"stage": "image", "event": "wheels", "source": str(source)})
    argv = [sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check"]
    proc = subprocess.run(
        [*argv, "--wheel-dir", str(out), str(copy)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-LOG_TAIL:]
        raise BuildError(
            f"pip wheel {source} failed (exit {proc.returncode})"
            + "".join(f"\n  | {line}" for line in tail),
            hint="pass --wheels DIR with wheels of artifactd and its dependencies",
        )


def source_ignore(root: Path) -> Callable[[str, list[str]], set[str]]:
    """Return the ``copytree`` filter of a checkout's state (``build/`` only at its root)."""
    anywhere = shutil.ignore_patterns(*_NOT_SOURCE)
    top = str(root)

    def ignore(directory: str, names: list[str]) -> set[str]:
        left_out = set(anywhere(directory, names))
        if directory == top:
            left_out |= {n for n in names if n in _NOT_SOURCE_AT_ROOT}
        return left_out

    return ignore


def artifactd_version(wheels: Path) -> str:
    """Return the version of the one artifactd wheel in ``wheels``."""
    versions = sorted({p.name.split("-")[1] for p in wheels.glob("artifactd-*.whl")})
    if len(versions) != 1:
        raise UsageError(
            f"the wheels hold {len(versions) or 'no'} artifactd version(s)"
            + (f": {', '.join(versions)}" if versions else ""),
            hint="give exactly one artifactd wheel, with its dependencies",
        )
    return versions[0]
