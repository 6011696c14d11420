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
  placement group, a local model path): vLLM hashes it into the cache dir
  name, so each pod computes another dir and recompiles.

Each finding carries one sentence saying what it will cost. The library never
prints: :func:`lint` returns a :class:`LintReport`.
"""

from __future__ import annotations

import bisect
import contextlib
import getpass
import importlib
import ipaddress
import json
import os
import re
import sys
import sysconfig
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from artifactd.constants import TMPDIR, current_environ
from artifactd.errors import UsageError
from artifactd.families import FAMILIES
from artifactd.families.base import Family, home

Severity = Literal["warning", "error"]

KIND_PATH = "absolute-path"
KIND_USER = "user-name"
KIND_HOST = "host-name"
KIND_VOLATILE = "volatile-factor"

#: Bytes read from each file; a longer file is searched in its first part only.
MAX_READ = 4 << 20
#: Shorter user and host names are ignored: they would match almost anywhere.
MIN_NAME_LEN = 3
#: Temp dirs that are the same on every machine: never a hazard by themselves.
_SYSTEM_TMP = frozenset({"/tmp", "/var/tmp"})  # noqa: S108 - names, not used as files
#: Host names that say nothing about the build machine.
_GENERIC_HOSTS = frozenset({"localhost", "localhost.localdomain", "(none)"})
#: vLLM writes its raw hash factors here.
FACTORS_FILE = "cache_key_factors.json"
#: The longest example quoted in a finding's detail.
_MAX_EXAMPLE = 160
#: How much of a file decides whether it is text (no NUL byte) or binary.
_SNIFF = 8192


# --------------------------------------------------------------------------
# The build machine's identity
# --------------------------------------------------------------------------


def _clean_paths(paths: Iterable[str]) -> tuple[str, ...]:
    out: dict[str, None] = {}
    for p in paths:
        s = str(p).rstrip("/")
        if s.startswith("/") and s not in out:
            out[s] = None
    return tuple(sorted(out, key=lambda s: (-len(s), s)))


def _clean_names(names: Iterable[str], *, drop: frozenset[str] = frozenset()) -> tuple[str, ...]:
    out: dict[str, None] = {}
    for n in names:
        s = str(n).strip()
        if len(s) >= MIN_NAME_LEN and s.lower() not in drop and s not in out:
            out[s] = None
    return tuple(sorted(out, key=lambda s: (-len(s), s)))


def _with_realpaths(paths: Iterable[str]) -> list[str]:
    out: list[str] = []
    for p in paths:
        out.append(p)
        real = os.path.realpath(p)
        if real != p:
            out.append(real)
    return out


@dataclass(frozen=True)
class Hazards:
    """What identifies the build machine and must not end up inside a cache.

    ``paths``: absolute paths that do not exist (or differ) on the pods: the
    build dir and cache roots, ``HOME``, a non-default ``TMPDIR``.
    ``python_paths``: the Python install the warm-up ran in (site-packages, a
    venv prefix); reported separately because several libraries hash them
    into their keys. ``users`` and ``hosts``: names searched in paths written
    inside files and in file and dir names (names under
    :data:`MIN_NAME_LEN` characters are dropped; host names match
    case-insensitively). Values are normalized: trailing slashes removed,
    relative paths and duplicates dropped, longest first.
    """

    paths: tuple[str, ...] = ()
    python_paths: tuple[str, ...] = ()
    users: tuple[str, ...] = ()
    hosts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "paths", _clean_paths(self.paths))
        object.__setattr__(self, "python_paths", _clean_paths(self.python_paths))
        object.__setattr__(self, "users", _clean_names(self.users))
        object.__setattr__(self, "hosts", _clean_names(self.hosts, drop=_GENERIC_HOSTS))

    @classmethod
    def from_environ(
        cls,
        environ: Mapping[str, str] | None = None,
        extra_paths: Iterable[str | os.PathLike[str]] = (),
    ) -> Hazards:
        """Fill the hazards from an environment and this interpreter, without importing torch.

        ``extra_paths`` are the build root and the cache roots. Added: ``HOME``,
        ``XDG_CACHE_HOME`` and ``TMPDIR`` when set (``/tmp`` and ``/var/tmp``
        are the same everywhere and left out), the user (``USER``/``LOGNAME``,
        else the login name), the host name and its short form, site-packages
        and a venv prefix (``sys.prefix`` when it is not the base install);
        each path also as its resolved form when that differs.
        """
        environ = current_environ() if environ is None else environ
        paths = [os.fspath(p) for p in extra_paths]
        paths.append(str(home(environ)))
        if environ.get("XDG_CACHE_HOME"):
            paths.append(environ["XDG_CACHE_HOME"])
        tmp = environ.get(TMPDIR, "").rstrip("/")
        if tmp and tmp not in _SYSTEM_TMP:
            paths.append(tmp)

        installed = sysconfig.get_paths()
        python = [installed[key] for key in ("purelib", "platlib") if installed.get(key)]
        if sys.prefix != sys.base_prefix:
            python.append(sys.prefix)

        users = [environ[k] for k in ("USER", "LOGNAME") if environ.get(k)]
        if not users:
            with contextlib.suppress(KeyError, OSError):
                users.append(getpass.getuser())

        node = os.uname().nodename
        hosts = [node, node.split(".", 1)[0]] if node else []
        return cls(
            paths=tuple(_with_realpaths(paths)),
            python_paths=tuple(_with_realpaths(python)),
            users=tuple(users),
            hosts=tuple(hosts),
        )


# --------------------------------------------------------------------------
# Findings and the report
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    """One thing in a cache that ties it to the build machine.

    ``file`` is relative to the component root (POSIX separators); ``value``
    is what was found (the leaked build path, user or host name, or a hash
    factor's value); ``detail`` says where (an example of the embedded path,
    the occurrence count, or the factor's key); ``cost`` is one sentence
    saying what it will cost on the pod.
    """

    severity: Severity
    kind: str
    family: str
    component: str
    file: str
    value: str
    cost: str
    detail: str = ""

    def sort_key(self) -> tuple[str, ...]:
        """Return the deterministic order of a report: family, component, file, kind, value."""
        return (self.family, self.component, self.file, self.kind, self.value, self.detail)


@dataclass
class LintReport:
    """What :func:`lint` found.

    ``files_truncated`` counts files longer than the read cap (searched in
    their first part only); ``unreadable`` lists ``family:component:file``
    entries that could not be read or parsed; ``unknown_families`` the
    names of ``roots`` keys artifactd has no family for (scanned with default
    rules: nothing is treated as rewritten on restore).
    """

    findings: list[Finding] = field(default_factory=list)
    files_scanned: int = 0
    bytes_scanned: int = 0
    files_truncated: int = 0
    unreadable: list[str] = field(default_factory=list)
    unknown_families: list[str] = field(default_factory=list)

    @property
    def errors(self) -> int:
        """How many findings are errors."""
        return sum(1 for f in self.findings if f.severity == "error")

    @property
    def warnings(self) -> int:
        """How many findings are warnings."""
        return sum(1 for f in self.findings if f.severity == "warning")

    def exit_code(self, strict: bool) -> int:
        """0, or 1 when ``strict`` and anything was found (warnings included)."""
        return 1 if strict and self.findings else 0


# --------------------------------------------------------------------------
# Costs, one sentence each
# --------------------------------------------------------------------------

_LIBRARY = {
    "triton": "Triton",
    "inductor": "Inductor",
    "vllm": "vLLM",
    "sglang": "SGLang",
    "deepgemm": "DeepGEMM",
    "tilelang": "TileLang",
    "flashinfer": "FlashInfer",
    "cutedsl": "CuTe DSL",
    "cuda-jit": "The CUDA driver",
}

_PATH_COST = {
    "triton": (
        "Triton silently recompiles when restored anywhere else: this file holds an"
        " absolute build path that restore does not rewrite"
    ),
    "inductor": (
        "Inductor reads this path as written: on a pod where it does not exist the"
        " graph or kernel recompiles, or its load fails"
    ),
    "vllm": (
        "vLLM hashes paths and keeps absolute artifact handles: a pod where this path"
        " differs gets a new cache dir (or misses the artifact) and recompiles"
    ),
    "deepgemm": (
        "DeepGEMM keys each kernel on its flags and code: a pod where this path differs"
        " recompiles every kernel it appears in"
    ),
    "flashinfer": (
        "ninja rebuilds when a build.ninja command line changes: a pod where this path"
        " differs rebuilds every FlashInfer op"
    ),
    "tilelang": (
        "TileLang entries are meant to relocate: this absolute path will not resolve on"
        " a pod laid out differently, and the entry is recompiled or fails to load"
    ),
}

_PYTHON_COST = {
    "vllm": (
        "vLLM hashes the path of every traced source file: a pod whose site-packages"
        " lives elsewhere gets a new cache dir and recompiles"
    ),
    "deepgemm": (
        "DeepGEMM hashes its absolute -I include flag into every kernel key: a pod whose"
        " site-packages lives elsewhere recompiles everything (93 s of a 170 s boot in one"
        " report)"
    ),
    "inductor": (
        "Inductor's C++ kernel keys hold torch's install path: a pod with the venv"
        " elsewhere hits graphs but recompiles every CPU kernel"
    ),
    "flashinfer": (
        "build.ninja holds this install path: a pod whose site-packages lives elsewhere"
        " rebuilds every FlashInfer op"
    ),
    "triton": (
        "Triton's launcher key hashes absolute library and include dirs: a pod whose"
        " Python install lives elsewhere rebuilds the launcher"
    ),
}

_GROUP_COST = (
    "Triton silently recompiles when restored anywhere else: this group file points"
    " outside the cache root, so restore cannot rewrite it"
)
_REWRITTEN_COST = (
    "{lib} restore rewrites only the paths under the cache root: this one points outside"
    " it and stays the build machine's path on the pod (a miss and a recompile)"
)
_FACTORS_PATH_COST = (
    "vLLM hashes this path into its cache dir name: a pod where it differs gets a new dir"
    " and recompiles"
)

_VOLATILE_COST = {
    "ip": (
        "vLLM hashes this value into its cache dir name: every pod with another IP gets a"
        " new dir and recompiles"
    ),
    "address": (
        "vLLM hashes this value into its cache dir name: every pod with another address"
        " gets a new dir and recompiles"
    ),
    "port": (
        "vLLM hashes this value into its cache dir name: every pod given another port gets"
        " a new dir and recompiles"
    ),
    "ray": (
        "vLLM hashes this value into its cache dir name: every placement with another Ray"
        " bundle index or placement group gets a new dir and recompiles"
    ),
    "tmp": (
        "vLLM hashes this value into its cache dir name: a per-run temp path gives every"
        " run a new dir and a recompile"
    ),
    "model": (
        "vLLM hashes the model string into its cache dir name: a pod that mounts the model"
        " at another path (or names it by its hub id) gets a new dir and recompiles"
    ),
}

_VOLATILE_SEVERITY: dict[str, Severity] = {
    "ip": "error",
    "address": "error",
    "port": "error",
    "ray": "error",
    "model": "warning",
    "tmp": "warning",
}


def _library(family: str) -> str:
    return _LIBRARY.get(family, "The library")


def _path_cost(
    family: str, rel: str, *, python: bool, binary: bool, rewritten: bool, factors: bool
) -> str:
    lib = _library(family)
    if binary:
        return (
            f"{lib}'s binary embeds this build path (debug info, an rpath or a baked-in"
            " include dir): harmless if informational, a load failure or recompile where"
            " it is followed"
        )
    if python:
        return _PYTHON_COST.get(
            family,
            f"{lib} embeds the build machine's Python install path: a pod whose image"
            " installs packages elsewhere misses and recompiles",
        )
    if factors:
        return _FACTORS_PATH_COST
    if rewritten:
        name = PurePosixPath(rel).name
        if name.startswith("__grp__") and name.endswith(".json"):
            return _GROUP_COST
        return _REWRITTEN_COST.format(lib=lib)
    return _PATH_COST.get(
        family,
        f"{lib} reads this file as shipped: the build path is not rewritten on restore, so"
        " on a pod laid out differently it resolves to nothing (a miss and a recompile, or"
        " a load error)",
    )


def _name_cost(family: str, kind: str, *, in_name: bool) -> str:
    lib = _library(family)
    who = "user" if kind == KIND_USER else "host"
    if in_name:
        other = "running as another user" if who == "user" else "on another host"
        return (
            f"the name carries the build {who}: {lib} {other} looks under its own name,"
            " so these files ship but are never used"
        )
    other = "running as another user" if who == "user" else "with another host name"
    return (
        f"{lib} reads a path naming the build {who}: a pod {other} has no such path, so"
        " the lookup misses and recompiles"
    )


# --------------------------------------------------------------------------
# vLLM's volatile hash factors
# --------------------------------------------------------------------------

_PORT_KEY = re.compile(r"(^|_)PORTS?($|_)")
_RAY_KEY = re.compile(r"BUNDLE_IND|PLACEMENT_GROUP")
_ADDRESS_KEY = re.compile(r"(^|_)(HOST_?IP|NODE_?IP|MASTER_?(ADDR|IP)|HOST_?ADDR(ESS)?)$")
_MODEL_KEYS = frozenset({"model", "tokenizer", "model_path", "served_model_path"})
_TMP = re.compile(r"(?<![\w.~/-])/tmp(?=/|$|[\s,;:'\")\]])")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")


def _parse_ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """Parse ``10.1.2.3``, ``10.1.2.3:8000``, ``[fd00::1]:80``, ``tcp://host:port/x``."""
    s = _SCHEME.sub("", text.strip()).split("/", 1)[0]
    if s.startswith("["):
        s = s[1:].split("]", 1)[0]
    elif s.count(":") == 1:
        s = s.split(":", 1)[0]
    try:
        return ipaddress.ip_address(s)
    except ValueError:
        return None


def _as_ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """Return the address in ``text`` unless it is loopback or unspecified (same everywhere)."""
    addr = _parse_ip(text)
    if addr is None or addr.is_loopback or addr.is_unspecified:
        return None
    return addr


def _ips_in(value: Any) -> bool:
    if isinstance(value, str):
        parts = [p for p in re.split(r"[,\s;]+", value) if p]
        return any(_as_ip(p) is not None for p in parts)
    if isinstance(value, list):
        return any(_ips_in(v) for v in value)
    return False


def _is_set(value: Any) -> bool:
    return value not in (None, "", [], {}, False)


def _is_port(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, str) and value.isdigit())


#: ``(category, test(NAME_IN_UPPER_CASE, name, value))``, first match wins.
_FACTOR_RULES: tuple[tuple[str, Callable[[str, str, Any], bool]], ...] = (
    ("ray", lambda upper, _name, _value: bool(_RAY_KEY.search(upper))),
    ("ip", lambda _upper, _name, value: _ips_in(value)),
    ("port", lambda upper, _name, value: bool(_PORT_KEY.search(upper)) and _is_port(value)),
    (
        "address",
        lambda upper, _name, value: (
            bool(_ADDRESS_KEY.search(upper)) and isinstance(value, str) and not _parse_ip(value)
        ),
    ),
    (
        "model",
        lambda _upper, name, value: (
            name in _MODEL_KEYS and isinstance(value, str) and value.startswith("/")
        ),
    ),
    ("tmp", lambda _upper, _name, value: isinstance(value, str) and bool(_TMP.search(value))),
)


def classify_factor(key: str, value: Any) -> str | None:
    """Say why a vLLM hash factor changes from pod to pod: ``ip``, ``port``, ``ray``, ...; or None.

    ``key`` is the factor's dotted path in ``cache_key_factors.json``
    (``env.VLLM_HOST_IP``); only its last part is looked at. Categories:
    ``ip`` (an IPv4/IPv6 address other than loopback, alone or in a URL or
    ``host:port``), ``port`` (a ``*_PORT`` key with a number), ``ray`` (a Ray
    bundle index or placement group), ``address`` (a host/master address
    key), ``model`` (a local model path: mounts differ between pods),
    ``tmp`` (a path under ``/tmp``: often a per-run temp dir).
    """
    name = key.rsplit(".", 1)[-1]
    upper = name.upper()
    if not _is_set(value) or "VERSION" in upper:
        return None
    for category, test in _FACTOR_RULES:
        if test(upper, name, value):
            return category
    return None


def _walk_factors(node: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict):
        for key in sorted(node, key=str):
            path = f"{prefix}.{key}" if prefix else str(key)
            value = node[key]
            yield path, value
            if isinstance(value, dict | list):
                yield from _walk_factors(value, path)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            if isinstance(value, dict | list):
                yield from _walk_factors(value, f"{prefix}[{i}]")


def volatile_factors(factors: Mapping[str, Any]) -> list[tuple[str, Any, str]]:
    """Return ``(key, value, category)`` for every volatile value in a factors document.

    :mod:`artifactd.families.vllm` has a detector of its own; :func:`lint`
    merges its reasons with these, one finding per factor key.
    """
    found: list[tuple[str, Any, str]] = []
    covered: list[str] = []
    for key, value in _walk_factors(dict(factors), ""):
        if any(key.startswith(c + ".") or key.startswith(c + "[") for c in covered):
            continue
        category = classify_factor(key, value)
        if category is not None:
            found.append((key, value, category))
            covered.append(key)
    return found


def _family_volatile() -> Callable[[Any], list[tuple[Any, Any, Any]]] | None:
    """Return the vLLM family module's own detector, when it has one."""
    try:
        module = importlib.import_module("artifactd.families.vllm")
    except ModuleNotFoundError:
        return None
    fn = getattr(module, "volatile_factors", None)
    return fn if callable(fn) else None


def _show(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True)


_INDEX = re.compile(r"\[\d+\]")


def _why_category(why: str) -> str | None:
    """Map a reason given by the vLLM family's detector to a cost category."""
    low = why.lower()
    for needle, category in (
        ("ray", "ray"),
        ("port", "port"),
        ("ipv", "ip"),
        ("address", "address"),
        ("/tmp", "tmp"),  # noqa: S108 - a word in a message
    ):
        if needle in low:
            return category
    return None


def _factor_findings(doc: Any, family: str, component: str, rel: str) -> list[Finding]:
    """Volatile factors: ours by key, plus the vLLM family's (merged per key, list items folded)."""
    if not isinstance(doc, dict):
        return []
    ours = {key: (value, category) for key, value, category in volatile_factors(doc)}
    whys: dict[str, list[str]] = {}
    values: dict[str, list[str]] = {}
    theirs = _family_volatile()
    for key, value, why in theirs(doc) if theirs else []:
        base = _INDEX.sub("", str(key))
        whys.setdefault(base, [])
        if str(why) not in whys[base]:
            whys[base].append(str(why))
        if base not in ours and _show(value) not in values.setdefault(base, []):
            values[base].append(_show(value))
    out: list[Finding] = []
    for key in sorted({*ours, *whys}):
        reasons = whys.get(key, [])
        if key in ours:
            value, category = ours[key]
            shown: str = _show(value)
        else:
            category = next((c for c in map(_why_category, reasons) if c), "")
            shown = ", ".join(values[key])
        detail = f"factor {key}" + (f" ({category})" if category else "")
        if reasons:
            detail += ": " + "; ".join(reasons)
        out.append(
            Finding(
                severity=_VOLATILE_SEVERITY.get(category, "error"),
                kind=KIND_VOLATILE,
                family=family,
                component=component,
                file=rel,
                value=shown,
                cost=_VOLATILE_COST.get(
                    category,
                    "vLLM hashes this value into its cache dir name: a pod where it differs"
                    " gets a new dir and recompiles",
                ),
                detail=detail,
            )
        )
    return out


# --------------------------------------------------------------------------
# Scanning
# --------------------------------------------------------------------------

#: Bytes that end a path token (whitespace, quotes, separators, NUL).
_DELIMS = b" \t\r\n\x00\x0b\x0c\"'`<>|;,:()[]{}="
_TOKEN_END = re.compile(rb"[^" + re.escape(_DELIMS) + rb"]*")
#: How far a token is followed each way from a match.
_MAX_TOKEN = 4096


class _Matcher:
    """The hazards compiled into byte patterns, shared by every file."""

    def __init__(self, hazards: Hazards) -> None:
        self.python = frozenset(hazards.python_paths)
        every = sorted(
            {*hazards.paths, *hazards.python_paths}, key=lambda s: (-len(s), s)
        )  # longest first: the most specific label wins
        self.path_needles = [p.encode() for p in every]
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
                + b"|".join(re.escape(n.encode()) for n in names)
                + rb")(?![A-Za-z0-9])",
                re.IGNORECASE,
            )
            if names
            else None
        )

    def name_kind(self, found: str) -> tuple[str, str]:
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
class _Scope:
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


def _scan_content(
    data: bytes, rel: str, scope: _Scope, matcher: _Matcher, *, rewritten: bool
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
            key = matcher.name_kind(m.group().decode("utf-8", errors="replace"))
            hit = names.setdefault(key, _Hit(0, _example(data, left, right)))
            hit.count += 1

    out: list[Finding] = []
    factors = scope.family == "vllm" and PurePosixPath(rel).name == FACTORS_FILE
    for value, hit in paths.items():
        python = value in matcher.python
        what = "the build machine's Python install" if python else "a build-machine path"
        out.append(
            Finding(
                severity="warning" if binary else "error",
                kind=KIND_PATH,
                family=scope.family,
                component=scope.component,
                file=rel,
                value=value,
                cost=_path_cost(
                    scope.family,
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
                cost=_name_cost(scope.family, kind, in_name=False),
                detail=f"inside an embedded path, {_times(hit.count)}, e.g. {hit.example}",
            )
        )
    return out


def _times(n: int) -> str:
    return "once" if n == 1 else f"{n} times"


def _scan_name(
    name: str, rel: str, is_dir: bool, scope: _Scope, matcher: _Matcher
) -> list[Finding]:
    if matcher.name_re is None:
        return []
    out: dict[tuple[str, str], Finding] = {}
    for m in matcher.name_re.finditer(name.encode("utf-8", errors="surrogateescape")):
        kind, value = matcher.name_kind(m.group().decode("utf-8", errors="replace"))
        out.setdefault(
            (kind, value),
            Finding(
                severity="warning",
                kind=kind,
                family=scope.family,
                component=scope.component,
                file=rel,
                value=value,
                cost=_name_cost(scope.family, kind, in_name=True),
                detail="in the directory name" if is_dir else "in the file name",
            ),
        )
    return list(out.values())


def _walk(
    root: Path,
    scope: _Scope,
    invalid: Mapping[PurePosixPath, str],
    on_error: Callable[[str, OSError], None],
) -> Iterator[tuple[PurePosixPath, os.DirEntry[str], bool]]:
    """Yield what the harvest would pack: ``(rel, entry, is_dir)``, sorted, symlinks skipped."""
    stack: list[tuple[Path, PurePosixPath]] = [(root, PurePosixPath())]
    while stack:
        path, rel_dir = stack.pop()
        try:
            with os.scandir(path) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            on_error(rel_dir.as_posix(), exc)
            continue
        subdirs: list[tuple[Path, PurePosixPath]] = []
        for entry in entries:
            if entry.is_symlink():
                continue
            is_dir = entry.is_dir(follow_symlinks=False)
            if not is_dir and not entry.is_file(follow_symlinks=False):
                continue
            rel = rel_dir / entry.name
            if rel in invalid or scope.impl.excluded(scope.component, rel, is_dir):
                continue
            yield rel, entry, is_dir
            if is_dir:
                subdirs.append((Path(entry.path), rel))
        stack.extend(reversed(subdirs))


def _parse_key(key: str) -> tuple[str, str | None]:
    for sep in (":", "/"):
        if sep in key:
            family, comp = key.split(sep, 1)
            return family, comp or None
    return key, None


def root_key(family: str, component: str) -> str:
    """Return the ``roots`` key for one located component: ``family:component``."""
    return f"{family}:{component}"


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
    matcher = _Matcher(hazards)
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
            impl = Family()
        if comp is None:
            comps = getattr(impl, "components", ())
            comp = comps[0].name if comps else "cache"
        root_strs = dict.fromkeys([str(root.absolute()), os.path.realpath(root)])
        scope = _Scope(family_name, comp, impl, tuple(r.encode() for r in root_strs))
        findings.extend(_lint_root(root, scope, matcher, report, max_read))
    report.findings = sorted(findings, key=Finding.sort_key)
    report.unknown_families = sorted(unknown)
    report.unreadable.sort()
    return report


def _lint_root(
    root: Path, scope: _Scope, matcher: _Matcher, report: LintReport, max_read: int
) -> list[Finding]:
    out: list[Finding] = []
    invalid = scope.impl.invalid_entries(scope.component, root)

    def unreadable(rel: str, exc: OSError) -> None:
        report.unreadable.append(f"{scope.family}:{scope.component}:{rel}: {exc.strerror}")

    for rel, entry, is_dir in _walk(root, scope, invalid, unreadable):
        rel_s = rel.as_posix()
        out.extend(_scan_name(entry.name, rel_s, is_dir, scope, matcher))
        if is_dir:
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
        rewritten = scope.impl.path_bearing(scope.component, rel)
        out.extend(_scan_content(data, rel_s, scope, matcher, rewritten=rewritten))
        if scope.family == "vllm" and rel.name == FACTORS_FILE:
            try:
                doc = json.loads(data)
            except ValueError:
                report.unreadable.append(
                    f"{scope.family}:{scope.component}:{rel_s}: not JSON (or over the read cap)"
                )
                continue
            out.extend(_factor_findings(doc, scope.family, scope.component, rel_s))
    return out


__all__ = [
    "FACTORS_FILE",
    "KIND_HOST",
    "KIND_PATH",
    "KIND_USER",
    "KIND_VOLATILE",
    "MAX_READ",
    "Finding",
    "Hazards",
    "LintReport",
    "classify_factor",
    "lint",
    "root_key",
    "volatile_factors",
]
