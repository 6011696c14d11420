"""The CUDA driver's PTX JIT cache (``CUDA_CACHE_PATH``, default ``~/.nv/ComputeCache``).

The driver compiles PTX to SASS when a binary carries no SASS for the GPU it
runs on (a fatbin with only PTX for a newer arch, Triton/NVRTC PTX loaded with
``cuModuleLoadData``), and keeps the result here (size capped by
``CUDA_CACHE_MAXSIZE``). The cache is the closed-source driver's: there is
no source to check these facts against, and no drift guard. What this family
relies on is NVIDIA's documentation (the CUDA C++ Programming Guide, "CUDA
Environment Variables": ``CUDA_CACHE_PATH``, default ``~/.nv/ComputeCache`` on
Linux, ``CUDA_CACHE_MAXSIZE``, ``CUDA_CACHE_DISABLE``). The one open-source
fact near it, SGLang 0.5.23 redirecting ``CUDA_CACHE_PATH`` to
``<SGLANG_CACHE_DIR>/nv``, is guarded under ``sglang`` (``docs/families.md``).

* The layout is opaque (an index file and hashed subdirs): shipped byte for
  byte, nothing excluded beyond the usual locks and temp files, no entry-level
  validity check, no absolute paths known inside.
* Scope: the driver version is treated as the key. UNVERIFIED: the driver is
  said to invalidate the cache on upgrade, and an entry compiled for one GPU is
  useless on another, so the arch and the GPU name (SKU) are in the scope too,
  with the machine.
"""

from __future__ import annotations

from artifactd.constants import CUDA_CACHE_PATH
from artifactd.families.base import Component, Family, Located, home

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping


class CudaJitFamily(Family):
    """The driver's cache of PTX compiled to SASS."""

    name = "cuda-jit"
    #: The driver's cache is closed source and rewrites its index: nothing is shared.
    written_in_place = ("*",)
    description = "CUDA driver PTX JIT cache (CUDA_CACHE_PATH)"
    scope = ("driver.version", "gpu.arch", "gpu.name", "platform.machine")
    components = (Component("cache", "cuda-jit", {CUDA_CACHE_PATH: "{dir}"}),)
    written_since_restore = (
        "The driver compiled PTX the restored cache did not hold (a new entry, and its "
        "index rewritten). Unverified (closed source): whether a hit touches the index."
    )
    library = "The CUDA driver"

    def locate(self, environ: Mapping[str, str]) -> list[Located]:
        """Find the cache the way the driver does: CUDA_CACHE_PATH, else ~/.nv/ComputeCache."""
        from pathlib import Path  # noqa: PLC0415  # lazy: only a harvest locates caches

        configured = environ.get(CUDA_CACHE_PATH)
        path = Path(configured) if configured else home(environ) / ".nv" / "ComputeCache"
        return [Located(self.components[0], path)] if path.is_dir() else []
