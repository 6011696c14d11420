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

from artifactd.constants import TRITON_CACHE_DIR, TRITON_HOME
from artifactd.families.base import Component, Family, Located, home
from artifactd.families.layouts import triton_partial_entries

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path, PurePosixPath


class TritonFamily(Family):
    """Triton JIT/AOT kernels: cubins, IR and the launcher .so."""

    name = "triton"
    #: Triton writes a temp dir per entry and renames it (group file last).
    written_in_place = ()
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
    triton_group_components = frozenset({"cache"})
    written_since_restore = (
        "A kernel dir Triton compiled after the restore (IR, cubin, group file). Triton "
        "writes through lock-free `tmp.pid_<pid>_<uuid>/` dirs (left out) and renames into "
        "place; a hit writes nothing. A kernel dir whose group file is not there yet "
        "counts: a compile is under way."
    )
    library = "Triton"
    path_cost = (
        "Triton silently recompiles when restored anywhere else: this file holds an"
        " absolute build path that restore does not rewrite"
    )
    python_path_cost = (
        "Triton's launcher key hashes absolute library and include dirs: a pod whose"
        " Python install lives elsewhere rebuilds the launcher"
    )
    # An entry is loaded from its cubin and its metadata JSON. The IR files are kept
    # for debugging and never read at load; their build paths are source locations.
    # The metadata's paths (``extern_libs``: libdevice inside the triton package) are
    # only used while compiling, and the kernel key hashes libdevice by content
    # (``CUDAOptions.hash`` in Triton 3.x), never by path. The group file is the
    # exception: its child paths are followed, and restore rewrites them.
    informational_files = ("*.source", "*.ttir", "*.ttgir", "*.llir", "*.ptx", "*.amdgcn", "*.json")
    informational_cost = (
        "Triton keeps this path as debug information (a source location, or libdevice's"
        " path, which its kernel key hashes by content): never followed or keyed on at load"
    )

    def locate(self, environ: Mapping[str, str]) -> list[Located]:
        """Find the cache the way Triton does: TRITON_CACHE_DIR, else TRITON_HOME/.triton/cache."""
        from pathlib import Path  # noqa: PLC0415  # lazy: only a harvest locates caches

        configured = environ.get(TRITON_CACHE_DIR)
        if configured:
            path = Path(configured)
        else:
            base = Path(environ[TRITON_HOME]) if environ.get(TRITON_HOME) else home(environ)
            path = base / ".triton" / "cache"
        return [Located(self.components[0], path)] if path.is_dir() else []

    def invalid_entries(self, component: str, root: Path) -> dict[PurePosixPath, str]:
        """Kernel dirs without their group file: an interrupted write, never shipped."""
        del component
        return triton_partial_entries(root)
