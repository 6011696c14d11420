"""What an engine's own log says about its compile caches (``artifactd status --engine-log``).

Files written under the restored dirs tell whether the engine compiled there;
the engine's log tells what it did and where. This module reads a log once
(streamed, any size, ANSI colours stripped) and keeps the lines below, quoted
from the sources that print them; the same read times the engine's start
(:mod:`artifactd.pod.phases`).

vLLM (vllm-project/vllm, ``vllm/compilation/backends.py``, read at commits
8ea6b37 (early 2025) and 0041b00 (late 2025)):

* ``Using cache directory: %s for vLLM's torch.compile`` (``VllmBackend.__call__``):
  the dir vLLM chose, ``<VLLM_CACHE_ROOT>/torch_compile_cache/<hash>/rank_<r>_<dp>``
  (with ``/<prefix>`` such as ``backbone`` in later releases);
* ``vLLM's torch.compile cache is disabled.`` (``VLLM_DISABLE_COMPILE_CACHE=1``);
* a hit, once per shape after its last piecewise graph (``CompilerManager.compile``):
  ``Directly load the compiled graph(s) for shape %s from the cache, took %.3f s``;
  later ``... for dynamic shape from the cache, took %.3f s`` and
  ``... for compile range %s from the cache, took %.3f s``;
* a miss: ``Compiling a graph for general shape takes %.2f s`` and
  ``Compiling a graph for shape %s takes %.2f s``; later ``... for dynamic shape
  takes``, ``... for dynamic compile range takes`` and ``... for compile range %s
  takes %.2f s``.

vLLM's AOT path (``vllm/compilation/decorators.py`` at 01a7e5d, and the
``AotCompileCache`` class of 2026, which moved the dir under
``torch_compile_cache/torch_aot_compile/<sha256>/rank_<r>_<dp>/model``):
``Directly load AOT compilation from path %s`` (a hit); ``Cannot load aot
compilation from path %s, error: %s`` and ``Compiling model again due to a load
failure from %s, reason: %s`` (a restored artifact that did not load: a miss);
``saved AOT compiled function to %s`` (a fresh compile saved: a miss).

torch (``torch/_inductor/codecache.py``, ``FxGraphCache.load_with_key``, torch
2.13.0; logged at INFO, so with ``TORCH_LOGS=inductor``):
``fx graph cache hit for key %s`` and ``fx graph cache miss for key %s``, the
events behind the ``counters["inductor"]["fxgraph_cache_hit"/"_miss"]``
counters. A printed counters mapping (a ``Counter`` repr or JSON with
``fxgraph_cache_hit``/``fxgraph_cache_miss`` keys) is read too; torch has no
standard periodic dump of them. When the log also holds vLLM's lines, the
fx-graph lines are vLLM's (vLLM points Inductor into its own cache dir) and are
not given to the ``inductor`` family.

The CPU demo's warm-up (``warmup_matrices/cpu-demo/warmup.py``) prints one JSON
report: per part ``hits`` and ``compiled`` from Inductor's fx-graph counters
(``inductor``), Triton's compilation listener (``triton``) and ptxas's record
in the cubin (``nvcc``, the ``generic`` family).

Triton prints nothing about its cache: hits are seen only through
``triton.knobs.compilation.listener`` (``cache_hit=True``, what the demo
reports) or a custom ``TRITON_CACHE_MANAGER``. Without one of those, Triton
gives no log evidence and its verdict rests on the files written.

The dirs vLLM names are checked against the restored ``VLLM_CACHE_ROOT``: a
dir outside it means the env file did not reach the engine (``HOME`` or
``XDG_CACHE_HOME`` decided its root); a hash dir the restore did not install
means a hash factor differs from the build's (a pod IP, ``HOME``, the model
path, ``--max-num-batched-tokens``...), and when vLLM wrote its
``cache_key_factors.json`` there, the factors that differ are named.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, TypeGuard

from artifactd.families.vllm import classify_factor, read_factors
from artifactd.fsutil import open_regular, read_lines
from artifactd.pod.phases import MAX_READ_BYTES, MAX_READ_LINE, PhaseClock, PhaseTime, log_count
from artifactd.pod.verdict import written_after

#: Evidence lines kept per family, and differing hash factors named per dir.
MAX_LINES = 5
MAX_FACTORS = 8
#: Distinct cache dirs kept from one log (a rank names its own: 64 is 8 nodes of
#: 8 GPUs), and the longest path kept (PATH_MAX): a log naming more is input,
#: and each line's work stays constant.
MAX_DIRS = 64
MAX_PATH = 4096
#: A count read from a warm-up report is believed up to this.
MAX_COUNT = 10**9

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# The lines with a free-form middle (``head(.+?)tail``) are read by :func:`_between`,
# linear in the line: a lazy regex tries every head to the end of the line, and
# one hostile 64 KiB line of heads took seconds.
_VLLM_DIR = ("Using cache directory: ", " for vLLM's torch.compile")
_VLLM_DISABLED = "vLLM's torch.compile cache is disabled."
_VLLM_HIT = ("Directly load the compiled graph(s) for ", " from the cache, took ")
_VLLM_MISS = "Compiling a graph for "
_VLLM_MISS_TAIL = re.compile(r" takes [0-9.]+ s")
_VLLM_AOT_HIT = re.compile(r"Directly load AOT compilation from path (?P<path>\S+)")
_VLLM_AOT_MISS = (
    ("Cannot load aot compilation from path ", ", error: "),
    ("Compiling model again due to a load failure from ", ", reason: "),
)
_VLLM_AOT_SAVED = re.compile(r"saved AOT compiled function to (?P<path>\S+)")
_FX = re.compile(r"fx graph cache (?P<what>hit|miss) for key ")
_COUNTER = re.compile(r"['\"]fxgraph_cache_(?P<what>hit|miss)['\"]\s*:\s*(?P<n>\d+)")
#: The CPU demo report's parts, and the family each one is evidence for.
_DEMO_PARTS = {"inductor": "inductor", "triton": "triton", "nvcc": "generic"}
_DEMO = "warm-up report (warmup_matrices/cpu-demo/warmup.py)"


@dataclass
class Tally:
    """Hits and misses of one kind of evidence, with the first few lines that said so."""

    hits: int = 0
    misses: int = 0
    lines: list[str] = field(default_factory=list)

    def add(self, hit: bool, line: str, n: int = 1) -> None:
        """Count ``n`` hits (or misses) that ``line`` reported."""
        if hit:
            self.hits += n
        else:
            self.misses += n
        if len(self.lines) < MAX_LINES:
            self.lines.append(line[:400])

    @property
    def seen(self) -> bool:
        """Whether anything was counted."""
        return bool(self.hits or self.misses)


@dataclass
class LogFacts:
    """Everything one read of an engine log found, before it is matched with a target."""

    path: str
    lines: int = 0
    vllm: Tally = field(default_factory=Tally)
    #: vLLM's chosen cache dirs and AOT artifact paths, in first-seen order
    #: (the first :data:`MAX_DIRS`; ``more_dirs`` counts the lines naming others).
    vllm_dirs: list[str] = field(default_factory=list)
    more_dirs: int = 0
    vllm_disabled: bool = False
    fx_graph: Tally = field(default_factory=Tally)
    #: The last printed counters mapping: ``{"hit": n, "miss": n}``.
    counters: dict[str, int] = field(default_factory=dict)
    counters_line: str = ""
    demo: dict[str, Tally] = field(default_factory=dict)
    #: The start's phases (:mod:`artifactd.pod.phases`).
    clock: PhaseClock = field(default_factory=PhaseClock)
    _dir_set: set[str] = field(default_factory=set, repr=False)

    def remember_dir(self, path: str) -> None:
        """Keep a dir vLLM named, once, up to :data:`MAX_DIRS` (constant work per line)."""
        if path in self._dir_set:
            return
        if len(self.vllm_dirs) >= MAX_DIRS or len(path) > MAX_PATH:
            self.more_dirs += 1
            return
        self._dir_set.add(path)
        self.vllm_dirs.append(path)

    @property
    def has_vllm(self) -> bool:
        """Whether vLLM's own lines are in the log."""
        return self.vllm.seen or bool(self.vllm_dirs) or self.vllm_disabled

    def phases(self) -> list[PhaseTime]:
        """Return the engine's start phases; vLLM's compile outcome is its hit and miss lines'."""
        outcome = None
        if self.vllm.misses or self.vllm_disabled:
            outcome = "compiled"
        elif self.vllm.hits:
            outcome = "hit"
        return self.clock.phases(compile_outcome=outcome)


@dataclass(frozen=True)
class OtherDir:
    """A cache dir the engine used that the restore did not install, and why.

    ``factors`` names the hash factors that differ from the closest restored
    dir's (``key: restored -> engine``), when vLLM wrote them there.
    """

    path: str
    why: str
    factors: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class EngineEvidence:
    """What the engine's log says about one family.

    ``source`` names what said it; ``hits`` and ``misses`` count what it
    loaded and what it compiled; ``cache_dirs`` are the dirs it said it used
    (vLLM), ``other_dirs`` those the restore did not install; ``lines`` the
    first few evidence lines, as logged.
    """

    family: str
    source: str
    hits: int
    misses: int
    cache_dirs: list[str] = field(default_factory=list)
    other_dirs: list[OtherDir] = field(default_factory=list)
    cache_disabled: bool = False
    lines: list[str] = field(default_factory=list)

    @property
    def compiled(self) -> bool:
        """Whether the engine says it compiled (a miss, or its cache was switched off).

        What the log alone says; a family's verdict weighs it with the files
        written (:func:`artifactd.pod.verdict.judge`).
        """
        return self.misses > 0 or self.cache_disabled


def read_log(path: str | Path) -> LogFacts:
    """Read an engine log (``-``: standard input) and collect its evidence.

    Raises ``OSError`` when the file cannot be read, and for anything but a
    regular file (a symlink to one is followed, as log dirs use them): a FIFO
    would block and a device never end; a pipe is read as ``-``. Bytes that are
    not UTF-8 are replaced. Bounded (:mod:`artifactd.pod.phases` holds the
    bounds): the read stops at the file's size when opened (a log the engine
    is still writing is not chased) and at :data:`~artifactd.pod.phases.MAX_READ_BYTES`;
    a line longer than :data:`~artifactd.pod.phases.MAX_READ_LINE` bytes is
    read as its first that many; lines are streamed, so memory is constant.
    """
    if str(path) == "-":
        lines = read_lines(sys.stdin.buffer, max_bytes=MAX_READ_BYTES, max_line=MAX_READ_LINE)
        return scan(lines, "-")
    with open_regular(path, follow=True) as handle:
        budget = min(os.fstat(handle.fileno()).st_size, MAX_READ_BYTES)
        return scan(read_lines(handle, max_bytes=budget, max_line=MAX_READ_LINE), str(path))


def scan(lines: Iterable[bytes | str], name: str = "") -> LogFacts:
    """Collect the evidence of ``lines`` (bytes or text, one log line each)."""
    facts = LogFacts(path=name)
    for raw in lines:
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        facts.lines += 1
        _line(facts, facts.clock.feed(_ANSI.sub("", text).strip()).strip())
    return facts


def _line(facts: LogFacts, line: str) -> None:  # noqa: PLR0911 - one return per kind of line
    if not line:
        return
    if (path := _between(line, *_VLLM_DIR)) is not None:
        facts.remember_dir(path)
        return
    if _VLLM_DISABLED in line:
        facts.vllm_disabled = True
        return
    if _between(line, *_VLLM_HIT) is not None:
        facts.vllm.add(True, line)
        return
    if (at := line.find(_VLLM_MISS)) >= 0 and _VLLM_MISS_TAIL.search(
        line, at + len(_VLLM_MISS) + 1
    ):
        facts.vllm.add(False, line)
        return
    if (m := _VLLM_AOT_HIT.search(line)) is not None:
        facts.remember_dir(m.group("path"))
        facts.vllm.add(True, line)
        return
    for head, tail in _VLLM_AOT_MISS:
        if (path := _between(line, head, tail)) is not None:
            facts.remember_dir(path)
            facts.vllm.add(False, line)
            return
    if (m := _VLLM_AOT_SAVED.search(line)) is not None:
        facts.remember_dir(m.group("path"))
        facts.vllm.add(False, line)
        return
    if (m := _FX.search(line)) is not None:
        facts.fx_graph.add(m.group("what") == "hit", line)
        return
    counters = {
        m.group("what"): n
        for m in _COUNTER.finditer(line)
        if (n := log_count(m.group("n"))) is not None
    }
    if counters:
        facts.counters = counters
        facts.counters_line = line[:400]
        return
    if line.startswith("{") and line.endswith("}"):
        _demo_report(facts, line)


def _between(line: str, head: str, tail: str) -> str | None:
    """Return what ``head(.+?)tail`` would capture in ``line``, or None; linear in the line.

    The first ``head``, then the first ``tail`` at least one character after
    it: when the first head has no tail after it, no later head has one.
    """
    start = line.find(head)
    if start < 0:
        return None
    start += len(head)
    end = line.find(tail, start + 1)
    return None if end < 0 else line[start:end]


def _demo_report(facts: LogFacts, line: str) -> None:
    """Count the CPU demo report's parts: ``{"inductor": {"hits": n, "compiled": n}, ...}``."""
    try:
        doc = json.loads(line)
    except (ValueError, RecursionError):  # a line of 30,000 brackets is a RecursionError
        return
    if not isinstance(doc, dict):
        return
    for part, family in _DEMO_PARTS.items():
        body = doc.get(part)
        if not isinstance(body, dict):
            continue
        hits, compiled = body.get("hits"), body.get("compiled")
        if _count(hits) and _count(compiled):
            tally = facts.demo.setdefault(family, Tally())
            tally.hits += hits
            tally.misses += compiled
            if len(tally.lines) < MAX_LINES:
                tally.lines.append(f"{part}: {json.dumps(body, sort_keys=True)}"[:400])


def _count(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT


# --------------------------------------------------------------------------
# Matching the log with what was restored
# --------------------------------------------------------------------------


def evidence(
    facts: LogFacts,
    family: str,
    *,
    dirs: Mapping[str, str] | None = None,
    cutoff: float | None = None,
) -> EngineEvidence | None:
    """Return what ``facts`` say about ``family``, or None when they say nothing.

    ``dirs`` are the family's installed component dirs (the marker's) and
    ``cutoff`` the time of the restore: with them, the dirs vLLM names are
    checked against what the restore installed.
    """
    if family == "vllm":
        return _vllm(facts, dirs, cutoff)
    if family == "inductor" and not facts.has_vllm:
        if facts.fx_graph.seen:
            tally = facts.fx_graph
            return EngineEvidence(
                family,
                "torch log (TORCH_LOGS=inductor)",
                tally.hits,
                tally.misses,
                lines=list(tally.lines),
            )
        if facts.counters:
            return EngineEvidence(
                family,
                "torch counters (counters['inductor'])",
                facts.counters.get("hit", 0),
                facts.counters.get("miss", 0),
                lines=[facts.counters_line],
            )
    demo = facts.demo.get(family)
    if demo is not None:
        return EngineEvidence(family, _DEMO, demo.hits, demo.misses, lines=list(demo.lines))
    return None


def _vllm(
    facts: LogFacts, dirs: Mapping[str, str] | None, cutoff: float | None
) -> EngineEvidence | None:
    if not facts.has_vllm:
        return None
    root = dirs.get("cache") if dirs else None
    others = other_dirs(facts.vllm_dirs, Path(root), cutoff) if root and cutoff else []
    return EngineEvidence(
        "vllm",
        "vLLM log",
        facts.vllm.hits,
        facts.vllm.misses,
        cache_dirs=list(facts.vllm_dirs),
        other_dirs=others,
        cache_disabled=facts.vllm_disabled,
        lines=list(facts.vllm.lines),
    )


def key_dir(rel: PurePosixPath) -> PurePosixPath | None:
    """Return the hash dir a path under ``VLLM_CACHE_ROOT`` belongs to, or None.

    ``torch_compile_cache/<hash>``, ``torch_compile_cache/torch_aot_compile/<sha256>``
    or (older AOT releases) ``torch_aot_compile/<sha256>``.
    """
    parts = rel.parts
    if len(parts) >= 3 and parts[:2] == ("torch_compile_cache", "torch_aot_compile"):
        return PurePosixPath(*parts[:3])
    if len(parts) >= 2 and parts[0] in ("torch_compile_cache", "torch_aot_compile"):
        return PurePosixPath(*parts[:2])
    return None


def restored_key_dirs(root: Path, cutoff: float) -> set[PurePosixPath]:
    """Return the hash dirs under ``root`` holding a file as old as the restore (restored ones).

    A file is the restore's when it was not written after it
    (:func:`artifactd.pod.verdict.written_after`, the rule ``status`` counts by).
    """
    found: set[PurePosixPath] = set()
    for top in ("torch_compile_cache", "torch_aot_compile"):
        for rel, st in _files(root / top, PurePosixPath(top)):
            key = key_dir(rel)
            if key is not None and key not in found and not written_after(st, cutoff):
                found.add(key)
    return found


def _files(root: Path, rel: PurePosixPath) -> Iterator[tuple[PurePosixPath, os.stat_result]]:
    """Every regular file under ``root`` (symlinks not followed), with its lstat.

    Walked with a stack, not recursion: a tree nested deeper than Python's
    recursion limit is the engine's to write.
    """
    pending = [(root, rel)]
    while pending:
        top, top_rel = pending.pop()
        try:
            entries = list(os.scandir(top))
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if entry.is_dir(follow_symlinks=False):
                pending.append((Path(entry.path), top_rel / entry.name))
            elif entry.is_file(follow_symlinks=False):
                yield top_rel / entry.name, st


def other_dirs(paths: Iterable[str], root: Path, cutoff: float) -> list[OtherDir]:
    """Return the dirs among ``paths`` (vLLM's) that the restore into ``root`` did not install.

    One entry per hash dir (every rank names its own ``rank_<r>_<dp>``). The
    restored tree is walked once, and vLLM's factor files read once, however
    many dirs there are.
    """
    root = Path(os.path.normpath(root))
    restored: set[PurePosixPath] | None = None
    factors: dict[str, dict[str, Any]] | None = None
    seen: set[object] = set()
    out: list[OtherDir] = []
    for text in paths:
        path = Path(os.path.normpath(text))
        if not path.is_absolute() or not path.is_relative_to(root):
            if ("outside", str(path)) in seen:
                continue
            seen.add(("outside", str(path)))
            out.append(
                OtherDir(
                    text,
                    f"outside the restored VLLM_CACHE_ROOT {root}: the engine did not get the "
                    "env file's VLLM_CACHE_ROOT (HOME or XDG_CACHE_HOME decided its root)",
                )
            )
            continue
        key = key_dir(PurePosixPath(path.relative_to(root).as_posix()))
        if key is None or key in seen:
            continue
        seen.add(key)
        if restored is None:
            restored = restored_key_dirs(root, cutoff)
        if key in restored:
            continue
        if key.parts[0] == "torch_aot_compile":
            why = (
                f"{key} is vLLM's older AOT layout (at the root, not under "
                "torch_compile_cache/), which the vllm family does not ship"
            )
            out.append(OtherDir(text, why))
            continue
        if factors is None and key.parts[0] == "torch_compile_cache":
            factors = read_factors(root)
        out.append(
            OtherDir(
                text,
                f"{key} is not a dir the restore installed: a hash factor differs from the "
                "build's (a pod IP, HOME, the model path, --max-num-batched-tokens...)",
                differing_factors(root, key, restored, factors),
            )
        )
    return out


def differing_factors(
    root: Path,
    key: PurePosixPath,
    restored: set[PurePosixPath],
    factors: Mapping[str, dict[str, Any]] | None = None,
) -> list[str]:
    """Name the hash factors of ``key`` that differ from the closest restored hash dir's.

    Reads the ``cache_key_factors.json`` vLLM writes into each hash dir
    (:func:`artifactd.families.vllm.read_factors`; ``factors`` when already
    read); empty when the new dir has none (vLLM compiled elsewhere, or an AOT
    dir, which keeps none).
    """
    if key.parts[0] != "torch_compile_cache" or len(key.parts) != 2:
        return []

    if factors is None:
        factors = read_factors(root)
    mine = factors.get(key.name)
    if mine is None:
        return []
    engine = _flatten(mine)
    best: list[str] | None = None
    for name, theirs in sorted(factors.items()):
        if PurePosixPath("torch_compile_cache", name) not in restored:
            continue
        built = _flatten(theirs)
        diffs = [
            _describe(k, built.get(k), engine.get(k), classify_factor(k, engine.get(k)))
            for k in sorted(set(built) | set(engine))
            if built.get(k) != engine.get(k)
        ]
        if best is None or len(diffs) < len(best):
            best = diffs
    if best is None:
        return []
    return best[:MAX_FACTORS] + (
        [f"... and {len(best) - MAX_FACTORS} more"] if len(best) > MAX_FACTORS else []
    )


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted keys of nested objects; a list is one value (as vLLM hashes it)."""
    if not isinstance(node, dict):
        return {prefix: node}
    out: dict[str, Any] = {}
    for name, value in node.items():
        out.update(_flatten(value, f"{prefix}.{name}" if prefix else str(name)))
    return out


def _describe(key: str, built: Any, engine: Any, category: str | None) -> str:
    def short(value: Any) -> str:
        text = json.dumps(value, sort_keys=True)
        return text if len(text) <= 80 else text[:77] + "..."

    tail = f" ({category})" if category else ""
    return f"{key}: {short(built)} restored -> {short(engine)} engine{tail}"
