"""Lint a cache before it ships: what in it is tied to the build machine, and what that costs.

A harvested cache is only worth its transfer if the pod can use it. These
findings are what makes it unusable elsewhere, found in the files themselves:

* ``absolute-path``: an absolute path of the build machine (a cache root, the
  build dir, ``HOME``, ``TMPDIR``, the Python install) written inside a file.
  Files the family rewrites on restore (Triton's ``__grp__*.json``) are exempt
  for the paths under their own root, which the rewrite fixes; any other path
  in them is still reported. Binary files are searched for the byte string too
  (a warning: often debug info, sometimes an include dir or rpath).
* ``user-name`` / ``host-name``: the build user or host inside a path written
  in a file (``/scratch/torchinductor_<user>/...``) or in a file or dir name:
  a consumer running as another user, on another host, looks elsewhere.
* ``volatile-factor``: a value in vLLM's ``cache_key_factors.json`` that
  changes from pod to pod (an IP address, a port, a Ray bundle index or
  placement group, a local model path), as
  :func:`artifactd.families.vllm.volatile_factors` classifies it: vLLM hashes
  it into the cache dir name, so each pod computes another dir and recompiles.

Each finding carries one sentence saying what it will cost. The library never
prints: :func:`lint` returns a :class:`LintReport`. The tree is walked as the
harvest walks it (:mod:`artifactd.families.tree`).

Modules:

* :mod:`~artifactd.lint.hazards`: the build machine's identity (paths, user and host names).
* :mod:`~artifactd.lint.report`: findings and the report around them.
* :mod:`~artifactd.lint.costs`: one sentence per finding saying what it will cost.
* :mod:`~artifactd.lint.scan`: the byte scanner of a file's bytes and its name.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from artifactd.constants import current_environ
from artifactd.errors import UsageError
from artifactd.families import FAMILIES, select_families
from artifactd.families.base import Family, Located
from artifactd.families.tree import NOT_UTF8, root_spellings, walk_component
from artifactd.families.vllm import FACTOR_CATEGORIES, FACTORS_FILE, VLLMFamily, volatile_factors
from artifactd.lint.hazards import MIN_NAME_LEN, Hazards
from artifactd.lint.report import (
    KIND_HOST,
    KIND_PATH,
    KIND_USER,
    KIND_VOLATILE,
    Finding,
    LintReport,
    Severity,
)
from artifactd.lint.scan import Matcher, Scope, scan_content, scan_name

#: Bytes read from each file; a longer file is searched in its first part only.
MAX_READ = 4 << 20


class _UnknownFamily(Family):
    """Default rules for a ``roots`` key artifactd has no family for: nothing is rewritten."""

    name = "unknown"
    description = "a cache artifactd has no family for"
    scope = ()
    components = ()

    def locate(self, environ: Mapping[str, str]) -> list[Located]:
        """Find nothing: an unknown cache is only ever linted where it is pointed at."""
        del environ
        return []


def _parse_key(key: str) -> tuple[str, str | None]:
    for sep in (":", "/"):
        if sep in key:
            family, comp = key.split(sep, 1)
            return family, comp or None
    return key, None


def root_key(family: str, component: str) -> str:
    """Return the ``roots`` key for one located component: ``family:component``."""
    return f"{family}:{component}"


def roots_for_lint(
    directory: Path | None, families: Sequence[str] | None, environ: Mapping[str, str]
) -> dict[str, Path]:
    """Return the component dirs to lint, keyed by :func:`root_key`.

    With ``directory`` (build roots or a restore target): each component's
    restore dir under it (the layout a build's cells and a restore write),
    where it exists. Without it: each component where the harvest finds it,
    through ``environ``. ``families`` None means every family.
    """
    roots: dict[str, Path] = {}
    for fam in select_families(families):
        if directory is not None:
            for comp, path in fam.restore_dirs(directory).items():
                if path.is_dir():
                    roots[root_key(fam.name, comp)] = path
        else:
            for loc in fam.locate(environ):
                roots[root_key(fam.name, loc.component.name)] = loc.path
    return roots


def lint_caches(
    directory: Path | None,
    families: Sequence[str] | None,
    *,
    environ: Mapping[str, str] | None = None,
) -> tuple[dict[str, Path], LintReport]:
    """Find the caches as :func:`roots_for_lint` does and lint them; return the roots and report.

    The hazards come from ``environ`` (default: this process's) and this
    interpreter; the build paths added are ``directory`` when given, else each
    cache root found.
    """
    environ = current_environ() if environ is None else environ
    if directory is not None:
        try:
            kind = os.stat(directory).st_mode
        except OSError as exc:
            # A mistyped path must not read as "clean" (a CI gate would pass).
            raise UsageError(
                f"lint: {directory} does not exist"
                if exc.errno == errno.ENOENT
                else f"lint: {directory} cannot be read ({exc.strerror or exc})",
                hint="pass build roots (build --keep-roots DIR) or a restore target",
            ) from None
        if not stat.S_ISDIR(kind):
            raise UsageError(
                f"lint: {directory} is not a directory",
                hint="pass build roots (build --keep-roots DIR) or a restore target",
            )
    roots = roots_for_lint(directory, families, environ)
    extra = [directory] if directory is not None else list(roots.values())
    return roots, lint(roots, hazards=Hazards.from_environ(environ, extra_paths=extra))


def lint(roots: Mapping[str, Path], *, hazards: Hazards, max_read: int = MAX_READ) -> LintReport:
    """Scan cache directories for what ties them to the build machine.

    ``roots`` maps ``family`` or ``family:component`` (see :func:`root_key`)
    to the directory to scan; a bare family name means its first component.
    Only what the harvest would pack is scanned (the family's exclusions and
    partial entries are skipped, symlinks are not followed). Each file is
    read up to ``max_read`` bytes. A family artifactd does not know is
    scanned with default rules and listed in ``unknown_families``.

    Raises :class:`UsageError` when a root is not a directory.
    """
    matcher = Matcher(hazards)
    report = LintReport()
    findings: list[Finding] = []
    unknown: set[str] = set()
    for key in sorted(roots):
        root = Path(roots[key])
        if not root.is_dir():
            raise UsageError(
                f"not a directory: {root}",
                hint=f"lint scans a cache directory; {key!r} points at nothing",
            )
        family_name, comp = _parse_key(key)
        impl = FAMILIES.get(family_name)
        if impl is None:
            unknown.add(family_name)
            impl = _UnknownFamily()
        if comp is None:
            comp = impl.components[0].name if impl.components else "cache"
        scope = Scope(family_name, comp, impl, tuple(os.fsencode(r) for r in root_spellings(root)))
        findings.extend(_lint_root(root, scope, matcher, report, max_read))
    report.findings = sorted(findings, key=Finding.sort_key)
    report.unknown_families = sorted(unknown)
    report.unreadable.sort()
    return report


def _lint_root(
    root: Path, scope: Scope, matcher: Matcher, report: LintReport, max_read: int
) -> list[Finding]:
    out: list[Finding] = []

    def unreadable(rel: str, exc: OSError) -> None:
        report.unreadable.append(f"{scope.family}:{scope.component}:{rel}: {exc.strerror}")

    for entry in walk_component(
        scope.impl, scope.component, root, on_error=lambda rel, exc: unreadable(str(rel), exc)
    ):
        if entry.skip == NOT_UTF8:
            shown = os.fsencode(entry.rel.as_posix()).decode("utf-8", "backslashreplace")
            report.unreadable.append(
                f"{scope.family}:{scope.component}:{shown}: {NOT_UTF8}, the harvest leaves it out"
            )
            continue
        if entry.skip is not None or not (entry.is_dir or entry.is_file):
            continue  # left out of the layer, or a symlink or special file: no bytes of its own
        rel_s = entry.rel.as_posix()
        out.extend(scan_name(entry.rel.name, rel_s, entry.is_dir, scope, matcher))
        if entry.is_dir:
            continue
        try:
            with open(entry.path, "rb") as f:
                data = f.read(max_read)
                size = os.fstat(f.fileno()).st_size
        except OSError as exc:
            unreadable(rel_s, exc)
            continue
        report.files_scanned += 1
        report.bytes_scanned += len(data)
        if size > len(data):
            report.files_truncated += 1
        rewritten = scope.impl.path_bearing(scope.component, entry.rel)
        out.extend(scan_content(data, rel_s, scope, matcher, rewritten=rewritten))
        if scope.family == VLLMFamily.name and entry.rel.name == FACTORS_FILE:
            try:
                doc = json.loads(data)
            except ValueError:
                report.unreadable.append(
                    f"{scope.family}:{scope.component}:{rel_s}: not JSON (or over the read cap)"
                )
                continue
            out.extend(_factor_findings(doc, scope, rel_s))
    return out


def _show(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True)


def _factor_findings(doc: Any, scope: Scope, rel: str) -> list[Finding]:
    """One finding per volatile factor, as vLLM's classifier names it."""
    if not isinstance(doc, dict):
        return []
    out: list[Finding] = []
    for factor in volatile_factors(doc):
        category = FACTOR_CATEGORIES[factor.category]
        severity: Severity = "error" if category.certain else "warning"
        out.append(
            Finding(
                severity=severity,
                kind=KIND_VOLATILE,
                family=scope.family,
                component=scope.component,
                file=rel,
                value=_show(factor.value),
                cost=category.cost,
                detail=f"factor {factor.key} ({factor.category}): {factor.why}",
            )
        )
    return out


__all__ = [
    "FACTORS_FILE",
    "KIND_HOST",
    "KIND_PATH",
    "KIND_USER",
    "KIND_VOLATILE",
    "MAX_READ",
    "MIN_NAME_LEN",
    "Finding",
    "Hazards",
    "LintReport",
    "lint",
    "lint_caches",
    "root_key",
    "roots_for_lint",
]
