"""Cache trees that more than one family ships, and the rules for each.

A Triton kernel cache sits in ``triton/`` of its own family and inside the
Inductor, vLLM and SGLang dirs; a DeepGEMM dir is its own family's and also
``deep_gemm/`` under vLLM's and SGLang's roots; a FlashInfer workspace is its
own family's and ``.cache/flashinfer`` under SGLang's root. Each rule lives
here once, with its tree's path, so the families share it without importing
each other. Paths are relative to the tree's own root, and held as text: a
restore imports every family module and walks no tree
(:func:`~artifactd.families.base.pure_path` makes a path where one is compared).
"""

from __future__ import annotations

import os

from artifactd.families.base import is_group_file, pure_path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path, PurePosixPath

#: ninja's build file, and the files of a module dir that name its build root
#: (moved with the tree): here, so the families hosting ninja trees name them
#: without importing :mod:`~artifactd.families.ninja` (a restore plans every family).
NINJA_FILE = "build.ninja"
NINJA_LOGS = (".ninja_log", ".ninja_deps")
NINJA_RECORDS = frozenset({NINJA_FILE, *NINJA_LOGS})

#: Where vLLM and SGLang put a DeepGEMM dir under their roots.
DEEP_GEMM_DIR = "deep_gemm"
#: A FlashInfer cache relative to its workspace base (HOME by default).
FLASHINFER_SUBDIR = ".cache/flashinfer"
#: Where SGLang points Triton under its root.
TRITON_DIR = "triton"

#: Files every DeepGEMM 2.x entry needs; with either missing DeepGEMM aborts the process.
DEEPGEMM_ENTRY_FILES = ("kernel.cu", "kernel.cubin")
DEEPGEMM_PARTIAL_REASON = (
    "partial DeepGEMM entry: a hard 'Corrupted JIT cache' error at load (2.x),"
    " no .committed marker (deep_jit)"
)
#: The marker deep_jit (sgl-deep-gemm 0.2.x) writes last into an entry: its only hit test.
DEEPGEMM_COMMIT_FILE = ".committed"
#: The one file deep_jit loads from a committed entry (missing: a hard "missing CUDA CUBIN").
DEEPGEMM_CUBIN = "kernel.cubin"
DEEPGEMM_NO_CUBIN_REASON = "partial DeepGEMM entry: committed without kernel.cubin (a hard error)"
#: What deep_jit writes into an entry after compiling it, and never reads back.
DEEPGEMM_META_FILE = "meta.json"
DEEPGEMM_META_COST = (
    "deep_jit records the build in meta.json (nvcc's command line, its staging dir)"
    " and never reads it back: not keyed on, nor followed at load"
)
_FLASHINFER_JIT_LOG = "flashinfer_jit.log"


def triton_partial_entries(root: Path) -> dict[PurePosixPath, str]:
    """Kernel dirs without their group file: an interrupted write, never shipped.

    Triton writes the group file last, so its presence means a complete
    entry. Dirs holding only a compiled launcher (``cuda_utils*.so``) have
    no group file by design.
    """
    from pathlib import PurePosixPath  # noqa: PLC0415  # lazy: a harvest's and a lint's walk

    bad: dict[PurePosixPath, str] = {}
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError:
        return bad
    for entry in entries:
        if not entry.is_dir(follow_symlinks=False) or entry.name.startswith("tmp."):
            continue
        names = os.listdir(entry.path)
        if not names or any(is_group_file(PurePosixPath(n)) for n in names):
            continue
        if all(n.endswith(".so") for n in names):
            continue  # a launcher module (cuda_utils / __triton_launcher)
        bad[PurePosixPath(entry.name)] = "partial Triton entry: no __grp__*.json group file"
    return bad


def deepgemm_excluded(rel: PurePosixPath, is_dir: bool) -> bool:
    """DeepGEMM's own exclusion: the top-level ``tmp/`` staging dir (nvcc's working dir)."""
    return is_dir and rel == pure_path("tmp")


def deepgemm_meta(rel: PurePosixPath) -> bool:
    """Whether ``rel`` (under a DeepGEMM root) is an entry's ``meta.json``.

    deep_jit writes it after compiling (nvcc's command line with the ``tmp/<uuid>/``
    staging path and the absolute ``--include-path``, the nvcc path, the library
    root) and never reads it: a hit is ``.committed``, a load reads ``kernel.cubin``.
    A build path in it is information (:data:`DEEPGEMM_META_COST`), wherever the
    tree lies: the ``deepgemm`` family's root, or the dirs SGLang and vLLM host.
    """
    return len(rel.parts) == 3 and rel.parts[0] == "cache" and rel.name == DEEPGEMM_META_FILE


def deepgemm_entry_problem(present: set[str]) -> str | None:
    """Why a ``cache/<entry>`` dir holding the files ``present`` must not ship, or None.

    Two JITs write this layout. deep_jit (sgl-deep-gemm 0.2.x, what SGLang
    pins) publishes an entry with ``.committed`` written last and counts only
    that as a hit; it then loads ``kernel.cubin`` alone. DeepGEMM 2.x has no
    marker and aborts on an entry without both ``kernel.cu`` and
    ``kernel.cubin``. An entry that either JIT accepts ships.
    """
    if DEEPGEMM_COMMIT_FILE in present:
        return None if DEEPGEMM_CUBIN in present else DEEPGEMM_NO_CUBIN_REASON
    if all(name in present for name in DEEPGEMM_ENTRY_FILES):
        return None
    return DEEPGEMM_PARTIAL_REASON


def deepgemm_partial_entries(root: Path) -> dict[PurePosixPath, str]:
    """Entry dirs under ``cache/`` that neither DeepGEMM JIT would load, and why."""
    from pathlib import PurePosixPath  # noqa: PLC0415  # lazy: as in triton_partial_entries

    bad: dict[PurePosixPath, str] = {}
    try:
        entries = sorted(os.scandir(root / "cache"), key=lambda e: e.name)
    except OSError:
        return bad
    for entry in entries:
        if not entry.is_dir(follow_symlinks=False):
            continue
        why = deepgemm_entry_problem(set(os.listdir(entry.path)))
        if why is not None:
            bad[PurePosixPath("cache", entry.name)] = why
    return bad


def flashinfer_excluded(rel: PurePosixPath, is_dir: bool) -> bool:
    """FlashInfer's own exclusions: ``cached_ops/tmp/`` (locks, batch ninja file), the JIT log."""
    if is_dir:
        return rel.name == "tmp" and rel.parent.name == "cached_ops"
    return rel.name == _FLASHINFER_JIT_LOG
