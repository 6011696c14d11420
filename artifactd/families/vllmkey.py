"""vLLM's torch.compile cache key, recomputed from its recorded factors: the pure recipe.

vLLM names each compile cache dir ``torch_compile_cache/<key>`` where
``<key>`` is the first 10 hex of a sha256 over four factor groups: ``env``
(every registered vLLM variable minus an ignore list, at its parsed value),
``config`` (each sub-config's compile factors), ``code`` (path and content of
every traced source file) and ``compiler`` (Inductor's system factors: GPU
name, CUDA; ``torch_key``; Inductor and functorch config). Two recipes are
known, each held to its release's source by ``tests/test_drift_guards.py``:

* :data:`RECIPE_033` (the vllm 0.33.0 release): ``sha256(str([env_hash,
  config_hash, code_hash, compiler_hash]))``, where ``env_hash`` is the sha256
  of ``json.dumps(env, sort_keys=True)`` and the other three are opaque
  strings. ``cache_key_factors.json`` records ``env`` raw and the three
  others as hashes only (no per-file code hashes); ``code_hash`` is the
  sha256 of the sorted traced paths, each followed by its text, joined by
  newlines (``<string>`` skipped).
* :data:`RECIPE_MAIN` (vLLM's main branch of late 2026): ``sha256(json.dumps(
  {"env", "config", "code": {"files": code}, "compiler"}, sort_keys=True))``;
  the file records all four raw, ``code`` as ``[{"path", "hash"}]`` where
  ``hash`` is the sha256 of ``json.dumps({"content": text}, sort_keys=True)``.

:func:`self_check` recomputes a dir name from its recorded factors: a file
that no known recipe reproduces says ``unknown recipe``, and nothing is
predicted from it (a guess would be worse than no answer). :func:`compare`
sets the recorded factors against what a pod gives (:class:`PodFactors`)
and returns one :class:`FactorCheck` per group: ``match``, ``differs`` (each
difference named, recorded -> pod) or ``unknown`` (with the reason).
Volatility is not judged here: :func:`artifactd.families.vllm.classify_factor`
is its one owner, and a difference carries its category.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from artifactd.families.vllm import classify_factor

RECIPE_033 = "vllm-0.33"
RECIPE_MAIN = "vllm-main"
#: Every recipe :func:`self_check` knows, in the order tried.
RECIPES = (RECIPE_MAIN, RECIPE_033)
#: The factor groups, in the order reported.
GROUPS = ("env", "config", "code", "compiler")
#: Length of a cache dir name (hex digits of the sha256).
KEY_HEX = 10
#: The file name vLLM gives dynamically generated code (``exec``): never hashed.
NO_FILE = "<string>"
#: Most differences named per group (the rest are counted).
MAX_NAMED = 20
_SITE = "/site-packages/"
#: Longest value shown in a difference (a path in a deep venv fits).
MAX_VALUE_CHARS = 400

FactorStatus = Literal["match", "differs", "unknown"]


def hash_factors(items: Any) -> str:
    """Return vLLM's ``hash_factors``: sha256 hex of ``json.dumps(items, sort_keys=True)``."""
    return hashlib.sha256(json.dumps(items, sort_keys=True).encode()).hexdigest()


def content_hash(text: str) -> str:
    """Return the per-file ``hash`` of :data:`RECIPE_MAIN`'s code factors."""
    return hash_factors({"content": text})


def code_hash_033(files: Sequence[tuple[str, str | None]]) -> str:
    """:data:`RECIPE_033`'s ``code_hash`` of ``(path, text or None when unreadable)``.

    Sorted by path; ``<string>`` is skipped; an unreadable file adds its path only.
    """
    parts: list[str] = []
    for path, text in sorted(files, key=lambda f: f[0]):
        if path == NO_FILE:
            continue
        parts.append(path)
        if text is not None:
            parts.append(text)
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def recipe_of(doc: Mapping[str, Any]) -> str | None:
    """Which recipe's record ``doc`` looks like (by its keys); None when neither."""
    if all(k in doc for k in GROUPS) and isinstance(doc.get("code"), list):
        return RECIPE_MAIN
    if "env" in doc and all(
        isinstance(doc.get(k), str) for k in ("config_hash", "code_hash", "compiler_hash")
    ):
        return RECIPE_033
    return None


def dir_key(doc: Mapping[str, Any], recipe: str) -> str:
    """Return the cache dir name ``recipe`` gives for the recorded factors ``doc``."""
    if recipe == RECIPE_MAIN:
        everything = {
            "env": doc["env"],
            "config": doc["config"],
            "code": {"files": doc["code"]},
            "compiler": doc["compiler"],
        }
        return hash_factors(everything)[:KEY_HEX]
    if recipe == RECIPE_033:
        env_hash = hash_factors(doc["env"])
        factors = [env_hash, doc["config_hash"], doc["code_hash"], doc["compiler_hash"]]
        return hashlib.sha256(str(factors).encode()).hexdigest()[:KEY_HEX]
    raise ValueError(f"unknown recipe {recipe!r}")


def self_check(name: str, doc: Mapping[str, Any]) -> str | None:
    """Return the recipe that recomputes the dir ``name`` from ``doc``; None: unknown recipe."""
    recipe = recipe_of(doc)
    if recipe is None:
        return None
    try:
        return recipe if dir_key(doc, recipe) == name else None
    except (TypeError, ValueError, RecursionError):
        return None


@dataclass(frozen=True)
class Difference:
    """One factor that differs: its dotted key, the recorded and the pod's value.

    ``category`` is :func:`~artifactd.families.vllm.classify_factor`'s word for
    a value that changes from pod to pod (``port``, ``model``...), else None.
    """

    key: str
    recorded: Any
    pod: Any
    category: str | None = None

    def describe(self) -> str:
        """``key: recorded -> pod`` with short JSON values."""
        tail = f" ({self.category})" if self.category else ""
        return f"{self.key}: {_short(self.recorded)} -> {_short(self.pod)}{tail}"


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= MAX_VALUE_CHARS else text[: MAX_VALUE_CHARS - 3] + "..."


@dataclass(frozen=True)
class FactorCheck:
    """The verdict on one factor group: ``match``, ``differs`` or ``unknown`` (with ``reason``)."""

    group: str
    status: FactorStatus
    differences: tuple[Difference, ...] = ()
    reason: str = ""
    #: How many differences there were in all (``differences`` holds at most :data:`MAX_NAMED`).
    total: int = 0


#: Reads a traced file for the code check: its text, or None when missing/unreadable.
FileReader = Callable[[str], "str | None"]


@dataclass(frozen=True)
class PodFactors:
    """What the pod gives for each factor group; None where it cannot be computed here.

    ``env``: the engine's env factors computed under the pod's environment.
    ``config``/``compiler``: whole groups computed by the engine's image, when
    it could (``config_hash``/``compiler_hash``: the 0.33 hashes, likewise).
    ``config_leaves``/``compiler_leaves``: single values the pod's arguments,
    the model's ``config.json``, NVML or the node's labels give
    (``max_num_batched_tokens``, ``dtype``, ``device.name``, ``torch_key``):
    each is compared with every recorded leaf whose dotted key ends with it.
    ``read_file``: reads a traced file in this image; ``relocations``:
    ``(recorded prefix, pod prefix)`` pairs tried for a file missing at its
    recorded path (another venv or site-packages), to say it moved;
    ``site_packages``: this image's site-packages dirs, tried the same way for
    a recorded path under a ``site-packages`` dir.
    ``why``: the reason a group is None, by group.
    """

    env: Mapping[str, Any] | None = None
    config: Mapping[str, Any] | None = None
    compiler: Mapping[str, Any] | None = None
    config_hash: str | None = None
    compiler_hash: str | None = None
    config_leaves: Mapping[str, Any] = field(default_factory=dict)
    compiler_leaves: Mapping[str, Any] = field(default_factory=dict)
    read_file: FileReader | None = None
    relocations: tuple[tuple[str, str], ...] = ()
    site_packages: tuple[str, ...] = ()
    why: Mapping[str, str] = field(default_factory=dict)


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted keys of nested objects; a list is one value (as vLLM hashes it)."""
    if not isinstance(node, Mapping):
        return {prefix: node}
    out: dict[str, Any] = {}
    for name, value in node.items():
        out.update(flatten(value, f"{prefix}.{name}" if prefix else str(name)))
    return out


def _canon(value: Any) -> Any:
    """Return a value as JSON holds it (tuples are lists): recorded and computed ones compare."""
    return json.loads(json.dumps(value, sort_keys=True))


def _check(group: str, diffs: list[Difference]) -> FactorCheck:
    if not diffs:
        return FactorCheck(group, "match")
    return FactorCheck(group, "differs", tuple(diffs[:MAX_NAMED]), total=len(diffs))


def _dict_diff(group: str, recorded: Any, pod: Any) -> list[Difference]:
    mine, theirs = flatten(_canon(recorded)), flatten(_canon(pod))
    return [
        Difference(f"{group}.{k}", mine.get(k), theirs.get(k), classify_factor(k, theirs.get(k)))
        for k in sorted(set(mine) | set(theirs))
        if mine.get(k) != theirs.get(k)
    ]


def _leaf_diff(
    group: str, recorded: Any, leaves: Mapping[str, Any]
) -> tuple[list[Difference], int]:
    """Compare ``leaves`` with the recorded leaves ending with each name; count the compared."""
    flat = flatten(_canon(recorded))
    diffs: list[Difference] = []
    compared = 0
    for name, value in sorted(leaves.items()):
        want = _canon(value)
        for key in sorted(k for k in flat if k == name or k.endswith("." + name)):
            compared += 1
            if flat[key] != want:
                category = classify_factor(key, want)
                diffs.append(Difference(f"{group}.{key}", flat[key], want, category))
    return diffs, compared


def _whole_or_leaves(
    group: str,
    recorded: Any,
    whole: Mapping[str, Any] | None,
    leaves: Mapping[str, Any],
    why: str,
) -> FactorCheck:
    diffs, compared = _leaf_diff(group, recorded, leaves)
    if whole is not None:
        # The pod's own arguments win over a whole group computed for another command line.
        named = {d.key for d in diffs}
        return _check(
            group, diffs + [d for d in _dict_diff(group, recorded, whole) if d.key not in named]
        )
    if diffs:
        return _check(group, diffs)
    total = len(flatten(recorded))
    return FactorCheck(
        group,
        "unknown",
        reason=f"{compared} of {total} {group} factors compared, all equal; the rest: {why}",
    )


def _hash_only(group: str, recorded: str, pod: str | None, why: str) -> FactorCheck:
    if pod is None:
        return FactorCheck(group, "unknown", reason=f"vLLM 0.33 records only {group}_hash; {why}")
    if pod == recorded:
        return FactorCheck(group, "match")
    return _check(group, [Difference(f"{group}_hash", recorded, pod)])


def _code_main(code: Any, pod: PodFactors) -> FactorCheck:
    if pod.read_file is None:
        return FactorCheck("code", "unknown", reason=pod.why.get("code", "no file reader"))
    if not isinstance(code, list):
        return FactorCheck("code", "unknown", reason="the recorded code factors are not a list")
    diffs: list[Difference] = []
    for entry in code:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("path"), str):
            return FactorCheck("code", "unknown", reason="a recorded code entry has no path")
        path, want = entry["path"], entry.get("hash")
        if path == NO_FILE:
            continue
        text = pod.read_file(path)
        if text is None:
            moved = _relocated(path, want, pod, pod.read_file)
            if moved is not None:
                diffs.append(Difference(f"code[{path}].path", path, moved, "moved"))
            else:
                diffs.append(Difference(f"code[{path}]", "present", "missing", "missing"))
        elif want is None:
            # vLLM recorded no hash (it could not read the file); here it can: another key.
            diffs.append(Difference(f"code[{path}].hash", None, content_hash(text), "readable"))
        elif content_hash(text) != want:
            diffs.append(Difference(f"code[{path}].hash", want, content_hash(text), "changed"))
    return _check("code", diffs)


def _relocated(path: str, want: Any, pod: PodFactors, read: FileReader) -> str | None:
    """Return where a file missing at ``path`` lives in this image, by the pod's relocations."""
    pairs = list(pod.relocations)
    cut = path.find(_SITE)
    if cut >= 0:
        pairs += [(path[: cut + len(_SITE) - 1], site) for site in pod.site_packages]
    for old, new in pairs:
        prefix = old.rstrip("/") + "/"
        if path.startswith(prefix):
            candidate = new.rstrip("/") + "/" + path[len(prefix) :]
            text = read(candidate)
            if text is not None and (want is None or content_hash(text) == want):
                return candidate
    return None


def compare(doc: Mapping[str, Any], recipe: str, pod: PodFactors) -> list[FactorCheck]:
    """Check each factor group of the recorded ``doc`` (written by ``recipe``) against ``pod``."""
    checks: list[FactorCheck] = []
    if pod.env is None:
        checks.append(FactorCheck("env", "unknown", reason=pod.why.get("env", "not computed")))
    else:
        checks.append(_check("env", _dict_diff("env", doc.get("env", {}), pod.env)))
    if recipe == RECIPE_MAIN:
        checks.append(
            _whole_or_leaves(
                "config",
                doc["config"],
                pod.config,
                pod.config_leaves,
                pod.why.get("config", "not rebuilt without the engine"),
            )
        )
        checks.append(_code_main(doc["code"], pod))
        checks.append(
            _whole_or_leaves(
                "compiler",
                doc["compiler"],
                pod.compiler,
                pod.compiler_leaves,
                pod.why.get("compiler", "not rebuilt without the engine"),
            )
        )
    else:
        checks.append(
            _hash_only("config", doc["config_hash"], pod.config_hash, pod.why.get("config", ""))
        )
        checks.append(
            FactorCheck(
                "code",
                "unknown",
                reason="vLLM 0.33 records only code_hash, no traced-file list",
            )
        )
        checks.append(
            _hash_only(
                "compiler", doc["compiler_hash"], pod.compiler_hash, pod.why.get("compiler", "")
            )
        )
    return checks


def verdict(checks: Sequence[FactorCheck]) -> FactorStatus:
    """``differs`` when any group differs, else ``unknown`` when any is unknown, else ``match``."""
    if any(c.status == "differs" for c in checks):
        return "differs"
    if any(c.status == "unknown" for c in checks):
        return "unknown"
    return "match"
