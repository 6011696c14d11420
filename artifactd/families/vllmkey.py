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
* :data:`RECIPE_034` (the vllm 0.34.0 release): ``sha256(json.dumps({"env",
  "config", "code": {"files": [...]}, "compiler"}, sort_keys=True))``; the
  file records all four raw (``code`` as ``{"files": [{"path", "hash"}]}``,
  where ``hash`` is the sha256 of ``json.dumps({"content": text},
  sort_keys=True)`` and a path starting with ``<``, such as ``<string>``, has
  none) beside the three group hashes.

:func:`self_check` recomputes a dir name from its recorded factors: a file
that no known recipe reproduces says ``unknown recipe``, and nothing is
predicted from it (a guess would be worse than no answer). :func:`compare`
sets the recorded factors against what a pod gives (:class:`PodFactors`)
and returns one :class:`FactorCheck` per group: ``match``, ``differs`` (each
difference named, recorded -> pod) or ``unknown`` (with the reason).
vLLM 0.33 does not record which files its ``code_hash`` covered, so the
build recovers the list (:func:`traced_033`): the ``# File:`` lines of the
``computation_graph.py`` vLLM writes beside the factors name the traced
files, and the list is kept only when re-hashing those files by 0.33's own
recipe gives the recorded ``code_hash`` (else nothing is kept, with the
reason). The list (path and sha256 of each file's text, at most
:data:`MAX_TRACED_FILES`) travels in the artifact's config under
:data:`TRACED_KEY`, and :func:`compare` then names each traced file missing,
moved or changed for a 0.33 cache as it does for 0.34's.

Volatility is not judged here: :func:`artifactd.families.vllm.classify_factor`
is its one owner; the pod's side passes it in (:attr:`PodFactors.classify`),
so this module imports no family and the vLLM family may call it at harvest.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from artifactd.fsutil import InputFileError, read_regular

RECIPE_033 = "vllm-0.33"
RECIPE_034 = "vllm-0.34"
#: Every recipe :func:`self_check` knows, in the order tried.
RECIPES = (RECIPE_034, RECIPE_033)
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

#: The key under which an entry's recovered traced-file list rides beside its factors.
TRACED_KEY = "artifactd_traced_files"
#: The version of the traced-file list's document.
TRACED_SCHEMA_VERSION = 1
#: Most traced files recorded for one entry (a model traces tens; more is not a model).
MAX_TRACED_FILES = 4096
#: Longest traced path kept (longer: the list is not recorded).
MAX_TRACED_PATH = 4096
#: The largest traced source file read (vLLM's model files are well under this).
MAX_TRACED_FILE_BYTES = 16 << 20
#: The largest ``computation_graph.py`` read for the traced paths it names.
MAX_GRAPH_BYTES = 64 << 20
#: Most ``computation_graph.py`` files read per hash dir (one per rank and prefix).
MAX_GRAPHS = 256
#: The FX graph dump vLLM writes beside the factors (its ``# File:`` lines name traced files).
GRAPH_FILE = "computation_graph.py"
_FILE_LINE = re.compile(r"^\s*# File: (/[^\n]*?):\d+ in ", re.MULTILINE)


def hash_factors(items: Any) -> str:
    """Return vLLM's ``hash_factors``: sha256 hex of ``json.dumps(items, sort_keys=True)``."""
    return hashlib.sha256(json.dumps(items, sort_keys=True).encode()).hexdigest()


def content_hash(text: str) -> str:
    """Return the per-file ``hash`` of :data:`RECIPE_034`'s code factors."""
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


def read_source(path: str) -> str | None:
    """Return a traced file's text as vLLM reads it; None: missing, not regular, too big."""
    try:
        return read_regular(path, MAX_TRACED_FILE_BYTES, follow=True).decode("utf-8")
    except (InputFileError, OSError, UnicodeDecodeError):
        return None


def text_sha256(text: str) -> str:
    """Return the sha256 of a traced file's text, as the recovered list records it."""
    return hashlib.sha256(text.encode()).hexdigest()


def graph_paths(text: str) -> list[str]:
    """Return the absolute paths a ``computation_graph.py`` names in its ``# File:`` lines."""
    return sorted({m.group(1) for m in _FILE_LINE.finditer(text)})


def traced_033(
    doc: Mapping[str, Any], candidates: Sequence[str], read: FileReader = read_source
) -> dict[str, Any]:
    """Recover the traced-file list of a 0.33 record, or say why it cannot be.

    ``candidates`` are the paths the compiled graph names (top-level forward
    file first or not: order does not matter). The list is kept only when
    0.33's recipe over exactly those files, read now, gives the recorded
    ``code_hash``: a list that does not is incomplete, and is never recorded.
    """
    out: dict[str, Any] = {"schema_version": TRACED_SCHEMA_VERSION}
    paths = sorted(set(candidates))
    if not paths:
        return {**out, "reason": f"no {GRAPH_FILE} names a traced file"}
    if len(paths) > MAX_TRACED_FILES or any(len(p) > MAX_TRACED_PATH for p in paths):
        return {**out, "reason": f"more than {MAX_TRACED_FILES} traced files or a path too long"}
    texts = [(p, read(p)) for p in paths]
    if code_hash_033(texts) != doc.get("code_hash"):
        return {
            **out,
            "reason": f"the {len(paths)} files {GRAPH_FILE} names do not give vLLM's code_hash"
            " (it traced more files than the graph shows)",
        }
    files = [{"path": p, "sha256": text_sha256(t) if t is not None else None} for p, t in texts]
    return {**out, "files": files}


def traced_lists(
    hash_dirs: Mapping[str, Path], factors: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """For each vLLM 0.33 entry (which records no traced files), the list the build recovers.

    ``hash_dirs``: each entry's ``torch_compile_cache/<name>`` dir. The
    ``computation_graph.py`` files under it (at most :data:`MAX_GRAPHS`) name
    the candidates; :func:`traced_033` keeps them only when they reproduce the
    recorded ``code_hash``. Called at harvest, where the traced files still sit
    at the paths vLLM hashed.
    """
    out: dict[str, Any] = {}
    for name, doc in factors.items():
        if recipe_of(doc) != RECIPE_033 or name not in hash_dirs:
            continue
        paths: set[str] = set()
        for graph in sorted(hash_dirs[name].rglob(GRAPH_FILE))[:MAX_GRAPHS]:
            try:
                text = read_regular(graph, MAX_GRAPH_BYTES).decode("utf-8", "replace")
            except OSError:
                continue
            paths.update(graph_paths(text))
        out[name] = traced_033(doc, sorted(paths))
    return out


def recipe_of(doc: Mapping[str, Any]) -> str | None:
    """Which recipe's record ``doc`` looks like (by its keys); None when neither."""
    code = doc.get("code")
    if all(k in doc for k in GROUPS):  # all four raw: 0.34's shape, or an unknown one
        files = code.get("files") if isinstance(code, Mapping) else None
        return RECIPE_034 if isinstance(files, list) else None
    if "env" in doc and all(
        isinstance(doc.get(k), str) for k in ("config_hash", "code_hash", "compiler_hash")
    ):
        return RECIPE_033
    return None


def dir_key(doc: Mapping[str, Any], recipe: str) -> str:
    """Return the cache dir name ``recipe`` gives for the recorded factors ``doc``."""
    if recipe == RECIPE_034:
        everything = {
            "env": doc["env"],
            "config": doc["config"],
            "code": doc["code"],
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
#: Names the kind of a volatile factor (``port``, ``model``...) from its dotted key and value.
Classifier = Callable[[str, Any], "str | None"]


def no_category(key: str, value: Any) -> str | None:
    """Name no category (the classifier of a comparison that judges no volatility)."""
    del key, value
    return None


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
    ``why``: the reason a group is None, by group; ``classify``: the one
    volatility classifier (:func:`~artifactd.families.vllm.classify_factor`),
    which names each difference's category.
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
    classify: Classifier = no_category


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


def _dict_diff(
    group: str, recorded: Any, pod: Any, classify: Classifier = no_category
) -> list[Difference]:
    mine, theirs = flatten(_canon(recorded)), flatten(_canon(pod))
    return [
        Difference(f"{group}.{k}", mine.get(k), theirs.get(k), classify(k, theirs.get(k)))
        for k in sorted(set(mine) | set(theirs))
        if mine.get(k) != theirs.get(k)
    ]


def _leaf_diff(
    group: str, recorded: Any, leaves: Mapping[str, Any], classify: Classifier = no_category
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
                category = classify(key, want)
                diffs.append(Difference(f"{group}.{key}", flat[key], want, category))
    return diffs, compared


def _whole_or_leaves(
    group: str,
    recorded: Any,
    whole: Mapping[str, Any] | None,
    leaves: Mapping[str, Any],
    why: str,
    *,
    classify: Classifier = no_category,
) -> FactorCheck:
    diffs, compared = _leaf_diff(group, recorded, leaves, classify)
    if whole is not None:
        # The pod's own arguments win over a whole group computed for another command line.
        named = {d.key for d in diffs}
        wholly = _dict_diff(group, recorded, whole, classify)
        return _check(group, diffs + [d for d in wholly if d.key not in named])
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


def _code_034(code: Any, pod: PodFactors) -> FactorCheck:
    if pod.read_file is None:
        return FactorCheck("code", "unknown", reason=pod.why.get("code", "no file reader"))
    if not isinstance(code, list):
        return FactorCheck("code", "unknown", reason="the recorded code files are not a list")
    if len(code) > MAX_TRACED_FILES:
        return FactorCheck("code", "unknown", reason=f"over {MAX_TRACED_FILES} traced files")
    diffs: list[Difference] = []
    for entry in code:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("path"), str):
            return FactorCheck("code", "unknown", reason="a recorded code entry has no path")
        path, want = entry["path"], entry.get("hash")
        if path.startswith("<"):
            continue  # generated code (<string>, <frozen ...>): vLLM hashes its path only
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


def _relocated(
    path: str,
    want: Any,
    pod: PodFactors,
    read: FileReader,
    hasher: Callable[[str], str] = content_hash,
) -> str | None:
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
            if text is not None and (want is None or hasher(text) == want):
                return candidate
    return None


def _traced_files(doc: Mapping[str, Any]) -> tuple[list[tuple[str, str | None]] | None, str]:
    """Return the traced-file list riding with a 0.33 record, checked; or None and why not."""
    rec = doc.get(TRACED_KEY)
    if not isinstance(rec, Mapping):
        return None, "vLLM 0.33 records only code_hash, and the build recovered no traced-file list"
    files = rec.get("files")
    if rec.get("schema_version") != TRACED_SCHEMA_VERSION or not isinstance(files, list):
        why = rec.get("reason")
        text = why[:MAX_VALUE_CHARS] if isinstance(why, str) else "an unknown list format"
        return None, f"vLLM 0.33 records only code_hash; the build kept no traced-file list: {text}"
    if len(files) > MAX_TRACED_FILES:
        return None, f"the recorded traced-file list is over {MAX_TRACED_FILES} files"
    out: list[tuple[str, str | None]] = []
    for f in files:
        path = f.get("path") if isinstance(f, Mapping) else None
        digest = f.get("sha256") if isinstance(f, Mapping) else None
        if not isinstance(path, str) or len(path) > MAX_TRACED_PATH:
            return None, "a recorded traced file has no usable path"
        out.append((path, digest if isinstance(digest, str) else None))
    return out, ""


def _code_033(doc: Mapping[str, Any], pod: PodFactors) -> FactorCheck:
    """0.33's code group from the build's recovered list: each file named, then the hash itself."""
    files, why = _traced_files(doc)
    if files is None:
        return FactorCheck("code", "unknown", reason=why)
    if pod.read_file is None:
        return FactorCheck("code", "unknown", reason=pod.why.get("code", "no file reader"))
    diffs: list[Difference] = []
    texts: list[tuple[str, str | None]] = []
    for path, want in files:
        text = pod.read_file(path)
        texts.append((path, text))
        if text is None and want is None:
            continue  # unreadable at build (0.33 hashed its path only) and here: the same
        if text is None:
            moved = _relocated(path, want, pod, pod.read_file, text_sha256)
            if moved is not None:
                diffs.append(Difference(f"code[{path}].path", path, moved, "moved"))
            else:
                diffs.append(Difference(f"code[{path}]", "present", "missing", "missing"))
        elif want is None:
            diffs.append(Difference(f"code[{path}].sha256", None, text_sha256(text), "readable"))
        elif text_sha256(text) != want:
            diffs.append(Difference(f"code[{path}].sha256", want, text_sha256(text), "changed"))
    if diffs:
        return _check("code", diffs)
    # Every file as recorded: 0.33's own recipe over them must give the recorded hash.
    ours = code_hash_033(texts)
    if ours != doc.get("code_hash"):
        return _check("code", [Difference("code_hash", doc.get("code_hash"), ours)])
    return FactorCheck("code", "match")


def compare(doc: Mapping[str, Any], recipe: str, pod: PodFactors) -> list[FactorCheck]:
    """Check each factor group of the recorded ``doc`` (written by ``recipe``) against ``pod``."""
    checks: list[FactorCheck] = []
    if pod.env is None:
        checks.append(FactorCheck("env", "unknown", reason=pod.why.get("env", "not computed")))
    else:
        checks.append(_check("env", _dict_diff("env", doc.get("env", {}), pod.env, pod.classify)))
    if recipe == RECIPE_034:
        checks.append(
            _whole_or_leaves(
                "config",
                doc["config"],
                pod.config,
                pod.config_leaves,
                pod.why.get("config", "not rebuilt without the engine"),
                classify=pod.classify,
            )
        )
        checks.append(_code_034(doc["code"].get("files"), pod))
        checks.append(
            _whole_or_leaves(
                "compiler",
                doc["compiler"],
                pod.compiler,
                pod.compiler_leaves,
                pod.why.get("compiler", "not rebuilt without the engine"),
                classify=pod.classify,
            )
        )
    else:
        checks.append(
            _hash_only("config", doc["config_hash"], pod.config_hash, pod.why.get("config", ""))
        )
        checks.append(_code_033(doc, pod))
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
