"""SGLang's kernel caches: ``SGLANG_CACHE_DIR`` and its own JIT dir ``SGLANG_JIT_CACHE_DIR``.

The ``jit`` component is proven on the producer (``tests/test_producer_sglang.py``:
sglang 0.5.23's ``load_jit`` builds for sm_90a without a GPU; a leaf restored
under another root is loaded with only ``nvcc --version`` and ``c++ --version``
started, SGLang's key, and no file written). Facts, read from source: the
**sglang 0.5.23** wheel
(``sglang/srt/environ.py``: ``SGLANG_CACHE_DIR``, ``_default_cache_subdir``,
``third_party_cache_defaults``, ``redirect_third_party_caches``,
``SGLANG_DG_CACHE_DIR``, ``SGLANG_CUTE_AOT_CACHE_DIR``,
``SGLANG_QWEN4_PLE_FILE_DIR``, ``SGLANG_JIT_CACHE_DIR``;
``sglang/kernels/jit/utils/compile/cache.py`` and ``loader.py``;
``sglang/srt/model_executor/runner/flashinfer_autotune.py``;
``sglang/srt/compilation/backend.py`` and ``compiler_interface.py``;
``sglang/srt/layers/deep_gemm_wrapper/compile_utils.py``;
``sglang/srt/distributed/device_communicators/custom_all_reduce_utils.py``;
``sglang/srt/rust_extensions/loader.py``; ``sglang/srt/utils/runai_utils.py``).
It pins flashinfer-python 0.7.2, sgl-deep-gemm 0.2.3.post2, tilelang 0.1.12,
nvidia-cutlass-dsl 4.8.0 and torch 2.14.1. ``tests/test_drift_guards.py``
holds the facts below to the released source; ``docs/families.md`` sums them up.

* ``SGLANG_CACHE_DIR``, default ``~/.cache/sglang`` (HOME, not XDG), holds
  ``triton/`` (``TRITON_CACHE_DIR``), ``inductor/`` (``TORCHINDUCTOR_CACHE_DIR``),
  ``nv/`` (``CUDA_CACHE_PATH``, the driver's PTX JIT cache), ``tilelang/``
  (``TILELANG_CACHE_DIR``), ``.cache/flashinfer`` (``FLASHINFER_WORKSPACE_BASE``
  is the SGLang dir itself), ``deep_gemm/`` (``SGLANG_DG_CACHE_DIR``, handed to
  DeepGEMM as ``DG_JIT_CACHE_DIR``, overriding a value already set),
  ``cute_aot/`` (``SGLANG_CUTE_AOT_CACHE_DIR``),
  ``flashinfer/autotune/<version>/<sm>/<key>/rank_*.json`` (and FLUX.3's
  ``flashinfer/autotune/flux3_prims_ts/<gpu>/<model>``), the piecewise
  compile cache ``torch_compile_cache/<hash>/rank_0_0/<tag>/`` (with
  ``inductor_cache/`` and ``triton_cache/``: Triton group files rewritten) and
  ``rust_extensions/artifacts/<crate>/<fingerprint>/<module>.so`` (built
  Rust extensions, loaded when present).
* Redirect semantics: ``redirect_third_party_caches`` does
  ``os.environ.setdefault`` for each third-party variable, so a value already
  set wins, and it silently does nothing for FlashInfer once FlashInfer was
  imported (it reads its workspace at import) or for Inductor once its
  ``cache_dir()`` ran. Where artifactd's own families set those variables
  (warm-up cells, restore env files), those subtrees stay empty here and the
  kernels ship with the ``triton``, ``inductor``, ``flashinfer``... families.
* The JIT's key runs ``<toolkit>/bin/nvcc --version`` (``$CUDA_HOME``, else
  ``$CUDA_PATH``, else the ``nvcc`` on ``PATH``'s, else ``/usr/local/cuda``: the
  probe's ``cuda.nvcc`` asks the same binary, in the scope) and ``$CXX``
  (else ``c++``) ``--version`` at every start; the host compiler is not in the
  scope yet.
* ``SGLANG_JIT_CACHE_DIR`` defaults to ``~/.cache/sglang/jit`` whatever
  ``SGLANG_CACHE_DIR`` says (the resolver hard-codes it). Layout:
  ``<sm90a>/<module>/build-<key>/deps-<key>/{sgl_deps.json, <module>.so}`` and
  ``.staging-<uuid>/`` builds in progress (left out). Dependencies are stored
  relative to anchor roots (site-packages, toolkit, ``/usr``...) and every leaf
  re-verifies its own list at load: the dir relocates freely. Entries outside
  every anchor are stored as absolute paths: recorded as pinned.
* Left out, not caches a pod should get: ``gpu_p2p_access_cache_for_<devices>.json``
  (the build node's P2P topology), ``model_streamer/`` (RunAI model downloads),
  ``ple/`` (Qwen4's file-backed PLE tables: model data), ``rust_extensions/targets/``
  (cargo build dirs; the built ``.so`` under ``artifacts/`` ships) and the
  ``kernels.lock`` HF-kernels lock file (with all ``*.lock`` files).
* ``torch_compile_cache/.../sglang_compile_cache.py`` holds absolute artifact
  paths, but 0.5.23 never loads a graph from it (``CompilerManager.load`` has
  no caller): it ships as is; the Inductor and Triton caches beside it are
  what a pod reuses.

So the family has two components restored side by side (``sglang`` and
``sglang-jit``, both variables set). The ``cache`` component never ships a
top-level ``jit/`` (the nested default of the other component). Inside it the
Triton group files (``triton/``, ``inductor/``, ``torch_compile_cache/``) get
the Triton family's path rewriting, partial Triton and DeepGEMM entries are
skipped, and the ``.cache/flashinfer`` tree gets the FlashInfer family's
treatment: mtimes kept, module dirs ninja would rebuild skipped, the
outside paths its ``build.ninja`` files name pinned, and ninja's records
(``build.ninja``, ``.ninja_log``, ``.ninja_deps``) stored with the root as the
placeholder and written for the pod's root on restore, command hashes
computed again (:mod:`artifactd.families.ninjarecords`), so a hosted op is not
rebuilt under another root.
"""

from __future__ import annotations

import os

from artifactd import jsontext
from artifactd.constants import SGLANG_CACHE_DIR, SGLANG_JIT_CACHE_DIR
from artifactd.families.base import Component, Family, Located, expanduser, pure_path
from artifactd.families.layouts import (
    DEEP_GEMM_DIR,
    DEEPGEMM_COMMIT_FILE,
    DEEPGEMM_META_COST,
    FLASHINFER_SUBDIR,
    NINJA_RECORDS,
    TRITON_DIR,
    deepgemm_excluded,
    deepgemm_meta,
    deepgemm_partial_entries,
    flashinfer_excluded,
    triton_partial_entries,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from pathlib import Path, PurePosixPath

DEFAULT_CACHE = "~/.cache/sglang"
DEFAULT_JIT = "~/.cache/sglang/jit"
JIT_DEPS_FILE = "sgl_deps.json"
_NESTED_JIT = "jit"
#: Top-level dirs of the cache dir that hold no kernels (model data, downloads).
_NOT_CACHES = frozenset({"model_streamer", "ple"})
_CARGO_TARGETS = "rust_extensions/targets"
#: The build node's GPU peer-to-peer topology, per CUDA_VISIBLE_DEVICES (``re.match``).
_P2P_FILE = r"^gpu_p2p_access_cache_for_.*\.json$"


def cache_dirs(environ: Mapping[str, str]) -> tuple[Path, Path]:
    """Return (``SGLANG_CACHE_DIR``, ``SGLANG_JIT_CACHE_DIR``) as SGLang resolves them."""
    cache = environ.get(SGLANG_CACHE_DIR) or DEFAULT_CACHE
    jit = environ.get(SGLANG_JIT_CACHE_DIR) or DEFAULT_JIT
    return expanduser(cache, environ), expanduser(jit, environ)


def _prefixed(prefix: str, found: Mapping[PurePosixPath, str]) -> dict[PurePosixPath, str]:
    top = pure_path(prefix)
    return {top / rel: why for rel, why in found.items()}


def _under(rel: PurePosixPath, top: str) -> PurePosixPath | None:
    """``rel`` relative to ``top`` when it lies strictly below it, else None."""
    path = pure_path(top)
    return rel.relative_to(path) if rel != path and rel.is_relative_to(path) else None


def _p2p_file(name: str) -> bool:
    """Whether ``name`` is a P2P topology file (:data:`_P2P_FILE`)."""
    import re  # noqa: PLC0415  # lazy: a harvest's walk, never a restore

    return re.match(_P2P_FILE, name) is not None


def _tenant_excluded(rel: PurePosixPath, is_dir: bool) -> bool:
    """Whether the DeepGEMM or FlashInfer tree inside the cache dir leaves ``rel`` out."""
    if (inner := _under(rel, DEEP_GEMM_DIR)) is not None:
        return deepgemm_excluded(inner, is_dir)
    inner = _under(rel, FLASHINFER_SUBDIR)
    return inner is not None and flashinfer_excluded(inner, is_dir)


def _hosted_deepgemm_meta(rel: PurePosixPath) -> bool:
    """Whether ``rel`` is an entry's ``meta.json`` in the DeepGEMM tree inside the cache dir."""
    inner = _under(rel, DEEP_GEMM_DIR)
    return inner is not None and deepgemm_meta(inner)


def _jit_leaves(root: Path) -> Iterable[tuple[PurePosixPath, Path, str]]:
    """Yield (rel path, dir, module name) for each ``<target>/<module>/build-*/deps-*`` leaf."""
    from pathlib import PurePosixPath  # noqa: PLC0415  # lazy: a harvest's and a lint's

    for target in _subdirs(root):
        for module in _subdirs(target):
            for build in _subdirs(module):
                if not build.name.startswith("build-"):
                    continue
                for leaf in _subdirs(build):
                    if leaf.name.startswith("deps-"):
                        rel = PurePosixPath(leaf.relative_to(root).as_posix())
                        yield rel, leaf, module.name


def _subdirs(d: Path) -> list[Path]:
    from pathlib import Path  # noqa: PLC0415  # lazy: a harvest's and a lint's

    try:
        return sorted(
            Path(e.path)
            for e in os.scandir(d)
            if e.is_dir(follow_symlinks=False) and not e.name.startswith(".")
        )
    except OSError:
        return []


class SGLangFamily(Family):
    """SGLang's unified kernel cache dir and its own JIT build cache."""

    name = "sglang"
    #: Ninja appends to its log and deps records when it runs.
    written_in_place = (".ninja_log", ".ninja_deps")
    description = "SGLang kernel caches (SGLANG_CACHE_DIR, SGLANG_JIT_CACHE_DIR)"
    scope = (
        "workload",
        "libraries.sglang",
        "libraries.torch",
        "libraries.triton",
        "libraries.flashinfer-python",
        "libraries.deep_gemm",
        "libraries.sgl-deep-gemm",
        "libraries.tilelang",
        "libraries.nvidia-cutlass-dsl",
        "gpu.name",
        "gpu.arch",
        "gpu.sm_count",
        "cuda.torch_cuda",
        "cuda.nvcc",
        "cuda.ptxas",
        "paths.site_packages",
        "python",
        "platform",
    )
    #: 2: the visible GPU count left the scope; the parallel layout is keyed as the
    #: workload's tp, pp, ep, dp (a build node's GPU count is not a pod's).
    #: 3: the hosted FlashInfer tree's ninja records are stored relocatable (an
    #: older layer restores into a ninja rebuild under the pod's root).
    scope_revision = 3
    components = (
        Component("cache", "sglang", {SGLANG_CACHE_DIR: "{dir}"}),
        Component("jit", "sglang-jit", {SGLANG_JIT_CACHE_DIR: "{dir}"}),
    )
    #: The FlashInfer tree inside is ninja-driven; JIT leaves are ordered by mtime.
    keep_mtimes = True
    written_since_restore = (
        "A new Triton, Inductor, DeepGEMM, TileLang or driver-JIT entry under the cache "
        "root, a FlashInfer rebuild (`build.ninja` alone is a load rewrite), or a new JIT "
        "build leaf; `.staging-*` builds and tmp dirs are left out. A JIT leaf SGLang "
        "loads gets its dir's mtime bumped (it orders leaves by mtime), no file written "
        "(measured, sglang 0.5.23). DeepGEMM's `.committed` marker is touched on every "
        "hit: a load rewrite."
    )
    load_rewrites = frozenset({"build.ninja", DEEPGEMM_COMMIT_FILE})
    #: Triton group files under ``triton/``, or ``inductor/`` when Triton went there.
    triton_group_components = frozenset({"cache"})
    library = "SGLang"

    def locate(self, environ: Mapping[str, str]) -> list[Located]:
        """Find both dirs the way SGLang resolves them (each only if it exists)."""
        cache, jit = cache_dirs(environ)
        found = [Located(self.components[0], cache)] if cache.is_dir() else []
        if jit.is_dir():
            found.append(Located(self.components[1], jit))
        return found

    def excluded(self, component: str, rel: PurePosixPath, is_dir: bool) -> bool:
        """Skip the nested ``jit/``, non-caches (module doc), tenants' staging, locks, temps."""
        if component == "jit":
            own = is_dir and rel.name.startswith(".staging-")
        else:
            text = rel.as_posix()  # equal paths, equal texts
            own = (
                text == _NESTED_JIT
                or (is_dir and (text in _NOT_CACHES or text == _CARGO_TARGETS))
                or (len(rel.parts) == 1 and not is_dir and _p2p_file(rel.name))
                or _tenant_excluded(rel, is_dir)
            )
        return own or super().excluded(component, rel, is_dir)

    def informational(self, rel: PurePosixPath) -> bool:
        """DeepGEMM's ``meta.json`` in the hosted ``deep_gemm/`` dir: written, never read back."""
        return _hosted_deepgemm_meta(rel) or super().informational(rel)

    def informational_reason(self, rel: PurePosixPath) -> str:
        """DeepGEMM's reason for its ``meta.json`` (:func:`deepgemm_meta`)."""
        if _hosted_deepgemm_meta(rel):
            return DEEPGEMM_META_COST
        return super().informational_reason(rel)

    def invalid_entries(self, component: str, root: Path) -> dict[PurePosixPath, str]:
        """Report partial Triton/DeepGEMM entries, modules ninja would rebuild, bad JIT leaves."""
        if component == "jit":
            bad: dict[PurePosixPath, str] = {}
            for rel, leaf, module in _jit_leaves(root):
                if not (leaf / f"{module}.so").is_file():
                    bad[rel] = f"SGLang JIT leaf without {module}.so: never a hit"
            return bad
        # lazy: ninja's parsers are harvest's and lint's; a restore plans every family
        from artifactd.families.ninja import ninja_invalid_entries  # noqa: PLC0415
        from artifactd.families.ninjarecords import ninja_relocation_problems  # noqa: PLC0415
        from artifactd.families.tree import root_spellings  # noqa: PLC0415

        return {
            **_prefixed(TRITON_DIR, triton_partial_entries(root / TRITON_DIR)),
            **_prefixed(DEEP_GEMM_DIR, deepgemm_partial_entries(root / DEEP_GEMM_DIR)),
            **ninja_invalid_entries(root / FLASHINFER_SUBDIR, pure_path(FLASHINFER_SUBDIR)),
            **ninja_relocation_problems(
                root / FLASHINFER_SUBDIR, root_spellings(root), pure_path(FLASHINFER_SUBDIR)
            ),
        }

    def pinned_paths(self, component: str, root: Path) -> list[str]:
        """FlashInfer's ``build.ninja`` paths, and JIT dependencies outside every anchor root."""
        if component == "cache":
            from artifactd.families.ninja import ninja_pinned_paths  # noqa: PLC0415  # lazy: as above

            return ninja_pinned_paths(root / FLASHINFER_SUBDIR, relocated=True)
        pinned: set[str] = set()
        for _rel, leaf, _module in _jit_leaves(root):
            try:
                entries = jsontext.loads((leaf / JIT_DEPS_FILE).read_bytes())
            except (OSError, ValueError):
                continue
            for entry in entries if isinstance(entries, list) else []:
                if isinstance(entry, list) and len(entry) == 3 and entry[0] == "abs":
                    pinned.add(os.path.dirname(str(entry[1])))
        return sorted(p for p in pinned if p.startswith("/"))

    def path_bearing(self, component: str, rel: PurePosixPath) -> bool:
        """Triton group files, and the ninja records of the FlashInfer tree it hosts."""
        return super().path_bearing(component, rel) or (
            component == "cache"
            and _under(rel, FLASHINFER_SUBDIR) is not None
            and rel.name in NINJA_RECORDS
        )

    def normalize(self, data: bytes, roots: tuple[str, ...]) -> bytes:
        """Store the root as the placeholder (ninja's records as the flashinfer family does)."""
        from artifactd.families.ninjarecords import normalize_ninja_record  # noqa: PLC0415  # lazy

        moved = normalize_ninja_record(data, roots)
        return moved if moved is not None else super().normalize(data, roots)

    def relocate(self, data: bytes, root: str) -> bytes:
        """Write the stored files for ``root`` (ninja's command hashes computed again)."""
        # lazy: loaded when a restore rewrites a ninja record, never to plan
        from artifactd.families.ninjarecords import relocate_ninja_record  # noqa: PLC0415

        moved = relocate_ninja_record(data, root)
        return moved if moved is not None else super().relocate(data, root)
