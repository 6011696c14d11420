"""DeepGEMM's JIT kernel cache (``DG_JIT_CACHE_DIR``, default ``~/.dj`` or ``~/.deep_gemm``).

Two JITs write this cache; both read from source, neither run here (no GPU).

deep_jit, in **sgl-deep-gemm 0.2.3.post2** (the DeepGEMM SGLang 0.5.23 pins:
``Requires-Dist: sgl-deep-gemm==0.2.3.post2``; the ``deep_gemm`` package on
PyPI is an unrelated 1.0.0 placeholder, and ``sgl-kernel`` no longer carries
it). Files ``deep_gemm/include/deep_jit/cache/disk.hpp``,
``runtime/runtime.hpp``, ``backend/cuda/backend.hpp``, ``backend/cuda/kernel.hpp``,
``utils/env.hpp``:

* Root: ``<prefix>_JIT_CACHE_DIR`` (prefix ``DG``, falling back to the global
  ``DJ_``), a colon-separated list: the first path is the writable root, the
  others read-only lookup roots. Unset: ``$HOME/.dj``. The prefix is set in
  ``csrc/`` (not shipped in the wheel); ``_C.so`` holds the literal ``DG``.
* Layout: ``cache/<tag>.<digest>/`` with ``kernel.cu``, ``kernel.cubin``,
  ``meta.json`` (``kernel.ptx``/``kernel.sass`` when dumping) and
  ``.committed``, written last; builds go through ``tmp/<uuid>/`` and are
  renamed whole. A hit is ``.committed`` existing, and a hit TOUCHES its mtime
  (``try_update_mtime``): a load rewrite, not a compile. A committed entry
  without ``kernel.cubin`` is a hard "missing CUDA CUBIN" panic.
* ``meta.json`` records how the entry was built: nvcc's command line (the
  ``tmp/<uuid>/`` staging path, the absolute ``--include-path`` into
  site-packages), the nvcc path and the library root. deep_jit writes it after
  compiling and never reads it (a hit is ``.committed``, a load reads
  ``kernel.cubin``): a build path in it is information, not a relocation error
  (:func:`artifactd.families.layouts.deepgemm_meta`). Proven by
  ``tests/test_producer_deepgemm.py``: restored under another root and user,
  the same GEMM ran nvcc only for ``--version`` and wrote only ``.committed``.

DeepGEMM 2.x (deepseek-ai/DeepGEMM main 54e2261, June 2026, 2.6.1:
``csrc/jit/compiler.hpp``, ``csrc/jit/kernel_runtime.hpp``): default
``~/.deep_gemm``; ``cache/kernel.<name>.<digest>/{kernel.cu,kernel.cubin}``;
an entry dir without BOTH files is a hard "Corrupted JIT cache directory"
assertion. Key: ``name $$ signature $$ flags $$ code`` with the NVCC version,
``--gpu-architecture=sm_90a`` and the ABSOLUTE
``-I<dirname(deep_gemm/__init__.py)>/include``.

What ships: the first root of ``DG_JIT_CACHE_DIR``, else the first of
``~/.dj`` and ``~/.deep_gemm`` that exists; never ``tmp/``; an entry only
when one of the JITs accepts it (:func:`artifactd.families.layouts.deepgemm_entry_problem`).
Entries hold no absolute path that is read at load (deep_jit's ``meta.json``
holds some, never read): the dir relocates freely. Scope: the arch, the SM
count (generated code bakes it), nvcc (deep_jit hashes its whole ``--version``
output, run at every start: a pod without the builder's nvcc never hits),
DeepGEMM itself, and its install path (site-packages: 2.x keys on the absolute
include flag; deep_jit hashes the included sources by content, not by path,
``utils/parser.hpp``, and adds ``--include-path`` after the hashed flags).
``DG_JIT_CPP_STANDARD``, ``DG_JIT_WITH_LINEINFO`` and ``DG_JIT_PTXAS_*`` also
change the flags: warm-up and pods must agree on them (not fingerprinted).
deep_jit runs ``$CUDA_HOME/bin/nvcc`` (else ``$CUDA_PATH``'s, else the one on
``PATH``, else ``/usr/local/cuda``'s), the nvcc ``cuda.nvcc`` is probed from
(:func:`artifactd.fingerprint.tools.nvcc_path`); ``DG_JIT_NVCC_COMPILER`` (or
``DJ_``) names another one, which warm-up and pods must agree on too.
The drift guards (``tests/test_drift_guards.py``) hold these facts to the
released source.
"""

from __future__ import annotations

import os
import sys

from artifactd.constants import DG_JIT_CACHE_DIR, DJ_JIT_CACHE_DIR
from artifactd.families.base import Component, Family, Located, home
from artifactd.families.layouts import (
    DEEPGEMM_COMMIT_FILE,
    DEEPGEMM_ENTRY_FILES,
    DEEPGEMM_META_COST,
    DEEPGEMM_PARTIAL_REASON,
    deepgemm_excluded,
    deepgemm_meta,
    deepgemm_partial_entries,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path, PurePosixPath

#: Files every entry needs; with either missing DeepGEMM aborts the process.
ENTRY_FILES = DEEPGEMM_ENTRY_FILES
PARTIAL_REASON = DEEPGEMM_PARTIAL_REASON
#: deep_jit's default root (sgl-deep-gemm 0.2.x), then DeepGEMM 2.x's, under HOME.
DEFAULT_DIRS = (".dj", ".deep_gemm")


def cache_dir(environ: Mapping[str, str]) -> Path | None:
    """Return the writable DeepGEMM root a process with ``environ`` uses, if it exists.

    ``DG_JIT_CACHE_DIR`` (else deep_jit's global ``DJ_JIT_CACHE_DIR``) may list
    several roots separated by ``:``; DeepGEMM writes to the first and only
    reads the others, so only the first is harvested. Unset: the first existing
    default (:data:`DEFAULT_DIRS`).
    """
    from pathlib import Path  # noqa: PLC0415  # lazy: only a harvest locates caches

    configured = environ.get(DG_JIT_CACHE_DIR) or environ.get(DJ_JIT_CACHE_DIR)
    if configured:
        path = Path(configured.split(":", 1)[0])
        return path if path.is_dir() else None
    base = home(environ)
    return next((base / d for d in DEFAULT_DIRS if (base / d).is_dir()), None)


def find_package_parent(package: str, paths: Sequence[str] | None = None) -> str | None:
    """Return the ``sys.path`` entry a plain import of ``package`` would use, without importing.

    One ``stat`` per path entry. DeepGEMM builds its include flag from
    ``os.path.abspath(__file__)``, so the entry is made absolute, not resolved.
    """
    for entry in sys.path if paths is None else paths:
        base = entry or "."
        if os.path.isfile(os.path.join(base, package, "__init__.py")):
            return os.path.abspath(base)
    return None


class DeepGEMMFamily(Family):
    """DeepGEMM JIT cubins with their generated sources."""

    name = "deepgemm"
    #: Kernels are written to a temp dir and renamed; ``.committed`` is a load rewrite.
    written_in_place = ()
    description = "DeepGEMM JIT kernels (DG_JIT_CACHE_DIR)"
    scope = (
        "gpu.arch",
        "gpu.sm_count",
        "cuda.nvcc",
        "libraries.deep_gemm",
        "libraries.sgl-deep-gemm",
        "paths.site_packages",
        "platform.machine",
    )
    components = (Component("cache", "deepgemm", {DG_JIT_CACHE_DIR: "{dir}"}),)
    written_since_restore = (
        "A new `cache/<name>.<digest>/` entry: DeepGEMM compiled a kernel in `tmp/` "
        "(left out) and renamed it into `cache/`. deep_jit touches an entry's `.committed` "
        "marker on every hit: a load rewrite."
    )
    load_rewrites = frozenset({DEEPGEMM_COMMIT_FILE})
    informational_cost = DEEPGEMM_META_COST
    library = "DeepGEMM"
    path_cost = (
        "DeepGEMM keys each kernel on its flags and code: a pod where this path differs"
        " recompiles every kernel it appears in"
    )
    python_path_cost = (
        "DeepGEMM hashes its absolute -I include flag into every kernel key: a pod whose"
        " site-packages lives elsewhere recompiles everything (93 s of a 170 s boot in one"
        " report)"
    )

    def locate(self, environ: Mapping[str, str]) -> list[Located]:
        """Find the cache the way DeepGEMM does (:func:`cache_dir`)."""
        path = cache_dir(environ)
        return [Located(self.components[0], path)] if path is not None else []

    def excluded(self, component: str, rel: PurePosixPath, is_dir: bool) -> bool:
        """Skip the top-level ``tmp/`` staging dir, plus the base exclusions (locks)."""
        return deepgemm_excluded(rel, is_dir) or super().excluded(component, rel, is_dir)

    def informational(self, rel: PurePosixPath) -> bool:
        """deep_jit's ``meta.json``: written after compiling, never read (:func:`deepgemm_meta`)."""
        return deepgemm_meta(rel) or super().informational(rel)

    def invalid_entries(self, component: str, root: Path) -> dict[PurePosixPath, str]:
        """Entry dirs under ``cache/`` that neither DeepGEMM JIT would load."""
        del component
        return deepgemm_partial_entries(root)

    def pinned_paths(self, component: str, root: Path) -> list[str]:
        """Return the site-packages dir holding ``deep_gemm``: its include dir is in every key.

        Found on this interpreter's ``sys.path`` without importing DeepGEMM (which
        would initialise CUDA). When artifactd runs outside the engine's
        environment nothing is found and nothing is pinned.
        """
        del component, root
        parent = find_package_parent("deep_gemm")
        return [parent] if parent else []
