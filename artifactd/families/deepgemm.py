"""DeepGEMM's JIT kernel cache (``DG_JIT_CACHE_DIR``, default ``~/.deep_gemm``).

Facts, read from DeepGEMM's C++ JIT (``csrc/jit/compiler.hpp`` and
``csrc/jit/kernel_runtime.hpp`` at deepseek-ai/DeepGEMM main 54e2261, June
2026, version 2.6.1; summed up in ``docs/families.md``):

* Layout: ``cache/kernel.<name>.<digest>/{kernel.cu,kernel.cubin}`` (plus
  ``kernel.ptx`` / ``kernel.sass`` when ``DG_JIT_DUMP_*`` is set). An entry is
  compiled in ``tmp/<uuid>/`` and renamed into ``cache/`` whole; ``tmp/`` is
  also nvcc's working directory. ``tmp/`` is never shipped. A ``locks/`` dir,
  which that source does not write, is excluded anyway (older releases).
* ``KernelRuntime::check_validity``: an entry dir that exists without BOTH
  ``kernel.cu`` and ``kernel.cubin`` is a hard "Corrupted JIT cache directory"
  assertion, not a miss. Such dirs are skipped at harvest.
* Key: ``name $$ signature $$ flags $$ code``, where the signature is
  ``NVCC<maj>.<min>`` (or ``NVRTC<maj>.<min>`` with ``DG_JIT_USE_NVRTC=1``),
  the flags hold ``--gpu-architecture=sm_90a`` (``sm_100f`` from NVCC 12.9 on
  Blackwell) and the ABSOLUTE ``-I<dirname(deep_gemm/__init__.py)>/include``
  (with NVRTC also ``-I<CUDA_HOME>/include``), and the generated code bakes
  shapes and the SM count. So the arch, the SM count, nvcc, DeepGEMM itself and
  its install path (site-packages) are in the scope; the driver is not.
  ``DG_JIT_CPP_STANDARD``, ``DG_JIT_WITH_LINEINFO`` and ``DG_JIT_PTXAS_*`` also
  change the flags: warm-up and pods must agree on them (not fingerprinted).
* Entries hold no absolute paths: the dir relocates freely.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath

from artifactd.constants import DG_JIT_CACHE_DIR
from artifactd.families.base import Component, Family, Located, home
from artifactd.families.layouts import (
    DEEPGEMM_ENTRY_FILES,
    DEEPGEMM_PARTIAL_REASON,
    deepgemm_excluded,
    deepgemm_partial_entries,
)

#: Files every entry needs; with either missing DeepGEMM aborts the process.
ENTRY_FILES = DEEPGEMM_ENTRY_FILES
PARTIAL_REASON = DEEPGEMM_PARTIAL_REASON


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
    description = "DeepGEMM JIT kernels (DG_JIT_CACHE_DIR)"
    scope = (
        "gpu.arch",
        "gpu.sm_count",
        "cuda.nvcc",
        "libraries.deep_gemm",
        "paths.site_packages",
        "platform.machine",
    )
    components = (Component("cache", "deepgemm", {DG_JIT_CACHE_DIR: "{dir}"}),)
    written_since_restore = (
        "A new `cache/kernel.<name>.<digest>/` entry: DeepGEMM compiled a kernel in `tmp/` "
        "(left out) and renamed it into `cache/`."
    )
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
        """Find the cache the way DeepGEMM does: DG_JIT_CACHE_DIR, else $HOME/.deep_gemm."""
        configured = environ.get(DG_JIT_CACHE_DIR)
        path = Path(configured) if configured else home(environ) / ".deep_gemm"
        return [Located(self.components[0], path)] if path.is_dir() else []

    def excluded(self, component: str, rel: PurePosixPath, is_dir: bool) -> bool:
        """Skip the top-level ``tmp/`` staging dir, plus the base exclusions (locks)."""
        return deepgemm_excluded(rel, is_dir) or super().excluded(component, rel, is_dir)

    def invalid_entries(self, component: str, root: Path) -> dict[PurePosixPath, str]:
        """Entry dirs under ``cache/`` missing ``kernel.cu`` or ``kernel.cubin``."""
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
