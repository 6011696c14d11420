"""vLLM's compile cache (``VLLM_CACHE_ROOT``) and the DeepGEMM dir vLLM puts there.

Facts, read from vllm-project/vllm main of mid-2026 (``vllm/envs.py``,
``vllm/compilation/backends.py``, ``compilation/compiler_interface.py``,
``compilation/decorators.py``, ``vllm/utils/deep_gemm.py``), matching the vLLM
section of ``CACHE-LAYOUTS.md`` except where noted:

* Root: ``VLLM_CACHE_ROOT``, default ``$XDG_CACHE_HOME/vllm`` or
  ``~/.cache/vllm``, passed through ``os.path.expanduser``.
* ``torch_compile_cache/<sha256(factors)[:10]>/rank_<r>_<dp>/<prefix>/`` holds
  ``cache_key_factors.json`` (written once: ``env``, ``config``,
  ``config_hash``, ``compiler``, ``compiler_hash``, ``code``, ``code_hash``),
  ``vllm_compile_cache.py``, ``computation_graph.py`` and the compiled
  artifacts (``artifact_compile_range_<a>_<b>_subgraph_<i>``); older Inductor
  adaptors put ``inductor_cache/`` and ``triton_cache/`` under the rank dir.
  The AOT path is ``torch_compile_cache/torch_aot_compile/<sha256>/`` with
  ``inductor_cache/`` (Triton kernels under ``inductor_cache/triton/<dev>/``)
  and ``rank_<r>_<dp>/model``.
* Absolute paths: ``vllm_compile_cache.py`` (a pprint'ed dict, read back with
  ``ast.literal_eval``) stores each artifact's handle as ``(key, <absolute
  path under the rank dir>)`` and loads from that path; Triton group files
  hold absolute child paths. Both are rewritten on restore.
* Hash factors: every registered ``VLLM_*`` env var at its parsed value
  (ports, IPs, the cache root, ``CUDA_VISIBLE_DEVICES``... ignored), the whole
  config hash (the ``model`` string: an HF id and a local path differ), the
  path AND content of every traced source file (a different site-packages gives
  a new dir) and Inductor's system factors (GPU name, torch CUDA version).
  Values vLLM does not ignore can still be volatile (a Ray bundle index, a
  side-channel port, a ``/tmp`` model path): :func:`volatile_factors` flags them.
* DeepGEMM: before importing it vLLM sets ``DG_JIT_CACHE_DIR`` to
  ``$VLLM_CACHE_ROOT/deep_gemm`` when it is unset or empty. That dir sits next
  to ``torch_compile_cache/``, not under it.

Choice for DeepGEMM: the ``deep_gemm`` component is harvested only when
``DG_JIT_CACHE_DIR`` is unset or empty at harvest (vLLM's own default applies);
when it is set, the ``deepgemm`` family owns that dir, wherever it points, so
nothing ships twice. It is restored at ``<target>/vllm/deep_gemm`` with no
variable set, so vLLM's own default finds it, and a ``DG_JIT_CACHE_DIR`` set by
the ``deepgemm`` family still wins, as it would in vLLM. This nests the
component inside ``cache``: installation goes in component-name order
(``cache`` before ``deep_gemm``), and ``cache`` never ships ``deep_gemm/``.

Other top-level dirs (``modelinfos/`` and the like) are not harvested.
"""

from __future__ import annotations

import ast
import ipaddress
import json
import os
import pprint
import re
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from artifactd.constants import DG_JIT_CACHE_DIR, VLLM_CACHE_ROOT, XDG_CACHE_HOME
from artifactd.families.base import (
    ROOT_PLACEHOLDER,
    Component,
    Family,
    Located,
    home,
    rewrite_group_json,
)
from artifactd.families.deepgemm import DeepGEMMFamily
from artifactd.families.triton import is_group_file

COMPILE_DIR = "torch_compile_cache"
AOT_DIR = "torch_aot_compile"
DEEP_GEMM_DIR = "deep_gemm"
FACTORS_FILE = "cache_key_factors.json"
HANDLES_FILE = "vllm_compile_cache.py"
#: Top-level entries of VLLM_CACHE_ROOT the ``cache`` component ships.
HARVESTED = frozenset({COMPILE_DIR})

_DEEP_GEMM = DeepGEMMFamily()


def expanduser(value: str, environ: Mapping[str, str]) -> Path:
    """``os.path.expanduser`` with the HOME of ``environ``."""
    if value == "~" or value.startswith("~/"):
        return home(environ) / value[2:]
    return Path(os.path.expanduser(value))


def cache_root(environ: Mapping[str, str]) -> Path:
    """Return ``VLLM_CACHE_ROOT`` as vLLM resolves it for a process with ``environ``."""
    configured = environ.get(VLLM_CACHE_ROOT)
    if configured:
        return expanduser(configured, environ)
    xdg = environ.get(XDG_CACHE_HOME)
    base = expanduser(xdg, environ) if xdg else home(environ) / ".cache"
    return base / "vllm"


# --------------------------------------------------------------------------
# Path-bearing files: Triton group JSON and vLLM's handle file
# --------------------------------------------------------------------------


def _is_group_json(data: bytes) -> bool:
    try:
        doc = json.loads(data)
    except ValueError:
        return False
    return isinstance(doc, dict) and "child_paths" in doc


def _swap_str(value: str, old: tuple[str, ...], new: str) -> str:
    for prefix in old:
        p = prefix.rstrip("/")
        if value == p or value.startswith(p + "/"):
            return new.rstrip("/") + value[len(p) :]
    return value


def _swap_prefix(value: Any, old: tuple[str, ...], new: str) -> Any:
    """Rewrite every string in a literal that is, or starts with, one of ``old`` roots."""
    if isinstance(value, str):
        return _swap_str(value, old, new)
    if isinstance(value, tuple):
        return tuple(_swap_prefix(v, old, new) for v in value)
    if isinstance(value, list):
        return [_swap_prefix(v, old, new) for v in value]
    if isinstance(value, dict):
        return {_swap_prefix(k, old, new): _swap_prefix(v, old, new) for k, v in value.items()}
    return value


def rewrite_handles(data: bytes, old: tuple[str, ...], new: str) -> bytes | None:
    """Rewrite artifact paths in ``vllm_compile_cache.py``; None when it is not a literal.

    Parsed as vLLM parses it (``ast.literal_eval``) and written back the way
    vLLM writes it (``pprint`` with ``indent=4``), so a path pprint wrapped
    across string literals (it splits at blanks) is still found.
    """
    try:
        doc = ast.literal_eval(data.decode("utf-8"))
    except (ValueError, SyntaxError, UnicodeDecodeError, MemoryError, RecursionError):
        return None
    return pprint.PrettyPrinter(indent=4).pformat(_swap_prefix(doc, old, new)).encode("utf-8")


# --------------------------------------------------------------------------
# Hash factors: read them, and flag the volatile ones
# --------------------------------------------------------------------------


def read_factors(root: Path) -> dict[str, dict[str, Any]]:
    """Return ``{hash dir name: factors}`` for every hash dir under ``root/torch_compile_cache``.

    ``root`` is a ``VLLM_CACHE_ROOT``. vLLM writes the same factors (they make
    the dir name) into ``rank_<r>_<dp>/<prefix>/cache_key_factors.json`` for
    each rank and prefix; the first readable one in sorted order is returned.
    Hash dirs without one (older vLLM), unreadable or non-object files, and the
    ``torch_aot_compile`` dir are left out.
    """
    found: dict[str, dict[str, Any]] = {}
    try:
        hash_dirs = sorted(
            p for p in (root / COMPILE_DIR).iterdir() if p.is_dir() and p.name != AOT_DIR
        )
    except OSError:
        return found
    for hash_dir in hash_dirs:
        for meta in sorted(hash_dir.rglob(FACTORS_FILE)):
            try:
                doc = json.loads(meta.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if isinstance(doc, dict):
                found[hash_dir.name] = doc
                break
    return found


_PORT_KEY = re.compile(r"(?:^|[^A-Za-z])PORTS?(?:$|[^A-Za-z])", re.IGNORECASE)
_RAY_KEY = re.compile(r"BUNDLE|PLACEMENT_?GROUP", re.IGNORECASE)
_IPV4 = re.compile(r"(?<![\d.])(\d{1,3}(?:\.\d{1,3}){3})(?![\d.])")
_IPV6 = re.compile(r"(?<![\w:.])([0-9A-Fa-f:]*:[0-9A-Fa-f:]*:[0-9A-Fa-f:.]*)(?![\w:])")
_TMP_PATH = re.compile(r"(?<![\w.~-])/tmp(?=/|$|[\s,;:'\")\]])")

WHY_PORT = "a port number: assigned per run or per pod when picked dynamically"
WHY_RAY = "a Ray bundle index or placement group: assigned per Ray job"
WHY_IPV4 = "an IPv4 address: a pod or host IP changes on every reschedule"
WHY_IPV6 = "an IPv6 address: a pod or host IP changes on every reschedule"
WHY_TMP = "an absolute path under /tmp: often a per-run temp dir"


def _leaves(value: Any, key: str = "", leaf: str = "") -> Iterator[tuple[str, str, Any]]:
    """Yield (dotted key, innermost dict key, value) for every scalar in ``value``."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield from _leaves(v, f"{key}.{k}" if key else str(k), str(k))
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            yield from _leaves(v, f"{key}[{i}]", leaf)
    else:
        yield key, leaf, value


def _is_port(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return 0 < value <= 65535
    return isinstance(value, str) and value.isdigit() and 0 < int(value) <= 65535


def _is_set(value: Any) -> bool:
    """Whether a factor holds a value (0 counts: it is a bundle index)."""
    return value is not None and value is not False and value != ""


def _addresses(text: str) -> list[str]:
    """Return why ``text`` looks volatile for the IP addresses it names (loopback is stable)."""
    reasons: list[str] = []
    for m in _IPV4.finditer(text):
        try:
            addr4 = ipaddress.IPv4Address(m.group(1))
        except ValueError:
            continue
        if not (addr4.is_loopback or addr4.is_unspecified):
            reasons.append(WHY_IPV4)
            break
    for m in _IPV6.finditer(text):
        try:
            addr6 = ipaddress.IPv6Address(m.group(1).split("%", 1)[0])
        except ValueError:
            continue
        if not (addr6.is_loopback or addr6.is_unspecified):
            reasons.append(WHY_IPV6)
            break
    return reasons


def volatile_factors(factors: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """Return ``(dotted key, value, why)`` for factor values that look run- or pod-specific.

    Flags IPv4/IPv6 addresses (not loopback), ports (a key naming ``PORT``
    with a numeric value), Ray bundle indices and placement groups (keys
    naming ``BUNDLE``/``PLACEMENT_GROUP`` with a value set), and absolute paths
    under ``/tmp``. Any one of them in vLLM's factors gives a new cache dir
    whenever it changes. Keys are dotted (``env.VLLM_PORT``, ``code[3]``).
    """
    found: list[tuple[str, str, str]] = []
    for key, leaf, value in _leaves(factors):
        text = value if isinstance(value, str) else json.dumps(value)
        reasons: list[str] = []
        if _PORT_KEY.search(leaf) and _is_port(value):
            reasons.append(WHY_PORT)
        if _RAY_KEY.search(leaf) and _is_set(value):
            reasons.append(WHY_RAY)
        if isinstance(value, str) and "VERSION" not in leaf.upper():
            # A four-part version ("9.1.0.70", cuDNN) is not an address.
            reasons.extend(_addresses(value))
            if _TMP_PATH.search(value):
                reasons.append(WHY_TMP)
        found.extend((key, text, why) for why in reasons)
    return found


class VLLMFamily(Family):
    """vLLM torch.compile graphs and artifacts (JIT and AOT), plus its DeepGEMM dir."""

    name = "vllm"
    description = "vLLM compile cache (VLLM_CACHE_ROOT: torch_compile_cache, deep_gemm)"
    scope = (
        "workload",
        "libraries.vllm",
        "libraries.torch",
        "libraries.triton",
        "libraries.deep_gemm",
        "gpu.name",
        "gpu.arch",
        "gpu.count",
        "gpu.sm_count",
        "cuda.torch_cuda",
        "cuda.nvcc",
        "paths.site_packages",
        "python",
        "platform",
    )
    components = (
        Component("cache", "vllm", {VLLM_CACHE_ROOT: "{dir}"}),
        Component("deep_gemm", f"vllm/{DEEP_GEMM_DIR}", {}),
    )

    def locate(self, environ: Mapping[str, str]) -> list[Located]:
        """Find the root, and its ``deep_gemm/`` when DG_JIT_CACHE_DIR is unset (vLLM's default)."""
        root = cache_root(environ)
        if not root.is_dir():
            return []
        found = [Located(self.components[0], root)]
        if not environ.get(DG_JIT_CACHE_DIR) and (root / DEEP_GEMM_DIR).is_dir():
            found.append(Located(self.components[1], root / DEEP_GEMM_DIR))
        return found

    def excluded(self, component: str, rel: PurePosixPath, is_dir: bool) -> bool:
        """Ship only ``torch_compile_cache/`` from the root; DeepGEMM's staging dir never."""
        if component == "cache" and len(rel.parts) == 1 and rel.name not in HARVESTED:
            return True
        if component == "deep_gemm":
            return _DEEP_GEMM.excluded("cache", rel, is_dir)
        return super().excluded(component, rel, is_dir)

    def invalid_entries(self, component: str, root: Path) -> dict[PurePosixPath, str]:
        """DeepGEMM entries without both ``kernel.cu`` and ``kernel.cubin`` (a hard error)."""
        if component == "deep_gemm":
            return _DEEP_GEMM.invalid_entries("cache", root)
        return {}

    def path_bearing(self, component: str, rel: PurePosixPath) -> bool:
        """Triton group files and ``vllm_compile_cache.py`` hold absolute paths."""
        return component == "cache" and (is_group_file(rel) or rel.name == HANDLES_FILE)

    def normalize(self, data: bytes, roots: tuple[str, ...]) -> bytes:
        """Store paths under the root relative to the placeholder."""
        if _is_group_json(data):
            return rewrite_group_json(data, roots, ROOT_PLACEHOLDER)
        rewritten = rewrite_handles(data, roots, ROOT_PLACEHOLDER)
        return super().normalize(data, roots) if rewritten is None else rewritten

    def relocate(self, data: bytes, root: str) -> bytes:
        """Point stored paths at the restored root."""
        if _is_group_json(data):
            return rewrite_group_json(data, (ROOT_PLACEHOLDER,), root)
        rewritten = rewrite_handles(data, (ROOT_PLACEHOLDER,), root)
        return super().relocate(data, root) if rewritten is None else rewritten

    def facts(self, component: str, root: Path) -> dict[str, Any]:
        """Return the raw hash factors per hash dir, for ``diff`` and the volatility lint."""
        if component != "cache":
            return {}
        factors = read_factors(root)
        return {"cache_key_factors": factors} if factors else {}
