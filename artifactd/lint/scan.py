"""The byte scanner: build paths, user and host names in a file's bytes and in its name."""

from __future__ import annotations

import bisect
import os
import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from artifactd.families.base import Family
from artifactd.families.vllm import FACTORS_FILE, VLLMFamily
from artifactd.lint.costs import name_cost, path_cost
from artifactd.lint.hazards import Hazards
from artifactd.lint.report import KIND_HOST, KIND_PATH, KIND_USER, Finding

#: The longest example quoted in a finding's detail.
_MAX_EXAMPLE = 160
#: How much of a file decides whether it is text (no NUL byte) or binary.
_SNIFF = 8192

#: Bytes that end a path token (whitespace, quotes, separators, NUL).
_DELIMS = b" \t\r\n\x00\x0b\x0c\"'`<>|;,:()[]{}="
_TOKEN_END = re.compile(rb"[^" + re.escape(_DELIMS) + rb"]*")
#: How far a token is followed each way from a match.
_MAX_TOKEN = 4096


class Matcher:
    """The hazards compiled into byte patterns, shared by every file."""

    def __init__(self, hazards: Hazards) -> None:
        self.python = frozenset(hazards.python_paths)
        every = sorted(
            {*hazards.paths, *hazards.python_paths}, key=lambda s: (-len(s), s)
        )  # longest first: the most specific label wins
        # A path's bytes as the OS has them: a name that is not UTF-8 is still searched for.
        self.path_needles = [os.fsencode(p) for p in every]
        self.path_re = (
            re.compile(
                b"(?:" + b"|".join(re.escape(n) for n in self.path_needles) + rb")(?![\w.-])"
            )
            if every
            else None
        )
        self.users = {u.lower(): u for u in hazards.users}
        self.hosts = {h.lower(): h for h in hazards.hosts}
        names = sorted({*self.users, *self.hosts}, key=lambda s: (-len(s), s))
        self.name_re = (
            re.compile(
                rb"(?<![A-Za-z0-9])(?:"
                + b"|".join(re.escape(os.fsencode(n)) for n in names)
                + rb")(?![A-Za-z0-9])",
                re.IGNORECASE,
            )
            if names
            else None
        )

    def name_kind(self, found: str) -> tuple[str, str]:
        """Return ``(kind, configured name)`` for a user or host name the pattern matched."""
        low = found.lower()
        if low in self.users:
            return KIND_USER, self.users[low]
        return KIND_HOST, self.hosts[low]


def _token_bounds(data: bytes, start: int, end: int) -> tuple[int, int]:
    """Extend ``data[start:end]`` to the path-like token around it (at most 4 KiB each way)."""
    left, floor = start, max(0, start - _MAX_TOKEN)
    while left > floor and data[left - 1] not in _DELIMS:
        left -= 1
    m = _TOKEN_END.match(data, end, min(len(data), end + _MAX_TOKEN))
    return left, m.end() if m else end


def _example(data: bytes, start: int, end: int) -> str:
    text = data[start:end].decode("utf-8", errors="replace")
    return text if len(text) <= _MAX_EXAMPLE else text[: _MAX_EXAMPLE - 3] + "..."


@dataclass
class _Hit:
    count: int
    example: str


@dataclass
class Scope:
    """One component being scanned: its family's name and rules, and its root as bytes."""

    family: str
    component: str
    impl: Family
    roots: tuple[bytes, ...]


def _starts_with_root(data: bytes, pos: int, roots: tuple[bytes, ...]) -> bool:
    for root in roots:
        if data.startswith(root, pos):
            nxt = data[pos + len(root) : pos + len(root) + 1]
            if nxt in (b"", b"/") or nxt[0] in _DELIMS:
                return True
    return False


def scan_content(
    data: bytes, rel: str, scope: Scope, matcher: Matcher, *, rewritten: bool
) -> list[Finding]:
    """Build paths, then user and host names inside other paths, in one file's bytes."""
    binary = b"\x00" in data[:_SNIFF]
    # Spans of tokens already reported (or rewritten) as build paths, in file order.
    claimed_starts: list[int] = []
    claimed_ends: list[int] = []
    paths: dict[str, _Hit] = {}
    if matcher.path_re is not None and any(n in data for n in matcher.path_needles):
        for m in matcher.path_re.finditer(data):
            left, right = _token_bounds(data, m.start(), m.end())
            if not claimed_ends or left >= claimed_ends[-1]:
                claimed_starts.append(left)
                claimed_ends.append(right)
            if rewritten and _starts_with_root(data, m.start(), scope.roots):
                continue  # the family rewrites paths under its own root on restore
            value = m.group().decode("utf-8", errors="replace")
            hit = paths.setdefault(value, _Hit(0, _example(data, m.start(), right)))
            hit.count += 1

    names: dict[tuple[str, str], _Hit] = {}
    if matcher.name_re is not None:
        for m in matcher.name_re.finditer(data):
            i = bisect.bisect_right(claimed_starts, m.start()) - 1
            if i >= 0 and m.start() < claimed_ends[i]:
                continue
            left, right = _token_bounds(data, m.start(), m.end())
            if b"/" not in data[left:right]:
                continue  # only names inside a path: a bare word is not a location
            key = matcher.name_kind(os.fsdecode(m.group()))
            hit = names.setdefault(key, _Hit(0, _example(data, left, right)))
            hit.count += 1

    out: list[Finding] = []
    factors = scope.family == VLLMFamily.name and PurePosixPath(rel).name == FACTORS_FILE
    informational = scope.impl.informational(PurePosixPath(rel))
    for value, hit in paths.items():
        python = value in matcher.python
        what = "the build machine's Python install" if python else "a build-machine path"
        out.append(
            Finding(
                severity="warning" if binary or informational else "error",
                kind=KIND_PATH,
                family=scope.family,
                component=scope.component,
                file=rel,
                value=value,
                cost=scope.impl.informational_reason(PurePosixPath(rel))
                if informational
                else path_cost(
                    scope.impl,
                    rel,
                    python=python,
                    binary=binary,
                    rewritten=rewritten,
                    factors=factors,
                ),
                detail=f"{what}, {_times(hit.count)}, e.g. {hit.example}",
            )
        )
    for (kind, value), hit in names.items():
        out.append(
            Finding(
                severity="warning",
                kind=kind,
                family=scope.family,
                component=scope.component,
                file=rel,
                value=value,
                cost=name_cost(scope.impl, kind, in_name=False),
                detail=f"inside an embedded path, {_times(hit.count)}, e.g. {hit.example}",
            )
        )
    return out


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"


def scan_name(name: str, rel: str, is_dir: bool, scope: Scope, matcher: Matcher) -> list[Finding]:
    """User and host names in one file or directory name."""
    if matcher.name_re is None:
        return []
    out: dict[tuple[str, str], Finding] = {}
    for m in matcher.name_re.finditer(os.fsencode(name)):
        kind, value = matcher.name_kind(os.fsdecode(m.group()))
        out.setdefault(
            (kind, value),
            Finding(
                severity="warning",
                kind=kind,
                family=scope.family,
                component=scope.component,
                file=rel,
                value=value,
                cost=name_cost(scope.impl, kind, in_name=True),
                detail="in the directory name" if is_dir else "in the file name",
            ),
        )
    return list(out.values())
