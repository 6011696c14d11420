"""What ninja recorded beside a ``build.ninja``, moved to another root.

The second half of :mod:`artifactd.families.ninja`: the command each output
was built with, evaluated as ninja does, its hash as each log version records
it, and the rewriting of ``.ninja_log`` and ``.ninja_deps``. The formats were
learnt from ninja's own source (``src/build_log.cc``, ``src/deps_log.cc``,
``src/graph.cc``) and are checked against files ninja 1.11 and 1.13 wrote
(``tests/test_ninja_records.py``).
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Callable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from artifactd.families.base import ROOT_PLACEHOLDER
from artifactd.families.layouts import NINJA_FILE, NINJA_LOGS
from artifactd.families.ninja import (
    logical_lines,
    ninja_dirs,
    ninja_invalid_entries,
    split_build,
)

# Ninja keeps two records beside build.ninja. ``.ninja_log`` is text: a
# ``# ninja log v<N>`` line, then one tab-separated line per output (start ms,
# end ms, a recorded mtime, the output path, the hex hash of the command that
# built it). Ninja rebuilds an output whose current command hashes otherwise,
# and discards a log of a version it does not read (1.13 reads only v7). The
# hash is MurmurHash64A up to v6 (ninja 1.11, 1.12) and rapidhash from v7
# (ninja 1.13). ``.ninja_deps`` is binary: a signature, a version (4), then
# records of path (``~id`` as a checksum) or of deps (an output id, a 64-bit
# mtime, input ids). FlashInfer's paths are absolute, so both name the root the
# op was built at; moved elsewhere, ninja finds neither the deps of its outputs
# nor their commands and compiles again. Both are rewritten: paths by prefix,
# command hashes recomputed from the commands the build.ninja evaluates to.

#: First line of a normalised ``.ninja_log`` as a layer stores it (JSON lines follow).
RELOCATABLE_LOG = b"# artifactd relocatable ninja log v1\n"
_LOG_SIGNATURE = re.compile(rb"^# ninja log v(\d+)\n")
_DEPS_SIGNATURE = b"# ninjadeps\n"
_DEPS_VERSION = 4
_MAX_RECORD = (1 << 19) - 1
_MASK64 = (1 << 64) - 1
#: Log versions whose command hash this module computes.
LOG_VERSIONS = frozenset({5, 6, 7})
#: Characters ninja passes through ``$in``/``$out`` unquoted: a root made of others
#: is quoted there and not elsewhere, so a plain prefix swap would miss.
_SHELL_SAFE = re.compile(r"^[A-Za-z0-9_+\-./]*$")
_EVAL_REF = re.compile(r"\{([A-Za-z0-9_.-]+)\}|([A-Za-z0-9_-]+)")


def _murmur64a(data: bytes) -> int:
    """64-bit MurmurHash2 (MurmurHash64A) with ninja's seed: command hashes up to log v6."""
    m = 0xC6A4A7935BD1E995
    h = (0xDECAFBADDECAFBAD ^ (len(data) * m)) & _MASK64
    whole = len(data) - len(data) % 8
    for (word,) in struct.iter_unpack("<Q", data[:whole]):
        k = (word * m) & _MASK64
        k ^= k >> 47
        h = ((h ^ ((k * m) & _MASK64)) * m) & _MASK64
    tail = data[whole:]
    if tail:
        for i, byte in enumerate(tail):
            h ^= byte << (8 * i)
        h = (h * m) & _MASK64
    h ^= h >> 47
    h = (h * m) & _MASK64
    return h ^ (h >> 47)


_RAPID_SECRET = (0x2D358DCCAA6C78A5, 0x8BB84B93962EACC9, 0x4B33A62ED433D4A3)


def _rapid_mix(a: int, b: int) -> int:
    r = a * b
    return (r & _MASK64) ^ (r >> 64)


def _rapidhash(data: bytes) -> int:
    """Hash with rapidhash (the release ninja 1.13 vendors, its seed): command hashes of log v7."""
    s0, s1, s2 = _RAPID_SECRET
    n = len(data)
    seed = 0xBDD89AA982704029
    seed ^= _rapid_mix(seed ^ s0, s1) ^ n

    def r64(at: int) -> int:
        return int.from_bytes(data[at : at + 8], "little")

    def r32(at: int) -> int:
        return int.from_bytes(data[at : at + 4], "little")

    if n <= 16:
        if n >= 4:
            last = n - 4
            delta = (n & 24) >> (n >> 3)
            a = (r32(0) << 32) | r32(last)
            b = (r32(delta) << 32) | r32(last - delta)
        elif n > 0:
            a, b = (data[0] << 56) | (data[n >> 1] << 32) | data[n - 1], 0
        else:
            a = b = 0
    else:
        at, left = 0, n
        if left > 48:
            see1 = see2 = seed
            while left >= 48:
                seed = _rapid_mix(r64(at) ^ s0, r64(at + 8) ^ seed)
                see1 = _rapid_mix(r64(at + 16) ^ s1, r64(at + 24) ^ see1)
                see2 = _rapid_mix(r64(at + 32) ^ s2, r64(at + 40) ^ see2)
                at, left = at + 48, left - 48
            seed ^= see1 ^ see2
        if left > 16:
            seed = _rapid_mix(r64(at) ^ s2, r64(at + 8) ^ seed ^ s1)
            if left > 32:
                seed = _rapid_mix(r64(at + 16) ^ s2, r64(at + 24) ^ seed)
        a, b = r64(at + left - 16), r64(at + left - 8)
    product = (a ^ s1) * (b ^ seed)
    a, b = product & _MASK64, product >> 64
    return _rapid_mix(a ^ s0 ^ n, b ^ s1)


def command_hash(command: str, log_version: int) -> int:
    """Return the hash ninja records for ``command`` in a ``.ninja_log`` of ``log_version``."""
    if log_version not in LOG_VERSIONS:
        raise ValueError(f"ninja log v{log_version} is not one artifactd can rewrite")
    data = command.encode("utf-8", "surrogateescape")
    return _rapidhash(data) if log_version >= 7 else _murmur64a(data)


def _shell_escape(path: str) -> str:
    """Quote a path as ninja puts it into ``$in``/``$out`` on POSIX (when it is unsafe)."""
    if _SHELL_SAFE.match(path):
        return path
    return "'" + path.replace("'", "'\\''") + "'"


def _evaluate(
    raw: str, lookup: Mapping[str, str] | None, resolve: Callable[[str], str] | None = None
) -> str:
    """Evaluate ninja's ``$`` syntax in ``raw``: escapes, ``$name`` and ``${name}``.

    ``resolve`` (a callable) looks names up when given, else ``lookup`` does
    (an unknown name is empty, as in ninja).
    """
    out: list[str] = []
    i = 0
    while i < len(raw):
        c = raw[i]
        if c != "$" or i + 1 >= len(raw):
            out.append(c)
            i += 1
            continue
        nxt = raw[i + 1]
        if nxt in "$ :":
            out.append(nxt)
            i += 2
            continue
        m = _EVAL_REF.match(raw, i + 1)
        if m is None:
            out.append(c)
            i += 1
            continue
        name = m.group(1) or m.group(2)
        out.append(resolve(name) if resolve is not None else (lookup or {}).get(name, ""))
        i = m.end()
    return "".join(out)


def _split_value(line: str) -> tuple[str, str] | None:
    """``name = value`` with ninja's spacing: blanks before the value skipped, none after."""
    m = re.match(r"^([A-Za-z0-9_.-]+)[ \t]*=[ \t]*", line)
    return None if m is None else (m.group(1), line[m.end() :])


def _build_paths(rest: str) -> tuple[list[str], str, list[str], list[str]]:
    """Split ``build`` line text into (explicit outputs, rule, explicit inputs, other inputs)."""
    tokens = split_build(rest)
    colon = tokens.index(":")
    outs: list[str] = []
    for tok in tokens[:colon]:
        if tok == "|":
            break
        outs.append(tok)
    rule, after = tokens[colon + 1], tokens[colon + 2 :]
    explicit: list[str] = []
    other: list[str] = []
    bucket = explicit
    for tok in after:
        if tok in ("|", "||", "|@"):
            bucket = other
            continue
        bucket.append(tok)
    return outs, rule, explicit, other


def ninja_commands(text: str) -> dict[str, str]:
    """Map each explicit output of a ``build.ninja`` to the command ninja would run for it.

    Evaluated as ninja does: file variables when defined, build-statement
    bindings in the file scope, rule bindings lazily in the statement's scope,
    with ``$in``/``$out`` the explicit inputs/outputs, shell-quoted where
    needed. ``include``/``subninja`` are not followed (FlashInfer's per-op files
    have none); an edge of such a file would be missing from the result.
    """
    file_vars: dict[str, str] = {}
    rules: dict[str, dict[str, str]] = {}
    edges: list[tuple[list[str], str, list[str], dict[str, str]]] = []
    current: dict[str, str] | None = None
    in_rule = False
    for line in logical_lines(text):
        body = line.lstrip(" \t")
        if not body or body.startswith("#"):
            continue
        if body is not line and current is not None:
            pair = _split_value(body)
            if pair is not None:
                # A rule keeps raw text; a build's bindings are evaluated now, in the file scope.
                current[pair[0]] = pair[1] if in_rule else _evaluate(pair[1], file_vars)
            continue
        current, in_rule = None, False
        if body.startswith("rule "):
            current = rules.setdefault(body[len("rule ") :].strip(), {})
            in_rule = True
        elif body.startswith("build "):
            outs, rule, explicit, _other = _build_paths(body[len("build ") :])
            current = {}
            edges.append(
                (
                    [_evaluate(p, file_vars) for p in outs],
                    rule,
                    [_evaluate(p, file_vars) for p in explicit],
                    current,
                )
            )
        else:
            pair = _split_value(body)
            if pair is not None:
                file_vars[pair[0]] = _evaluate(pair[1], file_vars)
    commands: dict[str, str] = {}
    for outs, rule_name, ins, bindings in edges:
        bound = rules.get(rule_name)
        if bound is None or "command" not in bound:
            continue  # phony or unknown: no command, no hash
        commands.update(dict.fromkeys(outs, _edge_command(outs, ins, bindings, bound, file_vars)))
    return commands


def _edge_command(
    outs: list[str],
    ins: list[str],
    bindings: Mapping[str, str],
    rule: Mapping[str, str],
    file_vars: Mapping[str, str],
) -> str:
    def resolve(name: str, depth: int = 0) -> str:
        if name == "in":
            return " ".join(_shell_escape(p) for p in ins)
        if name == "in_newline":
            return "\n".join(_shell_escape(p) for p in ins)
        if name == "out":
            return " ".join(_shell_escape(p) for p in outs)
        if name in bindings:
            return bindings[name]
        if name in rule and depth < 32:
            return _evaluate(rule[name], None, lambda n: resolve(n, depth + 1))
        return file_vars.get(name, "")

    return _evaluate(rule["command"], None, resolve)


def _swap_prefix(path: str, old: tuple[str, ...], new: str) -> str:
    for prefix in old:
        p = prefix.rstrip("/")
        if path == p or path.startswith(p + "/"):
            return new.rstrip("/") + path[len(p) :]
    return path


def _read_log(data: bytes) -> tuple[int, list[list[str]]]:
    """Return a ``.ninja_log``'s version and its entries, the last one per output only.

    Ninja reads the log the same way (a later line for an output replaces an
    earlier one), so nothing it would use is dropped.
    """
    m = _LOG_SIGNATURE.match(data)
    if m is None:
        raise ValueError("not a ninja log (no '# ninja log v<N>' line)")
    latest: dict[str, list[str]] = {}
    for line in data[m.end() :].decode("utf-8", "surrogateescape").split("\n"):
        fields = line.split("\t")
        if len(fields) == 5:
            latest.pop(fields[3], None)  # keep the file's order of last writes
            latest[fields[3]] = fields
    return int(m.group(1)), list(latest.values())


def normalize_ninja_log(data: bytes, roots: tuple[str, ...], commands: Mapping[str, str]) -> bytes:
    """Store a ``.ninja_log`` so it can be written for any root.

    Each entry keeps its timings and recorded mtime; its output path has the
    harvest root (one of ``roots``) replaced by the placeholder; an output
    ``commands`` knows (from the build.ninja beside it) stores its command,
    likewise swapped, so :func:`relocate_ninja_log` can hash it again; the
    recorded hash is kept where the command is unknown or does not hash to
    it (ninja rebuilds that output anywhere; the harvest does not ship such
    an op, :func:`ninja_relocation_problem`, so this is only a race with a
    build writing the op meanwhile).
    """
    version, entries = _read_log(data)
    lines = [RELOCATABLE_LOG, json.dumps({"version": version}).encode() + b"\n"]
    for start, end, mtime, output, digest in entries:
        doc: dict[str, Any] = {"start": start, "end": end, "mtime": mtime}
        doc["output"] = _swap_prefix(output, roots, ROOT_PLACEHOLDER)
        command = commands.get(output)
        if command is not None and command_hash(command, version) == int(digest, 16):
            for root in roots:
                command = command.replace(root.rstrip("/") + "/", ROOT_PLACEHOLDER + "/")
            doc["command"] = command
        else:
            doc["hash"] = digest
        lines.append(json.dumps(doc, ensure_ascii=False).encode("utf-8", "surrogateescape") + b"\n")
    return b"".join(lines)


def relocate_ninja_log(data: bytes, root: str) -> bytes:
    """Write a stored (normalised) ``.ninja_log`` back as ninja's own, for ``root``.

    A ``root`` ninja would quote in ``$in``/``$out`` (a character outside
    ``[A-Za-z0-9_+-./]``) makes the commands differ from a plain substitution:
    their entries are left out, so ninja rebuilds those outputs (``status``
    then says so) rather than trusting a hash that would be wrong. FlashInfer
    itself cannot build under a root with a blank (its build.ninja does not
    escape paths).
    """
    exact = _SHELL_SAFE.match(root) is not None
    _head, _, rest = data.partition(b"\n")
    meta_line, _, body = rest.partition(b"\n")
    version = int(json.loads(meta_line)["version"])
    out = [f"# ninja log v{version}\n"]
    new = root.rstrip("/")
    for raw in body.decode("utf-8", "surrogateescape").splitlines():
        doc = json.loads(raw)
        output = str(doc["output"]).replace(ROOT_PLACEHOLDER, new)
        if "command" in doc:
            if not exact:
                continue
            digest = command_hash(str(doc["command"]).replace(ROOT_PLACEHOLDER, new), version)
        else:
            digest = int(str(doc["hash"]), 16)
        out.append(f"{doc['start']}\t{doc['end']}\t{doc['mtime']}\t{output}\t{digest:x}\n")
    return "".join(out).encode("utf-8", "surrogateescape")


def is_ninja_log(data: bytes, *, stored: bool) -> bool:
    """Whether ``data`` is a ``.ninja_log`` (``stored``: in the layer's normalised form)."""
    return data.startswith(RELOCATABLE_LOG) if stored else _LOG_SIGNATURE.match(data) is not None


def is_ninja_deps(data: bytes) -> bool:
    """Whether ``data`` is a ``.ninja_deps`` file."""
    return data.startswith(_DEPS_SIGNATURE)


def rewrite_ninja_deps(data: bytes, old: tuple[str, ...], new: str) -> bytes:
    """Rewrite the path records of a ``.ninja_deps`` under one of ``old`` to ``new``.

    Records are re-serialised in order, so node ids, their ``~id`` checksums
    and the deps records (output id, mtime, input ids) stay as ninja wrote
    them; only path records change length. Raises ``ValueError`` for a file
    that is not a version-4 deps log or is cut short.
    """
    if not data.startswith(_DEPS_SIGNATURE):
        raise ValueError("not a ninja deps log")
    at = len(_DEPS_SIGNATURE)
    if len(data) < at + 4 or struct.unpack_from("<i", data, at)[0] != _DEPS_VERSION:
        raise ValueError(f"ninja deps log of another version than {_DEPS_VERSION}")
    out = [data[: at + 4]]
    at += 4
    while at < len(data):
        if at + 4 > len(data):
            raise ValueError("ninja deps log cut short")
        (size,) = struct.unpack_from("<I", data, at)
        is_deps = bool(size & 0x80000000)
        size &= 0x7FFFFFFF
        record = data[at + 4 : at + 4 + size]
        if len(record) != size or size < 4 or size % 4:
            raise ValueError("ninja deps log cut short")
        at += 4 + size
        if is_deps:
            out.append(data[at - 4 - size : at])
            continue
        checksum = record[-4:]
        path = _swap_prefix(record[:-4].rstrip(b"\0").decode("utf-8", "surrogateescape"), old, new)
        raw = path.encode("utf-8", "surrogateescape")
        raw += b"\0" * ((4 - len(raw) % 4) % 4)
        if len(raw) + 4 > _MAX_RECORD:
            raise ValueError(f"path too long for a ninja deps record: {path[:80]}")
        out.append(struct.pack("<I", len(raw) + 4) + raw + checksum)
    return b"".join(out)


def ninja_relocation_problem(d: Path, roots: tuple[str, ...]) -> str | None:
    """Why the ninja records of module dir ``d`` cannot move to another root, or None.

    They can when the log is of a version this module hashes, every output
    the build.ninja names has a last log entry whose hash is that of its
    evaluated command (so the rewritten hash is what ninja will compute), the
    deps log parses, and the build root needs no shell quoting.
    """
    if not all(_SHELL_SAFE.match(r) for r in roots):
        return "FlashInfer module built under a path ninja quotes: its records cannot be moved"
    try:
        commands = ninja_commands((d / NINJA_FILE).read_text("utf-8", "surrogateescape"))
        version, entries = _read_log((d / NINJA_LOGS[0]).read_bytes())
        if version not in LOG_VERSIONS:
            return f"FlashInfer module with a ninja log v{version}: its hashes cannot be rewritten"
        logged = {e[3]: e[4] for e in entries}
        for output, command in commands.items():
            digest = logged.get(output)
            if digest is None:
                return f"FlashInfer module whose ninja log lacks {os.path.basename(output)}"
            if command_hash(command, version) != int(digest, 16):
                return (
                    f"FlashInfer module whose ninja log does not match its build.ninja for "
                    f"{os.path.basename(output)}: ninja would rebuild it"
                )
        if (d / NINJA_LOGS[1]).exists():
            rewrite_ninja_deps((d / NINJA_LOGS[1]).read_bytes(), roots, roots[0])
    except (OSError, ValueError) as exc:
        return f"FlashInfer module whose ninja records cannot be read: {exc}"
    return None


def log_commands(data: bytes, roots: tuple[str, ...]) -> dict[str, str]:
    """Return the commands of the build.ninja files beside the outputs a ``.ninja_log`` names.

    FlashInfer runs ninja in the op's dir with absolute outputs there, so each
    output under one of ``roots`` locates its build.ninja (a batch build's log
    names several ops). A build.ninja that cannot be read adds nothing (those
    entries keep their hashes).
    """
    _version, entries = _read_log(data)
    inside = [e[3] for e in entries if _swap_prefix(e[3], roots, ROOT_PLACEHOLDER) != e[3]]
    dirs = {os.path.dirname(output) for output in inside}
    commands: dict[str, str] = {}
    for d in sorted(dirs):
        try:
            text = (Path(d) / NINJA_FILE).read_text("utf-8", "surrogateescape")
        except OSError:
            continue
        commands.update(ninja_commands(text))
    return commands


def ninja_relocation_problems(
    root: Path, roots: tuple[str, ...], prefix: PurePosixPath | None = None
) -> dict[PurePosixPath, str]:
    """Return the module dirs under ``root`` whose records cannot move, as ``prefix/<rel>``.

    ``roots`` are the spellings of the harvested component's root (the one the
    placeholder stands for); dirs :func:`ninja_invalid_entries` reports are its.
    """
    prefix = prefix or PurePosixPath()
    invalid = ninja_invalid_entries(root)
    bad: dict[PurePosixPath, str] = {}
    for d in ninja_dirs(root):
        rel = PurePosixPath(d.relative_to(root).as_posix())
        if rel not in invalid and (problem := ninja_relocation_problem(d, roots)) is not None:
            bad[prefix / rel] = problem
    return bad


def normalize_ninja_record(data: bytes, roots: tuple[str, ...]) -> bytes | None:
    """Return ninja's ``.ninja_deps``/``.ninja_log`` in the stored form; None for other files.

    A record damaged since the harvest checked it (an op being rebuilt) is
    stored as it is: ninja rebuilds that op on the pod, and ``status`` says so.
    """
    try:
        if is_ninja_deps(data):
            return rewrite_ninja_deps(data, roots, ROOT_PLACEHOLDER)
        if is_ninja_log(data, stored=False):
            return normalize_ninja_log(data, roots, log_commands(data, roots))
    except ValueError:
        return data
    return None


def relocate_ninja_record(data: bytes, root: str) -> bytes | None:
    """Return a stored ninja record written for ``root`` (hashes computed again); None else."""
    if is_ninja_deps(data):
        try:
            return rewrite_ninja_deps(data, (ROOT_PLACEHOLDER,), root)
        except ValueError:
            return data  # stored as is (see normalize_ninja_record): ninja starts over
    if is_ninja_log(data, stored=True):
        return relocate_ninja_log(data, root)
    return None
