"""``build.ninja`` files and what ninja recorded beside them, read and moved.

FlashInfer's JIT builds each op with ninja, so a FlashInfer tree (its own
family's, or the one under SGLang's root) has no hash key: ninja decides.
Ninja rebuilds when the command line (hashed in ``.ninja_log``) changes, when
``.ninja_log``/``.ninja_deps`` lack the output, or when an input is newer than
its output. This module reads variables, build statements and rule bindings,
and answers three questions about a tree: which op dirs ninja would rebuild
on first use (never shipped), which absolute paths the build lines name
(pinned in the manifest), and (in :mod:`artifactd.families.ninjarecords`) how
ninja's records move to another root.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath

from artifactd.families.layouts import NINJA_FILE, NINJA_LOGS

_PRUNED_DIRS = frozenset({"locks", "lock"})

_VAR_REF = re.compile(r"\$(\{[A-Za-z0-9_.-]+\}|[A-Za-z0-9_-]+|\$)")
_ASSIGN = re.compile(r"^([A-Za-z0-9_.-]+)\s*=\s*(.*)$")
#: Flags whose value (joined or the next token) is a path.
_PATH_FLAGS = ("-isystem", "-idirafter", "-iquote", "-ccbin", "-I", "-L")


class NinjaFile:
    """The parts of a ``build.ninja`` artifactd needs."""

    def __init__(self, text: str) -> None:
        self.variables: dict[str, str] = {}
        #: (outputs, inputs) per build statement, unescaped, variables expanded.
        self.builds: list[tuple[list[str], list[str]]] = []
        #: Expanded values of every binding (top level, rules, builds).
        self.values: list[str] = []
        self.uses_deps_log = False
        for line in logical_lines(text):
            self._feed(line)

    def _feed(self, line: str) -> None:
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            return
        indented = line[:1] in (" ", "\t")
        if stripped.startswith("build "):
            self._build(stripped[len("build ") :])
            return
        m = _ASSIGN.match(stripped)
        if m is None:
            return  # rule, default, pool, include, subninja headers
        name, value = m.group(1), _expand(m.group(2), self.variables)
        self.values.append(value)
        if indented:
            self.uses_deps_log = self.uses_deps_log or name == "deps"
        else:
            self.variables[name] = value

    def _build(self, rest: str) -> None:
        tokens = split_build(rest)
        if ":" not in tokens:
            return
        colon = tokens.index(":")
        outputs = [_expand(t, self.variables) for t in tokens[:colon] if t != "|"]
        after = tokens[colon + 1 :]
        inputs = [_expand(t, self.variables) for t in after[1:] if t not in ("|", "||")]
        self.builds.append((outputs, inputs))

    def absolute_paths(self) -> set[str]:
        """Absolute paths named in flags, tool variables and build inputs."""
        found: set[str] = set()
        for value in self.values:
            found.update(_paths_in_flags(value.split()))
        for _outputs, inputs in self.builds:
            found.update(os.path.dirname(p) for p in inputs if p.startswith("/"))
        for outputs, _inputs in self.builds:
            found.update(p for p in outputs if p.startswith("/"))
        return {os.path.normpath(p) for p in found if p.startswith("/")}


def logical_lines(text: str) -> list[str]:
    """Join ``$``-continued lines (an odd run of trailing ``$``)."""
    lines: list[str] = []
    pending: str | None = None
    for raw in text.splitlines():
        piece = raw.lstrip() if pending is not None else raw
        dollars = len(piece) - len(piece.rstrip("$"))
        if dollars % 2 == 1:
            pending = (pending or "") + piece[:-1]
            continue
        lines.append((pending or "") + piece)
        pending = None
    if pending is not None:
        lines.append(pending)
    return lines


def _expand(value: str, variables: Mapping[str, str]) -> str:
    """Expand ``$name``/``${name}`` from file-level variables (unknown ones: empty)."""

    def sub(m: re.Match[str]) -> str:
        ref = m.group(1)
        if ref == "$":
            return "$"
        return variables.get(ref.strip("{}"), "")

    return _VAR_REF.sub(sub, value)


def split_build(rest: str) -> list[str]:
    """Split a build statement on unescaped blanks; an unescaped ``:`` is its own token."""
    tokens: list[str] = []
    cur: list[str] = []
    i = 0
    while i < len(rest):
        c = rest[i]
        if c == "$" and i + 1 < len(rest) and rest[i + 1] in " :":
            cur.append(rest[i + 1])
            i += 2
            continue
        if c == "$" and i + 1 < len(rest) and rest[i + 1] == "$":
            cur.append("$$")  # left for _expand
            i += 2
            continue
        if c in " \t:":
            if cur:
                tokens.append("".join(cur))
                cur = []
            if c == ":":
                tokens.append(":")
        else:
            cur.append(c)
        i += 1
    if cur:
        tokens.append("".join(cur))
    return tokens


def _paths_in_flags(tokens: list[str]) -> set[str]:
    found: set[str] = set()
    for i, tok in enumerate(tokens):
        if tok.startswith("/"):
            found.add(tok)
            continue
        for flag in _PATH_FLAGS:
            if tok == flag and i + 1 < len(tokens):
                found.add(tokens[i + 1])
                break
            if tok.startswith(flag) and len(tok) > len(flag):
                found.add(tok[len(flag) :])
                break
    return {p for p in found if p.startswith("/")}


def _read_ninja(path: Path) -> NinjaFile | None:
    try:
        return NinjaFile(path.read_text(encoding="utf-8", errors="surrogateescape"))
    except OSError:
        return None


def ninja_dirs(root: Path) -> Iterator[Path]:
    """Yield every dir under ``root`` holding a ``build.ninja`` (locks and tmp dirs skipped)."""
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = sorted(
            d
            for d in dirnames
            if d not in _PRUNED_DIRS and not (d == "tmp" and here.name == "cached_ops")
        )
        if NINJA_FILE in filenames:
            yield here


def ninja_invalid_entries(
    root: Path, prefix: PurePosixPath | None = None
) -> dict[PurePosixPath, str]:
    """Return the module dirs ninja would rebuild on first use, as ``prefix/<rel to root>``.

    A dir is invalid when an output its ``build.ninja`` places in it is missing
    (the ``.so`` or an object), or when ``.ninja_log`` (or ``.ninja_deps``,
    where a rule keeps a deps log) is absent: ninja then has no record of the
    outputs and rebuilds them all.
    """
    bad: dict[PurePosixPath, str] = {}
    prefix = prefix or PurePosixPath()
    for d in ninja_dirs(root):
        ninja = _read_ninja(d / NINJA_FILE)
        if ninja is None:
            continue
        reason = _module_problem(d, ninja)
        if reason is not None:
            bad[prefix / PurePosixPath(d.relative_to(root).as_posix())] = reason
    return bad


def _module_problem(d: Path, ninja: NinjaFile) -> str | None:
    present = set(os.listdir(d))
    for outputs, _inputs in ninja.builds:
        for out in outputs:
            pout = PurePosixPath(out)
            if pout.is_absolute() and pout.parent.name != d.name:
                continue  # placed elsewhere: not this dir's business
            name = pout.name if pout.is_absolute() else out
            if name not in present and not (d / name).exists():
                return f"FlashInfer module without its output {name}: ninja would rebuild it"
    needed = NINJA_LOGS if ninja.uses_deps_log else NINJA_LOGS[:1]
    for log in needed:
        if log not in present:
            return f"FlashInfer module without {log}: ninja would rebuild it"
    return None


def ninja_pinned_paths(root: Path, *, relocated: bool = False) -> list[str]:
    """Absolute paths the ``build.ninja`` files under ``root`` embed.

    Paths inside ``root`` (outputs, generated sources) collapse to ``root``
    itself, listed first: ninja's command hashes cover them, so the cache only
    hits at that same location, unless the family rewrites ninja's records on
    restore (``relocated``: FlashInfer's own family), when the root is not
    pinned. Outside paths (CUDA home, include dirs, source dirs, compilers)
    follow, sorted.
    """
    inside = tuple(dict.fromkeys([os.path.normpath(root.absolute()), os.path.realpath(root)]))
    pinned_root = False
    outside: set[str] = set()
    for d in ninja_dirs(root):
        ninja = _read_ninja(d / NINJA_FILE)
        if ninja is None:
            continue
        for p in ninja.absolute_paths():
            if any(p == r or p.startswith(r + "/") for r in inside):
                pinned_root = True
            else:
                outside.add(p)
    return ([inside[0]] if pinned_root and not relocated else []) + sorted(outside)


# --------------------------------------------------------------------------
# Relocation: what ninja recorded, rewritten for another root
# --------------------------------------------------------------------------
#
