"""TileLang's kernel cache (``TILELANG_CACHE_DIR``, default ``~/.tilelang/cache``).

Proven on the producer, both layouts (``tests/test_producer_tilelang.py``:
TileLang 0.1.15 and 0.1.12 compile for sm_90a without a GPU; an entry restored
under another root is loaded with no process started and no file written).
Facts, read from source: the tilelang 0.1.15 wheel
(``tilelang/cache/kernel_cache.py``, ``binary_cache.py``,
``cuda_binary_cache.py``, ``jit/adapter/*/kernel_cache.py``, ``env.py``), and the
tilelang 0.1.12 wheel, which SGLang 0.5.23 pins, for the older layout below
(``params.pkl``, ``tmp/``). ``tests/test_drift_guards.py`` holds the names and
paths below to both releases.

* Kernels: ``<version>/<sys.platform>-<machine>/kernels/<sha256 key>/``. The
  files depend on the execution backend: ``device_kernel.cu``,
  ``host_kernel.cu``, ``params.json``, ``manifest.json`` always, plus
  ``kernel_lib.so`` (cython), ``executable.so`` (tvm_ffi), ``kernel.cubin`` +
  ``kernel.py`` (nvrtc) or ``kernel.py``/``launcher_lib.so``/... (cutedsl),
  and an optional ``resource_usage.json``.
* ``manifest.json`` is ``{"version": 1, "files": {<name>: {"size": int,
  "sha256": hex}}}``, written over every file of the staged entry. At load
  every listed file must have its size and the required binaries (``params.json``
  and the backend's library) their sha256; an entry without a readable manifest
  is incomplete and is deleted and recompiled. Files not listed are ignored
  (the CuTeDSL backend adds a cubin to a published entry on first launch), so
  they are not an error here. Entries written by TileLang up to 0.1.13 have
  no manifest and a ``params.pkl`` (checked against tile-ai/tilelang main of
  August 2026): those are left alone.
* Cross-host binaries: ``<version>/cuda-binaries/<key>/{metadata.json,
  kernel.<fmt>}``, metadata ``{"format": "tilelang.cuda-binary-cache.v1",
  "size", "sha256"}``. TileLang never deletes a published one, so a corrupt
  entry would miss forever on the pod: skipped too.
* Staging: ``<version>/<platform>-<machine>/.staging/`` and
  ``<version>/.staging/cuda-binaries/``; temp siblings
  ``.<name>.<pid>_<hex>.tmp[<suffix>]``. Releases up to 0.1.13 wrote temp files
  under ``<cache>/tmp`` (``TILELANG_TMP_DIR``). None of these is shipped.
* Key: TIR script hash, ``out_idx``, args, target string (``cuda ... -arch=sm_90a``),
  host target, execution backend, pass configs, compile flags, tilelang
  version, ``platform.machine()`` (and optionally a hash of libtilelang.so).
  Entries hold relative names only: they relocate freely.

Scope: the arch (target string), TileLang itself (version in key and path;
the RECORD hash stands for the library stamp), ``platform.machine``; ``cuda.nvcc``
because the cubins inside need a driver new enough for the nvcc that built
them; ``platform.glibc`` because ``kernel_lib.so``/``executable.so`` are host
shared objects linked on the build machine (a load failure is a silent
recompile).
"""

from __future__ import annotations

import os

from artifactd import jsontext
from artifactd.constants import TILELANG_CACHE_DIR
from artifactd.families.base import Component, Family, Located, home, pure_path
from artifactd.hashing import copy_hashed

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path, PurePosixPath
    from typing import Any

MANIFEST = "manifest.json"
PARAMS = "params.json"
LEGACY_PARAMS = "params.pkl"
BINARY_METADATA = "metadata.json"
BINARY_FORMAT = "tilelang.cuda-binary-cache.v1"


def _sha256(path: str) -> str:
    with open(path, "rb") as f:
        return copy_hashed(f).hex


def _load_json(path: str) -> Any:
    """Return the parsed JSON, or None when the file is missing or unreadable."""
    try:
        with open(path, encoding="utf-8") as f:
            return jsontext.loads(f.read())  # json.load(f)
    except (OSError, ValueError):
        return None


def _file_matches(path: str, meta: object) -> bool:
    if not isinstance(meta, dict):
        return False
    size, sha = meta.get("size"), meta.get("sha256")
    if type(size) is not int or not isinstance(sha, str):
        return False
    try:
        return os.path.getsize(path) == size and _sha256(path) == sha
    except OSError:
        return False


def kernel_entry_problem(entry: str) -> str | None:
    """Why a ``kernels/<key>`` dir must not ship, or None when its manifest checks out."""
    names = set(os.listdir(entry))
    if MANIFEST not in names:
        if LEGACY_PARAMS in names:
            return None  # TileLang <= 0.1.13 layout: no manifest by design
        return "partial TileLang entry: no manifest.json (TileLang deletes and recompiles it)"
    doc = _load_json(os.path.join(entry, MANIFEST))
    files = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(files, dict):
        return "corrupt TileLang entry: manifest.json is not readable"
    if PARAMS not in files:
        return "partial TileLang entry: manifest.json does not list params.json"
    return _listed_file_problem(entry, names, files)


def _listed_file_problem(entry: str, names: set[str], files: dict[str, Any]) -> str | None:
    for name in sorted(files):
        if "/" in name or name in (".", ".."):
            return f"corrupt TileLang entry: manifest.json lists {name!r}"
        if name not in names:
            return f"partial TileLang entry: {name} (listed in manifest.json) is missing"
        if not _file_matches(os.path.join(entry, name), files[name]):
            return f"corrupt TileLang entry: {name} does not match manifest.json"
    return None


def binary_entry_problem(entry: str) -> str | None:
    """Why a ``cuda-binaries/<key>`` dir must not ship, or None when it verifies."""
    doc = _load_json(os.path.join(entry, BINARY_METADATA))
    if not isinstance(doc, dict) or doc.get("format") != BINARY_FORMAT:
        return "corrupt TileLang binary entry: metadata.json missing or not readable"
    payloads = [n for n in os.listdir(entry) if n.startswith("kernel.")]
    if len(payloads) != 1:
        return "partial TileLang binary entry: no single kernel.<format> file"
    if not _file_matches(os.path.join(entry, payloads[0]), doc):
        return f"corrupt TileLang binary entry: {payloads[0]} does not match metadata.json"
    return None


def _subdirs(path: Path) -> list[os.DirEntry[str]]:
    try:
        return sorted(
            (e for e in os.scandir(path) if e.is_dir(follow_symlinks=False)),
            key=lambda e: e.name,
        )
    except OSError:
        return []


class TileLangFamily(Family):
    """TileLang compiled kernels (sources, host libraries, params) and device binaries."""

    name = "tilelang"
    #: Kernels are written in a ``.staging/`` dir and renamed into place.
    written_in_place = ()
    description = "TileLang kernels (TILELANG_CACHE_DIR)"
    scope = (
        "gpu.arch",
        "libraries.tilelang",
        "cuda.nvcc",
        "platform.machine",
        "platform.glibc",
    )
    components = (Component("cache", "tilelang", {TILELANG_CACHE_DIR: "{dir}"}),)
    written_since_restore = (
        "A new kernel or `cuda-binaries` entry; `.staging/` dirs and "
        "`.<name>.<pid>_<hex>.tmp*` siblings are left out. A file TileLang adds to a "
        "published entry (the CuTeDSL backend's cubin on first launch) counts too."
    )
    exclude_dirs = Family.exclude_dirs | {".staging"}
    exclude_patterns = (
        *Family.exclude_patterns,
        # TileLang's atomic-write temp siblings: .<name>.<pid>_<hex>.tmp[<suffix>]
        r"^\..+\.\d+_[0-9a-f]+\.tmp(\.[^.]+)?$",
    )
    library = "TileLang"
    path_cost = (
        "TileLang entries are meant to relocate: this absolute path will not resolve on"
        " a pod laid out differently, and the entry is recompiled or fails to load"
    )

    def locate(self, environ: Mapping[str, str]) -> list[Located]:
        """Find the cache the way TileLang does: TILELANG_CACHE_DIR, else ~/.tilelang/cache."""
        from pathlib import Path  # noqa: PLC0415  # lazy: only a harvest locates caches

        configured = environ.get(TILELANG_CACHE_DIR)
        path = Path(configured) if configured else home(environ) / ".tilelang" / "cache"
        return [Located(self.components[0], path)] if path.is_dir() else []

    def excluded(self, component: str, rel: PurePosixPath, is_dir: bool) -> bool:
        """Skip staging dirs, temp files, and the top-level ``tmp/`` of releases up to 0.1.13."""
        if is_dir and rel == pure_path("tmp"):
            return True
        return super().excluded(component, rel, is_dir)

    def invalid_entries(self, component: str, root: Path) -> dict[PurePosixPath, str]:
        """Kernel and binary entries that fail their own manifest (see the module doc)."""
        from pathlib import Path, PurePosixPath  # noqa: PLC0415  # lazy: a harvest's and a lint's

        bad: dict[PurePosixPath, str] = {}
        for version in _subdirs(root):
            if version.name in self.exclude_dirs or version.name == "tmp":
                continue
            vdir = Path(version.path)
            for binary in _subdirs(vdir / "cuda-binaries"):
                why = binary_entry_problem(binary.path)
                if why:
                    bad[PurePosixPath(version.name, "cuda-binaries", binary.name)] = why
            for host in _subdirs(vdir):
                if host.name in self.exclude_dirs:
                    continue
                for kernel in _subdirs(vdir / host.name / "kernels"):
                    why = kernel_entry_problem(kernel.path)
                    if why:
                        rel = PurePosixPath(version.name, host.name, "kernels", kernel.name)
                        bad[rel] = why
        return bad
