"""vLLM's caches under ``VLLM_CACHE_ROOT``: compile cache, DeepGEMM dir, FlashInfer autotune tables.

Facts, read from source, never run here (no GPU): the **vllm 0.33.0** release
(``vllm/envs.py``, ``vllm/compilation/backends.py``,
``vllm/compilation/decorators.py``, ``vllm/compilation/compiler_interface.py``,
``vllm/utils/deep_gemm.py``,
``vllm/model_executor/warmup/flashinfer_autotune_cache.py``,
``vllm/model_executor/warmup/kernel_warmup.py``,
``vllm/v1/worker/startup_plan.py``, ``vllm/model_executor/models/registry.py``,
``vllm/distributed/device_communicators/all_reduce_utils.py``) and
flashinfer-python 0.7.2 (``flashinfer/jit/env.py``,
``flashinfer/autotuner/autotuner.py``, ``flashinfer/autotune_cache.py``) for the
FlashInfer side; the compile-cache key's recipes (0.33.0's and the vllm
0.34.0 release's) live in :mod:`artifactd.families.vllmkey`.
``tests/test_drift_guards.py`` holds each fact below to the released source;
``docs/families.md`` sums them up.

* Root: ``VLLM_CACHE_ROOT``, default ``$XDG_CACHE_HOME/vllm`` or
  ``~/.cache/vllm``, passed through ``os.path.expanduser``.
* ``torch_compile_cache/<sha256(factors)[:10]>/rank_<r>_<dp>/<prefix>/`` holds
  ``cache_key_factors.json`` (written once: ``env``, ``config``,
  ``config_hash``, ``compiler``, ``compiler_hash``, ``code``, ``code_hash``),
  ``vllm_compile_cache.py``, ``computation_graph.py`` and the compiled
  artifacts (``artifact_compile_range_<a>_<b>_subgraph_<i>``); the Inductor
  adaptor (``compiler_interface.initialize_inductor_cache``) puts
  ``inductor_cache/`` and, unless ``TRITON_CACHE_DIR`` is set, ``triton_cache/``
  under the rank dir.
  The AOT path is ``torch_compile_cache/torch_aot_compile/<sha256>/`` with
  ``inductor_cache/`` (Triton kernels under ``inductor_cache/triton/<dev>/``)
  and ``rank_<r>_<dp>/model``.
* Absolute paths: ``vllm_compile_cache.py`` (a pprint'ed dict, read back with
  ``ast.literal_eval``) stores each artifact's handle as ``(key, <absolute
  path under the rank dir>)`` and loads from that path; Triton group files
  hold absolute child paths. Both are rewritten on restore.
* Hash factors: every registered ``VLLM_*`` env var at its parsed value
  (``envs.compile_factors``: ports, IPs, the cache root, the FlashInfer
  autotune dir, ``VLLM_ENABLE_STARTUP_PLAN``... ignored), the whole config
  hash (the ``model`` string: an HF id and a local path differ), the path AND
  content of every traced source file (a different site-packages gives a new
  dir) and Inductor's system factors (GPU name, torch CUDA version). Values
  vLLM does not ignore can still be volatile (a Ray bundle index, a
  side-channel port, a ``/tmp`` model path): :func:`volatile_factors` flags
  them. It is the one classifier of volatile factors; the lint reports what it
  returns.
* DeepGEMM: before importing it vLLM sets ``DG_JIT_CACHE_DIR`` to
  ``$VLLM_CACHE_ROOT/deep_gemm`` when it is unset or empty. That dir sits next
  to ``torch_compile_cache/``, not under it.
* FlashInfer autotune tables (vllm-project/vllm#42537):
  ``flashinfer_autotune_cache/<flashinfer version>/<archs>/<sha256(config
  hash)>/autotune_configs_dp<d>_rank<r>.json`` (``<version>/<archs>`` are the
  last two parts of FlashInfer's ``FLASHINFER_WORKSPACE_DIR``, e.g.
  ``0.7.2/90``), written through ``.<name>.<random>.tmp`` and ``os.replace``
  and read back at the next start (a hit skips the tuning runs; a retune
  rewrites the file). ``VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR`` replaces the
  whole ``flashinfer_autotune_cache/<version>/<archs>`` prefix. Single-rank,
  single-stage, single-node runs with a FlashInfer that has the managed
  (v2) store tune into FlashInfer's own ``.cache/flashinfer/autotune/v2/``
  instead, unless that variable is set: that tree is the ``flashinfer``
  family's. A table carries FlashInfer's ``_metadata`` (FlashInfer, torch
  CUDA, cuBLAS, cuDNN, CuTe DSL versions, GPU name); one that conflicts with
  the pod's is never loaded AND never overwritten (it re-tunes at every
  start), hence the scope: ``libraries.flashinfer-python``,
  ``libraries.nvidia-cutlass-dsl``, ``cuda.torch_cuda``, ``gpu.name``. cuBLAS
  and cuDNN are not fingerprinted (torch pins them).
* ``startup_plan/startup_plan_<fingerprint>.json`` (``VLLM_ENABLE_STARTUP_PLAN=1``):
  the memory-profiling result, keyed by vLLM, the config hash, the device
  name, total memory and capability, torch and CUDA, rank and world size, and
  applied only when the device has at least the recorded free memory: a pod
  reuses it safely, so it ships.
* Left out: ``modelinfos/`` (model-class inspection, cheap), ``assets/``
  (downloads), ``xla_cache/`` (TPU), ``rocm_segmented_attention/`` (ROCm),
  ``dummy_cache/``, and ``gpu_p2p_access_cache_for_<devices>.json``: the
  build node's P2P topology, wrong on a pod on other hardware.

Choice for DeepGEMM and the autotune tables: each is harvested only when its
variable (``DG_JIT_CACHE_DIR``, ``VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR``) is
unset or empty at harvest (vLLM's own default applies); a set
``DG_JIT_CACHE_DIR`` belongs to the ``deepgemm`` family, wherever it points, so
nothing ships twice, and a set autotune dir has another layout (no
``<version>/<archs>``) and is not harvested (the warm-up runner clears the
variable). Each is restored at its default place under ``<target>/vllm`` with
no variable set, so vLLM's own default finds it. This nests the components
inside ``cache``: installation goes in component-name order (``cache`` first),
and ``cache`` never ships ``deep_gemm/`` or ``flashinfer_autotune_cache/``.
"""

from __future__ import annotations

from _collections_abc import Mapping  # collections.abc's own: importing it loads collections

from artifactd import jsontext
from artifactd.constants import (
    DG_JIT_CACHE_DIR,
    VLLM_CACHE_ROOT,
    VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR,
    XDG_CACHE_HOME,
)
from artifactd.families.base import (
    ROOT_PLACEHOLDER,
    Component,
    Family,
    Located,
    expanduser,
    home,
)
from artifactd.families.layouts import (
    DEEP_GEMM_DIR as _DEEP_GEMM_DIR,
)
from artifactd.families.layouts import (
    DEEPGEMM_COMMIT_FILE,
    DEEPGEMM_META_COST,
    deepgemm_excluded,
    deepgemm_meta,
    deepgemm_partial_entries,
)
from artifactd.fsutil import read_regular
from artifactd.records import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    import ipaddress
    from collections.abc import Callable, Iterator
    from pathlib import Path, PurePosixPath
    from typing import Any

    _Address = ipaddress.IPv4Address | ipaddress.IPv6Address

COMPILE_DIR = "torch_compile_cache"
AOT_DIR = "torch_aot_compile"
DEEP_GEMM_DIR = _DEEP_GEMM_DIR
FACTORS_FILE = "cache_key_factors.json"
HANDLES_FILE = "vllm_compile_cache.py"
STARTUP_PLAN_DIR = "startup_plan"
FLASHINFER_AUTOTUNE_DIR = "flashinfer_autotune_cache"
#: Top-level entries of VLLM_CACHE_ROOT the ``cache`` component ships.
HARVESTED = frozenset({COMPILE_DIR, STARTUP_PLAN_DIR})
#: Depth of a table under ``flashinfer_autotune_cache/``: version, archs, config hash, file.
_AUTOTUNE_TABLE_DEPTH = 4
_AUTOTUNE_TABLE = r"^autotune_configs(_dp\d+_rank\d+)?\.json$"


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
    # lazy: with pprint, only for a vLLM cache's handle file, never a restore
    # (tests/test_startup.py)
    import ast  # noqa: PLC0415
    import pprint  # noqa: PLC0415

    try:
        doc = ast.literal_eval(data.decode("utf-8"))
    except (ValueError, SyntaxError, UnicodeDecodeError, MemoryError, RecursionError):
        return None
    return pprint.PrettyPrinter(indent=4).pformat(_swap_prefix(doc, old, new)).encode("utf-8")


def _parse_handles(data: bytes) -> dict[Any, Any] | None:
    """Parse a handle file the way vLLM does (``ast.literal_eval``); None unless a dict."""
    # lazy: only a vLLM handle file needs it, never a restore (tests/test_startup.py)
    import ast  # noqa: PLC0415

    try:
        doc = ast.literal_eval(data.decode("utf-8"))
    except (ValueError, TypeError, SyntaxError, UnicodeDecodeError, MemoryError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


def merge_handles(ours: bytes, theirs: bytes) -> bytes | None:
    """Merge two ``vllm_compile_cache.py`` files entry by entry; None when they conflict.

    The union of both dicts' keys, written back the way vLLM writes the file
    (``pprint`` with ``indent=4``). A key both hold with different values, or a
    file that is not a dict literal, is a conflict. Never ``eval``: only
    ``ast.literal_eval`` reads the files.
    """
    # lazy: only a vLLM handle file needs it, never a restore (tests/test_startup.py)
    import pprint  # noqa: PLC0415

    mine, other = _parse_handles(ours), _parse_handles(theirs)
    if mine is None or other is None:
        return None
    merged = dict(mine)
    for key, value in other.items():
        if key in merged and merged[key] != value:
            return None
        merged[key] = value
    return pprint.PrettyPrinter(indent=4).pformat(merged).encode("utf-8")


# --------------------------------------------------------------------------
# Hash factors: read them, and flag the volatile ones
# --------------------------------------------------------------------------


#: The largest ``cache_key_factors.json`` read (vLLM's are a few KiB).
MAX_FACTORS_BYTES = 1 << 20


def read_factors(root: Path) -> dict[str, dict[str, Any]]:
    """Return ``{hash dir name: factors}`` for every hash dir under ``root/torch_compile_cache``.

    ``root`` is a ``VLLM_CACHE_ROOT``. vLLM writes the same factors (they make
    the dir name) into ``rank_<r>_<dp>/<prefix>/cache_key_factors.json`` for
    each rank and prefix; the first readable one in sorted order is returned.
    Hash dirs without one (older vLLM), unreadable or non-object files, and the
    ``torch_aot_compile`` dir are left out; so is a file that is not a regular
    file (a FIFO would block) or is larger than :data:`MAX_FACTORS_BYTES`.
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
                doc = jsontext.loads(read_regular(meta, MAX_FACTORS_BYTES).decode("utf-8"))
            except (OSError, ValueError, RecursionError):
                continue
            if isinstance(doc, dict):
                found[hash_dir.name] = doc
                break
    return found


WHY_PORT = "a port number: assigned per run or per pod when picked dynamically"
WHY_RAY = "a Ray bundle index or placement group: assigned per Ray job"
WHY_IPV4 = "an IPv4 address: a pod or host IP changes on every reschedule"
WHY_IPV6 = "an IPv6 address: a pod or host IP changes on every reschedule"
WHY_ADDRESS = "a host name under an address key: names this pod or a peer"
WHY_MODEL = "a local model path: pods may mount the model elsewhere"
WHY_TMP = "an absolute path under /tmp: often a per-run temp dir"


class FactorCategory(Record):
    """A kind of volatile hash factor: how sure the rule is, and what it costs on a pod.

    ``certain`` is False for values that are often, not always, per pod (a
    local model path, a ``/tmp`` path): the lint reports those as warnings.
    """

    name: str
    certain: bool
    cost: str


def _dir_cost(what: str) -> str:
    return f"vLLM hashes this value into its cache dir name: {what} gets a new dir and recompiles"


#: Every category :func:`classify_factor` returns, by name.
FACTOR_CATEGORIES: dict[str, FactorCategory] = {
    c.name: c
    for c in (
        FactorCategory(
            "ray",
            True,
            _dir_cost("every placement with another Ray bundle index or placement group"),
        ),
        FactorCategory("ip", True, _dir_cost("every pod with another IP")),
        FactorCategory("port", True, _dir_cost("every pod given another port")),
        FactorCategory("address", True, _dir_cost("every pod with another address")),
        FactorCategory(
            "model",
            False,
            "vLLM hashes the model string into its cache dir name: a pod that mounts the model"
            " at another path (or names it by its hub id) gets a new dir and recompiles",
        ),
        FactorCategory(
            "tmp",
            False,
            "vLLM hashes this value into its cache dir name: a per-run temp path gives every"
            " run a new dir and a recompile",
        ),
    )
}

#: The cost of a build-machine path inside the factors file.
FACTORS_PATH_COST = (
    "vLLM hashes this path into its cache dir name: a pod where it differs gets a new dir"
    " and recompiles"
)

# Patterns as text: the functions that match import ``re``, which compiles each on its first
# use and keeps it (compiling them all as the module loads cost about 1 ms of every restore).
_PORT_KEY = r"(?:^|[^A-Z])PORTS?(?:$|[^A-Z])"
_RAY_KEY = r"BUNDLE|PLACEMENT_?GROUP"
_ADDRESS_KEY = r"(^|_)(HOST_?IP|NODE_?IP|MASTER_?(ADDR|IP)|HOST_?ADDR(ESS)?)$"
_MODEL_KEYS = frozenset({"model", "tokenizer", "model_path", "served_model_path"})
_IPV4 = r"(?<![\d.])(\d{1,3}(?:\.\d{1,3}){3})(?![\d.])"
_IPV6 = r"(?<![\w:.])([0-9A-Fa-f:]*:[0-9A-Fa-f:]*:[0-9A-Fa-f:.]*)(?![\w:])"
# A "/tmp" component at the start of a path: "/data//tmp/x" is /data/tmp/x, not under /tmp.
_TMP_PATH = r"(?<![\w.~/-])/tmp(?=/|$|[\s,;:'\")\]])"
_SCHEME = r"^[a-zA-Z][a-zA-Z0-9+.-]*://"


def _strings(value: Any) -> list[str]:
    """Return the strings of a scalar factor or of a list of scalars (nested containers: none)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    return []


def _scalars(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else [value]


def _is_set(value: Any) -> bool:
    """Whether a factor holds a value: 0 counts (it is a bundle index), False does not."""
    if value is None or value is False:
        return False
    return not (isinstance(value, str | list | dict) and not value)


def _is_port(value: Any) -> bool:
    """Whether ``value`` is a port, 1 to 65535 (0 asks the OS for one: the same on every pod)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    return isinstance(value, int) and 0 < value <= 65535


def _address_why(text: str) -> str | None:
    """Why ``text`` names a pod's address (loopback and unspecified are the same everywhere)."""
    import ipaddress  # noqa: PLC0415  # lazy: only classifying hash factors needs it
    import re  # noqa: PLC0415  # lazy: as ipaddress

    for m in re.finditer(_IPV4, text):
        try:
            addr4 = ipaddress.IPv4Address(m.group(1))
        except ValueError:
            continue
        if not (addr4.is_loopback or addr4.is_unspecified):
            return WHY_IPV4
    for m in re.finditer(_IPV6, text):
        try:
            addr6 = ipaddress.IPv6Address(m.group(1).split("%", 1)[0])
        except ValueError:
            continue
        if not (addr6.is_loopback or addr6.is_unspecified):
            return WHY_IPV6
    return None


def _ip_literal(text: str) -> _Address | None:
    """Parse ``10.1.2.3``, ``10.1.2.3:8000``, ``[fd00::1]:80``, ``tcp://host:port/x``."""
    import ipaddress  # noqa: PLC0415  # lazy: only classifying hash factors needs it
    import re  # noqa: PLC0415  # lazy: as ipaddress

    s = re.sub(_SCHEME, "", text.strip()).split("/", 1)[0]
    if s.startswith("["):
        s = s[1:].split("]", 1)[0]
    elif s.count(":") == 1:
        s = s.split(":", 1)[0]
    try:
        return ipaddress.ip_address(s)
    except ValueError:
        return None


def _ip_why(_upper: str, _name: str, value: Any) -> str | None:
    return next((w for t in _strings(value) if (w := _address_why(t)) is not None), None)


def _ray_why(upper: str, _name: str, _value: Any) -> str | None:
    import re  # noqa: PLC0415  # lazy: only classifying hash factors needs it

    return WHY_RAY if re.search(_RAY_KEY, upper) else None


def _port_why(upper: str, _name: str, value: Any) -> str | None:
    import re  # noqa: PLC0415  # lazy: as in _ray_why

    hit = re.search(_PORT_KEY, upper) and any(_is_port(v) for v in _scalars(value))
    return WHY_PORT if hit else None


def _address_key_why(upper: str, _name: str, value: Any) -> str | None:
    import re  # noqa: PLC0415  # lazy: as in _ray_why

    hit = re.search(_ADDRESS_KEY, upper) and isinstance(value, str) and _ip_literal(value) is None
    return WHY_ADDRESS if hit else None


def _model_why(_upper: str, name: str, value: Any) -> str | None:
    hit = name in _MODEL_KEYS and isinstance(value, str) and value.startswith("/")
    return WHY_MODEL if hit else None


def _tmp_why(_upper: str, _name: str, value: Any) -> str | None:
    import re  # noqa: PLC0415  # lazy: as in _ray_why

    return WHY_TMP if any(re.search(_TMP_PATH, t) for t in _strings(value)) else None


#: ``(category, why(NAME_IN_UPPER_CASE, name, value))``, first match wins.
_RULES: tuple[tuple[str, Callable[[str, str, Any], str | None]], ...] = (
    ("ray", _ray_why),
    ("ip", _ip_why),
    ("port", _port_why),
    ("address", _address_key_why),
    ("model", _model_why),
    ("tmp", _tmp_why),
)


def _classify(name: str, value: Any) -> tuple[str, str] | None:
    """Return ``(category, why)`` by the first rule that matches; None when the factor is stable."""
    upper = name.upper()
    if not _is_set(value) or "VERSION" in upper:
        return None  # a four-part version ("9.1.0.70", cuDNN) is not an address
    for category, rule in _RULES:
        if (why := rule(upper, name, value)) is not None:
            return category, why
    return None


def classify_factor(key: str, value: Any) -> str | None:
    """Say why a vLLM hash factor changes between pods: a :data:`FACTOR_CATEGORIES` name, or None.

    ``key`` is the factor's dotted path in ``cache_key_factors.json``
    (``env.VLLM_HOST_IP``); only its last part is looked at. ``value`` is a
    scalar or a list of scalars. Categories, first match wins: ``ray`` (a key
    naming a Ray bundle or placement group, with a value set: 0 is a bundle
    index), ``ip`` (an IPv4/IPv6 address other than loopback or unspecified,
    anywhere in a string: alone, in a URL, ``host:port``, a list),
    ``port`` (a key naming ``PORT`` with a port number, 1 to 65535: 0 and
    out-of-range numbers are the same on every pod), ``address`` (a host or
    master address key holding a host name), ``model`` (a local model path:
    mounts differ between pods), ``tmp`` (a path whose first component is
    ``/tmp``; ``/data//tmp/x`` is ``/data/tmp/x``, not under it). Keys naming
    ``VERSION`` are never volatile.
    """
    found = _classify(key.rsplit(".", 1)[-1], value)
    return found[0] if found else None


class VolatileFactor(Record):
    """A hash factor whose value changes from pod to pod.

    ``key`` is its dotted path (``env.VLLM_PORT``, ``code[1].path``),
    ``value`` the value as stored, ``category`` a :data:`FACTOR_CATEGORIES`
    name and ``why`` one phrase saying why it changes.
    """

    key: str
    value: Any
    category: str
    why: str


def _entries(node: Any, prefix: str) -> Iterator[tuple[str, str, Any]]:
    """Yield ``(dotted key, dict key, value)`` for every dict entry, containers included."""
    if isinstance(node, Mapping):
        for name in sorted(node, key=str):
            key = f"{prefix}.{name}" if prefix else str(name)
            value = node[name]
            yield key, str(name), value
            if isinstance(value, Mapping | list):
                yield from _entries(value, key)
    elif isinstance(node, list):
        for i, value in enumerate(node):
            if isinstance(value, Mapping | list):
                yield from _entries(value, f"{prefix}[{i}]")


def volatile_factors(factors: Mapping[str, Any]) -> list[VolatileFactor]:
    """Return the factors of a ``cache_key_factors.json`` document that look run- or pod-specific.

    One per dict entry, in sorted key order, classified by :func:`classify_factor`
    (a list of scalars is classified as one value); the entries inside a flagged
    one are not reported again. Any one of them in vLLM's factors gives a new
    cache dir whenever it changes.
    """
    found: list[VolatileFactor] = []
    flagged: list[str] = []
    for key, name, value in _entries(factors, ""):
        if any(key.startswith((f + ".", f + "[")) for f in flagged):
            continue
        hit = _classify(name, value)
        if hit is not None:
            found.append(VolatileFactor(key, value, *hit))
            flagged.append(key)
    return found


def autotune_table_problems(root: Path) -> dict[PurePosixPath, str]:
    """Tables under ``flashinfer_autotune_cache/`` vLLM would not load, and why.

    ``<version>/<archs>/<hash>/autotune_configs*.json`` must hold a JSON object
    (vLLM refuses anything else from a peer; FlashInfer reads it as one). Files
    elsewhere are not tables and are left alone.
    """
    import re  # noqa: PLC0415  # lazy: a harvest's and a lint's
    from pathlib import PurePosixPath  # noqa: PLC0415  # lazy: as re

    bad: dict[PurePosixPath, str] = {}
    for path in sorted(root.glob("*/*/*/autotune_configs*.json")):
        rel = PurePosixPath(path.relative_to(root).as_posix())
        if len(rel.parts) != _AUTOTUNE_TABLE_DEPTH or not re.match(_AUTOTUNE_TABLE, rel.name):
            continue
        try:
            doc = jsontext.loads(path.read_bytes())
        except (OSError, ValueError):
            doc = None
        if not isinstance(doc, dict):
            bad[rel] = "corrupt FlashInfer autotune table: not a JSON object (vLLM re-tunes)"
    return bad


class VLLMFamily(Family):
    """vLLM torch.compile graphs and artifacts (JIT and AOT), its DeepGEMM dir, autotune tables."""

    name = "vllm"
    #: vLLM's and Inductor's writers rename; the handles file is a load rewrite.
    written_in_place = ()
    description = (
        "vLLM caches (VLLM_CACHE_ROOT: torch_compile_cache, startup_plan, deep_gemm,"
        " flashinfer_autotune_cache)"
    )
    scope = (
        "workload",
        "libraries.vllm",
        "libraries.torch",
        "libraries.triton",
        "libraries.deep_gemm",
        "libraries.sgl-deep-gemm",
        "libraries.flashinfer-python",
        "libraries.nvidia-cutlass-dsl",
        "gpu.name",
        "gpu.arch",
        "gpu.sm_count",
        "cuda.torch_cuda",
        "cuda.nvcc",
        "paths.site_packages",
        "python",
        "platform",
    )
    #: 2: the visible GPU count left the scope; the parallel layout is keyed as the
    #: workload's tp, pp, ep, dp (a build node's GPU count is not a pod's).
    #: 3: the FlashInfer autotune tables and startup plans ship (vLLM 0.33).
    scope_revision = 3
    components = (
        Component("cache", "vllm", {VLLM_CACHE_ROOT: "{dir}"}),
        Component("deep_gemm", f"vllm/{DEEP_GEMM_DIR}", {}),
        Component("flashinfer_autotune", f"vllm/{FLASHINFER_AUTOTUNE_DIR}", {}),
    )
    triton_group_components = frozenset({"cache"})
    written_since_restore = (
        "A new hash dir under `torch_compile_cache/` (a hash factor differs: vLLM chose "
        "another dir) or new artifacts in a restored one (a compile range or shape the "
        "build did not warm up); a new DeepGEMM entry; a FlashInfer autotune table "
        "written or rewritten (vLLM saves it only after tuning); a new startup plan (the "
        "memory profile ran). Other top-level dirs (`modelinfos/`) and DeepGEMM's `tmp/` "
        "never count. `vllm_compile_cache.py` is a load rewrite: releases before the "
        "`is_cache_updated` check rewrite it at every start, hit or not; so is DeepGEMM's "
        "`.committed` (touched on a hit)."
    )
    load_rewrites = frozenset({HANDLES_FILE, DEEPGEMM_COMMIT_FILE})
    library = "vLLM"
    path_cost = (
        "vLLM hashes paths and keeps absolute artifact handles: a pod where this path"
        " differs gets a new cache dir (or misses the artifact) and recompiles"
    )
    python_path_cost = (
        "vLLM hashes the path of every traced source file: a pod whose site-packages"
        " lives elsewhere gets a new cache dir and recompiles"
    )

    def locate(self, environ: Mapping[str, str]) -> list[Located]:
        """Find the root, and the dirs vLLM defaults under it when their variable is unset.

        ``deep_gemm/`` (``DG_JIT_CACHE_DIR``) and ``flashinfer_autotune_cache/``
        (``VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR``); vLLM treats an empty value as unset.
        """
        root = cache_root(environ)
        if not root.is_dir():
            return []
        found = [Located(self.components[0], root)]
        for component, variable, sub in (
            (self.components[1], DG_JIT_CACHE_DIR, DEEP_GEMM_DIR),
            (self.components[2], VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR, FLASHINFER_AUTOTUNE_DIR),
        ):
            if not environ.get(variable) and (root / sub).is_dir():
                found.append(Located(component, root / sub))
        return found

    def excluded(self, component: str, rel: PurePosixPath, is_dir: bool) -> bool:
        """Ship only :data:`HARVESTED` from the root; DeepGEMM's staging dir never."""
        if component == "cache" and len(rel.parts) == 1 and rel.name not in HARVESTED:
            return True
        if component == "deep_gemm" and deepgemm_excluded(rel, is_dir):
            return True
        return super().excluded(component, rel, is_dir)

    def informational(self, rel: PurePosixPath) -> bool:
        """DeepGEMM's ``meta.json`` in the ``deep_gemm`` dir: written, never read back."""
        return deepgemm_meta(rel) or super().informational(rel)

    def informational_reason(self, rel: PurePosixPath) -> str:
        """DeepGEMM's reason for its ``meta.json`` (:func:`deepgemm_meta`)."""
        return DEEPGEMM_META_COST if deepgemm_meta(rel) else super().informational_reason(rel)

    def invalid_entries(self, component: str, root: Path) -> dict[PurePosixPath, str]:
        """DeepGEMM entries neither JIT would load; autotune tables that are not JSON objects."""
        if component == "deep_gemm":
            return deepgemm_partial_entries(root)
        if component == "flashinfer_autotune":
            return autotune_table_problems(root)
        return {}

    def path_bearing(self, component: str, rel: PurePosixPath) -> bool:
        """Triton group files and ``vllm_compile_cache.py`` hold absolute paths."""
        return super().path_bearing(component, rel) or (
            component == "cache" and rel.name == HANDLES_FILE
        )

    def normalize_text(self, data: bytes, roots: tuple[str, ...]) -> bytes:
        """Store paths under the root relative to the placeholder (group files as the base does)."""
        rewritten = rewrite_handles(data, roots, ROOT_PLACEHOLDER)
        return super().normalize_text(data, roots) if rewritten is None else rewritten

    def relocate_text(self, data: bytes, root: str) -> bytes:
        """Point stored paths at the restored root (group files as the base does)."""
        rewritten = rewrite_handles(data, (ROOT_PLACEHOLDER,), root)
        return super().relocate_text(data, root) if rewritten is None else rewritten

    def merge_file(
        self, component: str, rel: PurePosixPath, ours: bytes, theirs: bytes
    ) -> bytes | None:
        """Merge two cells' ``vllm_compile_cache.py`` entry by entry (:func:`merge_handles`).

        Cells that compiled other shapes into the same hash dir each add their
        own handles; one key with two values is a conflict. Every other file
        conflicts, ``cache_key_factors.json`` on purpose: the hash dir's name is
        the hash of those factors, so two cells whose factors differ must never
        share one hash dir (their merge would claim to be valid for both).
        """
        if component != "cache" or rel.name != HANDLES_FILE:
            return None
        return merge_handles(ours, theirs)

    def facts(self, component: str, root: Path) -> dict[str, Any]:
        """Return the raw hash factors per hash dir, for ``diff`` and the volatility lint."""
        if component != "cache":
            return {}
        factors = read_factors(root)
        if not factors:
            return {}
        # lazy: vLLM's key recipe is read at harvest and predict, never at a restore's plan
        from artifactd.families.vllmkey import traced_lists  # noqa: PLC0415

        traced = traced_lists({n: root / COMPILE_DIR / n for n in factors}, factors)
        return {"cache_key_factors": factors, **({"traced_files": traced} if traced else {})}
