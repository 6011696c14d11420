"""Triton's kernel cache (``TRITON_CACHE_DIR``).

Entries are ``<base32 key>/`` dirs with IR, cubin, metadata and a
``__grp__<name>.json`` group file whose child paths are ABSOLUTE: a cache
restored elsewhere silently recompiles unless they are rewritten, and a copy
whose original still exists silently reads the original's files. The key holds
Triton's own content hash, the bundled ptxas version and the target capability
(``sm_90a`` cubins run on 9.0 only), never the driver or the GPU SKU. The
``cuda_utils`` launcher .so also depends on the Python ABI and glibc.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from artifactd.constants import TRITON_CACHE_DIR, TRITON_HOME
from artifactd.families.base import (
    ROOT_PLACEHOLDER,
    Component,
    Family,
    Located,
    home,
    rewrite_group_json,
)


def is_group_file(rel: PurePosixPath) -> bool:
    """Whether ``rel`` is a Triton group file (``__grp__<name>.json``)."""
    return rel.name.startswith("__grp__") and rel.suffix == ".json"


class TritonFamily(Family):
    """Triton JIT/AOT kernels: cubins, IR and the launcher .so."""

    name = "triton"
    description = "Triton kernels (TRITON_CACHE_DIR)"
    scope = (
        "gpu.arch",
        "libraries.triton",
        "cuda.ptxas",
        "python.ext_suffix",
        "platform.machine",
        "platform.glibc",
    )
    components = (Component("cache", "triton", {TRITON_CACHE_DIR: "{dir}"}),)

    def locate(self, environ: Mapping[str, str]) -> list[Located]:
        """Find the cache the way Triton does: TRITON_CACHE_DIR, else TRITON_HOME/.triton/cache."""
        configured = environ.get(TRITON_CACHE_DIR)
        if configured:
            path = Path(configured)
        else:
            base = Path(environ[TRITON_HOME]) if environ.get(TRITON_HOME) else home(environ)
            path = base / ".triton" / "cache"
        return [Located(self.components[0], path)] if path.is_dir() else []

    def invalid_entries(self, component: str, root: Path) -> dict[PurePosixPath, str]:
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

    def path_bearing(self, component: str, rel: PurePosixPath) -> bool:
        """Group files carry absolute child paths."""
        return is_group_file(rel)

    def normalize(self, data: bytes, roots: tuple[str, ...]) -> bytes:
        """Store child paths relative to the placeholder root."""
        return rewrite_group_json(data, roots, ROOT_PLACEHOLDER)

    def relocate(self, data: bytes, root: str) -> bytes:
        """Point child paths at the restored root."""
        return rewrite_group_json(data, (ROOT_PLACEHOLDER,), root)
