"""Loose compiled binaries: a tree of ``.cubin``, ``.fatbin``, ``.ptx``, ``.so`` files.

For kernels compiled outside a library cache (``nvcc -cubin`` in a warm-up,
a project's own JIT). The tree comes from ``ARTIFACTD_GENERIC_DIR`` and is
restored as-is; the consumer finds it through the same variable. Validity
depends on the target architecture, the nvcc release and the platform.
"""

from __future__ import annotations

from artifactd.constants import ENV_GENERIC_DIR
from artifactd.families.base import Component, Family, Located

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping


class GenericFamily(Family):
    """A plain tree of compiled objects, restored byte for byte."""

    name = "generic"
    #: Opaque files a build ships as they are, never written by a loader.
    written_in_place = ()
    description = "loose .cubin/.so trees (ARTIFACTD_GENERIC_DIR)"
    scope = ("gpu.arch", "cuda.nvcc", "platform.machine", "platform.glibc")
    components = (Component("cache", "generic", {ENV_GENERIC_DIR: "{dir}"}),)
    written_since_restore = (
        "Whatever the warm-up's own build wrote into the tree: a binary it rebuilt (the "
        "CPU demo's nvcc part writes through a `.tmp` name, left out, then renames)."
    )

    def locate(self, environ: Mapping[str, str]) -> list[Located]:
        """Only an explicitly configured dir: there is no default for loose binaries."""
        from pathlib import Path  # noqa: PLC0415  # lazy: only a harvest locates caches

        configured = environ.get(ENV_GENERIC_DIR)
        if configured and Path(configured).is_dir():
            return [Located(self.components[0], Path(configured))]
        return []
