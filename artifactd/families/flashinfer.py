"""FlashInfer's JIT workspace (``$FLASHINFER_WORKSPACE_BASE/.cache/flashinfer``).

Facts, read from the flashinfer-python 0.7.2 wheel on PyPI (``flashinfer/jit/env.py``,
``jit/core.py``, ``jit/cpp_ext.py``, ``jit/utils.py``, ``autotune_cache.py``) and
PROVEN on that producer: ``tests/test_producer_flashinfer.py`` runs its own JIT
(``gen_act_and_mul_module("silu").build()``, nvcc for sm_90a, ninja), harvests,
restores under another root and user, and ninja has no work there. Summed up in
``docs/families.md``:

* Root: ``FLASHINFER_CACHE_DIR = $FLASHINFER_WORKSPACE_BASE/.cache/flashinfer``,
  the base defaulting to ``Path.home()`` (``$HOME``) and read once, at import.
  The variable names a HOME-like base, not the cache dir: artifactd restores
  the component at ``<target>/flashinfer-home/.cache/flashinfer`` and sets
  ``FLASHINFER_WORKSPACE_BASE=<target>/flashinfer-home``.
* Workspace: ``<root>/<flashinfer version>/<archs>/`` (``90a``, ``90a_100a``:
  sorted target archs from ``FLASHINFER_CUDA_ARCH_LIST`` or the visible GPUs)
  with ``cached_ops/<op>/{build.ninja, <src dir>_<stem>.cuda.o, <op>.so,
  .ninja_log, .ninja_deps}``, ``generated/`` (generated sources), an
  ``autotune/`` dir some kernels' calibration writes, and ``flashinfer_jit.log``
  (written at import).
* Autotune winners (0.7's managed cache): ``<root>/autotune/v2/<environment
  hash>/{manifest.json, entries/<op hash>.json}``, at the root, keyed by the
  library, CUDA and GPU identity in the hash; ``FLASHINFER_AUTOTUNE_CACHE_DIR``
  overrides the place (outside the root it is not harvested). Written through
  ``.autotune_*.tmp`` files (left out).
* Cubins live at ``<root>/cubins`` (``FLASHINFER_CUBIN_DIR`` overrides it; an
  installed ``flashinfer-cubin`` of the same version supersedes it), at the
  root. They are downloaded at run time, so air-gapped pods need them restored.
  A ``FLASHINFER_CUBIN_DIR`` outside the root is not harvested here. AOT
  modules of a ``flashinfer-jit-cache`` provider are loaded before any JIT and
  are not in this tree (that package is in the scope).
* Locks and temp files: ``cached_ops/tmp/`` (``<op>.lock``, the batch build's
  ``flashinfer_jit.lock`` and ``flashinfer_jit.ninja``), downloads'
  ``<dest>.lock`` and ``<dest>.<uuid>.tmp``. Left out.
* No hash key: ninja decides, every time an op is requested (``build()``
  writes ``build.ninja`` only when its text changes, then runs ninja). Its
  outputs and generated sources are ABSOLUTE (resolved) paths under the
  workspace; its flags name the CUDA home, the Python include dir and
  FlashInfer's ``data/`` include dirs (CUTLASS, CCCL, spdlog) and tvm_ffi's in
  site-packages. Ninja rebuilds when an output's command hashes otherwise than
  ``.ninja_log`` recorded, when ``.ninja_deps`` has no deps for it under its
  path, or when an input is newer than its output. Measured: a plain copy
  under another root recompiles every op (deps "missing", then "command line
  changed"). Hence:

  - mtimes are kept (whole seconds: never newer than what ninja recorded);
  - op dirs ninja would rebuild anyway (no ``.so``, a missing output, no ninja
    logs) are not shipped;
  - ninja's records are moved with the tree (:mod:`artifactd.families.ninjarecords`):
    ``build.ninja`` and the paths in ``.ninja_log``/``.ninja_deps`` are stored
    with the placeholder for the root, and the log keeps each output's command
    so the restore hashes it again for the pod's root (MurmurHash64A for log
    v5/v6, ninja 1.11/1.12; rapidhash for v7, ninja 1.13). The harvest checks
    first that every recorded hash is the hash of the command build.ninja
    evaluates to; an op where it is not (or a log version it cannot hash, or
    a build root ninja would quote) is not shipped: ninja would rebuild it.
  - The paths OUTSIDE the root (CUDA home, site-packages) stay as built:
    :meth:`FlashInferFamily.pinned_paths` records them, and the scope holds
    ``paths.site_packages`` and ``cuda.nvcc``. A pod whose site-packages files
    are newer than the harvested objects (a reinstalled wheel, same version)
    rebuilds too (unverified: depends on how the image's installer sets mtimes).
"""

from __future__ import annotations

from artifactd.constants import FLASHINFER_WORKSPACE_BASE
from artifactd.families.base import Component, Family, Located, home
from artifactd.families.layouts import (
    FLASHINFER_SUBDIR,
    NINJA_FILE,
    NINJA_RECORDS,
    flashinfer_excluded,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path, PurePosixPath

#: The cache dir relative to the workspace base (HOME by default).
CACHE_SUBDIR = FLASHINFER_SUBDIR
#: Where the component lands under a restore target, and the base it implies.
RESTORE_HOME = "flashinfer-home"


def cache_dir(environ: Mapping[str, str]) -> Path:
    """Return FlashInfer's cache dir for a process with ``environ``."""
    from pathlib import Path  # noqa: PLC0415  # lazy: only a harvest locates caches

    base = environ.get(FLASHINFER_WORKSPACE_BASE)
    return (Path(base) if base else home(environ)) / CACHE_SUBDIR


class FlashInferFamily(Family):
    """FlashInfer JIT modules (ninja builds), generated sources, cubins, autotune configs."""

    name = "flashinfer"
    #: Ninja appends to its log and deps records when it runs.
    written_in_place = (".ninja_log", ".ninja_deps")
    description = "FlashInfer JIT workspace (FLASHINFER_WORKSPACE_BASE/.cache/flashinfer)"
    scope = (
        "gpu.arch",
        "libraries.flashinfer-python",
        "libraries.flashinfer-cubin",
        "libraries.flashinfer-jit-cache",
        "cuda.nvcc",
        "paths.site_packages",
        "python.ext_suffix",
        "platform.machine",
    )
    #: 2: ninja's records are stored relocatable (the root as the placeholder, the
    #: log's commands kept); a layer packed before names its build root and
    #: restores into a ninja rebuild, so its scope tag no longer matches.
    scope_revision = 2
    components = (
        Component(
            "cache",
            f"{RESTORE_HOME}/{CACHE_SUBDIR}",
            {FLASHINFER_WORKSPACE_BASE: "{target}/" + RESTORE_HOME},
        ),
    )
    #: Ninja compares input and output mtimes: they must survive the trip.
    keep_mtimes = True
    written_since_restore = (
        "Restored files keep their build mtimes (ninja compares them), so they are older "
        "than the restore: a newer one is a ninja rebuild of an op (objects, `.so`, ninja "
        "logs), a generated source or an autotune result. `build.ninja`, written when an "
        "op loads, is a load rewrite; `cached_ops/tmp/` and the JIT log are left out."
    )
    load_rewrites = frozenset({"build.ninja"})
    library = "FlashInfer"
    path_cost = (
        "ninja rebuilds when a build.ninja command line changes: a pod where this path"
        " differs rebuilds every FlashInfer op"
    )
    python_path_cost = (
        "build.ninja holds this install path: a pod whose site-packages lives elsewhere"
        " rebuilds every FlashInfer op"
    )

    def locate(self, environ: Mapping[str, str]) -> list[Located]:
        """Find the cache the way FlashInfer does: FLASHINFER_WORKSPACE_BASE, else HOME."""
        path = cache_dir(environ)
        return [Located(self.components[0], path)] if path.is_dir() else []

    def excluded(self, component: str, rel: PurePosixPath, is_dir: bool) -> bool:
        """Skip ``cached_ops/tmp/`` (locks, batch ninja file), the JIT log, locks, temp files."""
        return flashinfer_excluded(rel, is_dir) or super().excluded(component, rel, is_dir)

    def invalid_entries(self, component: str, root: Path) -> dict[PurePosixPath, str]:
        """Report op dirs ninja would rebuild: an output or log missing, records stuck at a root."""
        del component
        # lazy: ninja's parsers are harvest's and lint's; a restore plans every family
        from artifactd.families.ninja import ninja_invalid_entries  # noqa: PLC0415
        from artifactd.families.ninjarecords import ninja_relocation_problems  # noqa: PLC0415
        from artifactd.families.tree import root_spellings  # noqa: PLC0415

        return {
            **ninja_invalid_entries(root),
            **ninja_relocation_problems(root, root_spellings(root)),
        }

    def pinned_paths(self, component: str, root: Path) -> list[str]:
        """Return the outside paths the ``build.ninja`` files name (the root itself moves)."""
        del component
        from artifactd.families.ninja import ninja_pinned_paths  # noqa: PLC0415  # lazy: as above

        return ninja_pinned_paths(root, relocated=True)

    def keyed(self, component: str, rel: PurePosixPath) -> bool:
        """Mark an op's outputs and ninja logs (``cached_ops/<op>/*`` but ``build.ninja``).

        FlashInfer names an op dir by the module's URI, which spells what it
        compiles, under the ``<version>/<archs>`` workspace. Two cells that
        built one op with one ``build.ninja`` (compared with the root replaced:
        not keyed, so other flags are a conflict) built one thing, yet their
        objects differ: nvcc embeds the generated source's absolute path, under
        each cell's own root (measured with 0.7.2), and the logs hold timings.
        Either copy serves; the merge keeps the first cell's, whole, since each
        cell's op dir is complete (partial ones are not merged).
        """
        del component
        parts = rel.parts
        return (
            len(parts) >= 3
            and parts[-3] == _OPS_DIR
            and parts[-2] != "tmp"
            and parts[-1] != NINJA_FILE
        )

    def path_bearing(self, component: str, rel: PurePosixPath) -> bool:
        """Mark an op's ``build.ninja``, ``.ninja_log`` and ``.ninja_deps``: they name the root."""
        del component
        return rel.name in NINJA_RECORDS

    def normalize(self, data: bytes, roots: tuple[str, ...]) -> bytes:
        """Store the root as the placeholder: deps paths, log paths and commands, build.ninja."""
        from artifactd.families.ninjarecords import normalize_ninja_record  # noqa: PLC0415  # lazy

        moved = normalize_ninja_record(data, roots)
        return moved if moved is not None else super().normalize(data, roots)

    def relocate(self, data: bytes, root: str) -> bytes:
        """Write the records for ``root``: paths swapped, command hashes computed again."""
        # lazy: loaded when a restore rewrites a ninja record, never to plan
        from artifactd.families.ninjarecords import relocate_ninja_record  # noqa: PLC0415

        moved = relocate_ninja_record(data, root)
        return moved if moved is not None else super().relocate(data, root)


#: The dir holding one dir per op.
_OPS_DIR = "cached_ops"
