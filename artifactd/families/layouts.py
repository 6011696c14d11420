"""Cache trees that more than one family ships, and the rules for each.

A Triton kernel cache sits in ``triton/`` of its own family and inside the
Inductor, vLLM and SGLang dirs; a DeepGEMM dir is its own family's and also
``deep_gemm/`` under vLLM's and SGLang's roots; a FlashInfer workspace is its
own family's and ``.cache/flashinfer`` under SGLang's root. Each rule lives
here once, with its tree's path, so the families share it without importing
each other. Paths are relative to the tree's own root.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from artifactd.families.base import is_group_file

#: Where vLLM and SGLang put a DeepGEMM dir under their roots.
DEEP_GEMM_DIR = PurePosixPath("deep_gemm")
#: A FlashInfer cache relative to its workspace base (HOME by default).
FLASHINFER_SUBDIR = PurePosixPath(".cache/flashinfer")
#: Where SGLang points Triton under its root.
TRITON_DIR = PurePosixPath("triton")

#: Files every DeepGEMM entry needs; with either missing DeepGEMM aborts the process.
DEEPGEMM_ENTRY_FILES = ("kernel.cu", "kernel.cubin")
DEEPGEMM_PARTIAL_REASON = "partial DeepGEMM entry: a hard 'Corrupted JIT cache' error at load"
_FLASHINFER_JIT_LOG = "flashinfer_jit.log"


def triton_partial_entries(root: Path) -> dict[PurePosixPath, str]:
    """Kernel dirs without their group file: an interrupted write, never shipped.

    Triton writes the group file last, so its presence means a complete
    entry. Dirs holding only a compiled launcher (``cuda_utils*.so``) have
    no group file by design.
    """
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
    return is_dir and rel == PurePosixPath("tmp")


def deepgemm_partial_entries(root: Path) -> dict[PurePosixPath, str]:
    """Entry dirs under ``cache/`` missing ``kernel.cu`` or ``kernel.cubin``."""
    bad: dict[PurePosixPath, str] = {}
    try:
        entries = sorted(os.scandir(root / "cache"), key=lambda e: e.name)
    except OSError:
        return bad
    for entry in entries:
        if not entry.is_dir(follow_symlinks=False):
            continue
        present = set(os.listdir(entry.path))
        if not all(name in present for name in DEEPGEMM_ENTRY_FILES):
            bad[PurePosixPath("cache", entry.name)] = DEEPGEMM_PARTIAL_REASON
    return bad


def flashinfer_excluded(rel: PurePosixPath, is_dir: bool) -> bool:
    """FlashInfer's own exclusions: ``cached_ops/tmp/`` (locks, batch ninja file), the JIT log."""
    if is_dir:
        return rel.name == "tmp" and rel.parent.name == "cached_ops"
    return rel.name == _FLASHINFER_JIT_LOG
