"""Drift guards: the cache layouts read from released source must still be in that source.

vLLM, SGLang, DeepGEMM and TileLang cannot run here (no GPU), so their
families were written from the released code. Each :class:`Fact` below is one
thing a family depends on (a directory name, an environment variable read, a
path join) with the file of the release where it was read and the text that
says it. The releases are pinned (name, version, sha256) in
``tests/fixtures/drift/releases.json`` and unpacked by
``scripts/fetch_drift_sources.py`` (``scripts/setup.sh --tests`` runs it). A fact whose
file is gone or whose text changed fails, naming the family, release, file and
fact: re-read that code, update the family, then the fact and the pin.

Without the unpacked sources these tests FAIL (they say to run the fetch
script), unless ``ARTIFACTD_DRIFT_SKIP`` is set: then they are skipped, which
is not coverage. Text is compared with all whitespace removed, so a reformat
does not trip a guard and a changed name does.

Not guardable: the ``cuda-jit`` family's layout belongs to the closed-source
driver (see ``artifactd/families/cudajit.py``); only SGLang's redirect of
``CUDA_CACHE_PATH`` is guarded, under ``sglang``.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from artifactd.constants import (
    CUDA_CACHE_PATH,
    DG_JIT_CACHE_DIR,
    ENV_DRIFT_SKIP,
    ENV_DRIFT_SOURCES,
    FLASHINFER_WORKSPACE_BASE,
    SGLANG_CACHE_DIR,
    SGLANG_JIT_CACHE_DIR,
    TILELANG_CACHE_DIR,
    TORCHINDUCTOR_CACHE_DIR,
    TRITON_CACHE_DIR,
    VLLM_CACHE_ROOT,
    VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR,
    XDG_CACHE_HOME,
)
from artifactd.families import deepgemm, layouts, sglang, tilelang, vllm

REPO = Path(__file__).resolve().parent.parent
RELEASES_FILE = REPO / "tests" / "fixtures" / "drift" / "releases.json"
FETCH = REPO / "scripts" / "fetch_drift_sources.py"
RELEASES: dict[str, dict[str, object]] = json.loads(RELEASES_FILE.read_text())["releases"]

#: Read at import: the suite's autouse fixture hides every ARTIFACTD_* variable from the tests.
_SOURCES_SETTING = os.environ.get(ENV_DRIFT_SOURCES)
_SKIP_SETTING = os.environ.get(ENV_DRIFT_SKIP)

#: The families whose layout was read from source (cuda-jit: closed source, none to read).
GUARDED_FAMILIES = ("vllm", "sglang", "deepgemm", "tilelang")


@dataclass(frozen=True)
class Fact:
    """One thing a family depends on, as the release's file says it.

    ``text`` must occur in ``file`` of ``release`` (whitespace ignored);
    ``binary`` compares raw bytes instead (a literal compiled into a library).
    """

    family: str
    release: str
    file: str
    what: str
    text: str
    binary: bool = False


VLLM_R = "vllm-0.33.0"
#: The release whose cache-key recipe is vllmkey.RECIPE_034 (all four groups recorded raw).
VLLM_34 = "vllm-0.34.0"
FI_R = "flashinfer-python-0.7.2"
SGL_R = "sglang-0.5.23"
DG_R = "sgl-deep-gemm-0.2.3.post2"
TL_R = "tilelang-0.1.15"
TL_OLD = "tilelang-0.1.12"
_DJ = "deep_gemm/include/deep_jit"
_SGL_ENV = "sglang/srt/environ.py"
_FI_CACHE = "vllm/model_executor/warmup/flashinfer_autotune_cache.py"

FACTS = (
    # --- vllm: the root, the compile cache, DeepGEMM, autotune tables, startup plans ---
    Fact(
        "vllm",
        VLLM_R,
        "vllm/envs.py",
        f"the root is {VLLM_CACHE_ROOT}, expanded",
        f'"{VLLM_CACHE_ROOT}": lambda: os.path.expanduser( os.getenv( "{VLLM_CACHE_ROOT}",'
        ' os.path.join(get_default_cache_root(), "vllm"),',
    ),
    Fact(
        "vllm",
        VLLM_R,
        "vllm/envs.py",
        f"the default base is {XDG_CACHE_HOME}, else ~/.cache",
        f'os.getenv( "{XDG_CACHE_HOME}", os.path.join(os.path.expanduser("~"), ".cache"),',
    ),
    Fact(
        "vllm",
        VLLM_R,
        "vllm/compilation/backends.py",
        "the compile cache dir",
        f'envs.{VLLM_CACHE_ROOT}, "{vllm.COMPILE_DIR}", hash_key',
    ),
    Fact(
        "vllm",
        VLLM_R,
        "vllm/compilation/backends.py",
        "per-rank dirs under a hash dir",
        'os.path.join(cache_dir, f"rank_{rank}_{dp_rank}", self.prefix)',
    ),
    Fact(
        "vllm",
        VLLM_R,
        "vllm/compilation/backends.py",
        "the factors file",
        f'os.path.join(local_cache_dir, "{vllm.FACTORS_FILE}")',
    ),
    Fact(
        "vllm",
        VLLM_R,
        "vllm/compilation/backends.py",
        "vllmkey.RECIPE_033: the dir name hashes str() of the four group hashes",
        "factors = [env_hash, config_hash, code_hash, compiler_hash]",
    ),
    Fact(
        "vllm",
        VLLM_R,
        "vllm/compilation/backends.py",
        "vllmkey.RECIPE_033: sha256, first 10 hex",
        "hash_key = hashlib.sha256(str(factors).encode()).hexdigest()[:10]",
    ),
    Fact(
        "vllm",
        VLLM_R,
        "vllm/compilation/backends.py",
        "vllmkey.RECIPE_033: the recorded env is hashed whole (hash_factors)",
        "env_factors = envs.compile_factors() env_hash = hash_factors(env_factors)",
    ),
    Fact(
        "vllm",
        VLLM_R,
        "vllm/compilation/backends.py",
        "vllmkey.RECIPE_033: the record holds env raw and three hashes",
        '"env": env_factors, # raw factors used for env_hash "config_hash": config_hash,'
        ' "code_hash": code_hash, "compiler_hash": compiler_hash,',
    ),
    Fact(
        "vllm",
        VLLM_34,
        "vllm/compilation/backends.py",
        "vllmkey.RECIPE_034: the dir name hashes the four raw groups, code under files",
        'all_factors: dict[str, object] = { "env": env_factors, "config": config_factors,'
        ' "code": {"files": code_factors}, "compiler": compiler_factors, }',
    ),
    Fact(
        "vllm",
        VLLM_34,
        "vllm/compilation/backends.py",
        "vllmkey.RECIPE_034: hash_factors of them, first 10 hex",
        "hash_key = hash_factors(all_factors)[:10]",
    ),
    Fact(
        "vllm",
        VLLM_34,
        "vllm/compilation/backends.py",
        "vllmkey.RECIPE_034: the record holds the four groups raw and three hashes",
        '**all_factors, "config_hash": config_hash, "code_hash": code_hash,'
        ' "compiler_hash": compiler_hash,',
    ),
    Fact(
        "vllm",
        VLLM_34,
        "vllm/config/utils.py",
        "vllmkey.hash_factors: sha256 of json.dumps(sort_keys=True)",
        "return hashlib.sha256(json.dumps(items, sort_keys=True).encode()).hexdigest()",
    ),
    Fact(
        "vllm",
        VLLM_34,
        "vllm/compilation/caching.py",
        "vllmkey.content_hash: a traced file's hash; none for a path starting with <",
        'entry = {"path": str(path)} # Dynamically generated code (e.g. <string> from exec)'
        ' can\'t be checked. if content is not None and not str(path).startswith("<"):'
        ' entry["hash"] = hash_factors({"content": content})',
    ),
    Fact(
        "vllm",
        VLLM_34,
        "vllm/compilation/caching.py",
        "predict: env factors are vLLM's own compile_factors(), as in 0.33",
        "env_factors = envs.compile_factors() env_hash = hash_factors(env_factors)",
    ),
    Fact(
        "vllm",
        VLLM_R,
        "vllm/envs.py",
        "predict: env factors are every registered variable minus an ignore list",
        "for factor, getter in environment_variables.items(): if factor in ignored_factors:",
    ),
    Fact(
        "vllm",
        VLLM_R,
        "vllm/compilation/backends.py",
        "the handle file (absolute paths)",
        f'os.path.join(cache_dir, "{vllm.HANDLES_FILE}")',
    ),
    Fact(
        "vllm",
        VLLM_R,
        "vllm/compilation/decorators.py",
        "the AOT dir",
        f'envs.{VLLM_CACHE_ROOT}, "{vllm.COMPILE_DIR}", "{vllm.AOT_DIR}", hash_key,',
    ),
    Fact(
        "vllm",
        VLLM_R,
        "vllm/compilation/compiler_interface.py",
        "Inductor and Triton caches under the rank dir (group files rewritten)",
        'inductor_cache = os.path.join(base_cache_dir, "inductor_cache")'
        " os.makedirs(inductor_cache, exist_ok=True)"
        ' os.environ["TORCHINDUCTOR_CACHE_DIR"] = inductor_cache',
    ),
    Fact(
        "vllm",
        VLLM_R,
        "vllm/utils/deep_gemm.py",
        f"{DG_JIT_CACHE_DIR} defaults under the root",
        f'DEEP_GEMM_JIT_CACHE_ENV_NAME = "{DG_JIT_CACHE_DIR}"'
        " if not os.environ.get(DEEP_GEMM_JIT_CACHE_ENV_NAME, None):"
        " os.environ[DEEP_GEMM_JIT_CACHE_ENV_NAME] = os.path.join("
        f' envs.{VLLM_CACHE_ROOT}, "{vllm.DEEP_GEMM_DIR}"',
    ),
    Fact(
        "vllm",
        VLLM_R,
        _FI_CACHE,
        "the tables: <root>/flashinfer_autotune_cache/<ver>/<archs>",
        f'Path(envs.{VLLM_CACHE_ROOT}) / "{vllm.FLASHINFER_AUTOTUNE_DIR}"'
        " / flashinfer_workspace.parent.name / flashinfer_workspace.name",
    ),
    Fact(
        "vllm",
        VLLM_R,
        _FI_CACHE,
        f"{VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR} replaces that dir",
        f"override_dir = envs.{VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR} if override_dir:"
        " return Path(override_dir).expanduser()",
    ),
    Fact(
        "vllm",
        VLLM_R,
        _FI_CACHE,
        "a config-hash dir per table",
        "output_dir = flashinfer_autotune_root() / flashinfer_autotune_cache_hash(runner)",
    ),
    Fact(
        "vllm",
        VLLM_R,
        _FI_CACHE,
        "the per-rank table name",
        'return f"autotune_configs_dp{dp_rank}_rank{rank}.json"',
    ),
    Fact(
        "vllm",
        VLLM_R,
        _FI_CACHE,
        "tables are written through .<name>.<random>.tmp",
        'suffix=".tmp", prefix=f".{cache_path.name}."',
    ),
    Fact(
        "vllm",
        VLLM_R,
        "vllm/model_executor/warmup/kernel_warmup.py",
        "a table is rewritten only after tuning",
        "elif tuner._dirty: tuner.save_configs(",
    ),
    Fact(
        "vllm",
        VLLM_R,
        "vllm/envs.py",
        "the autotune override is not a hash factor",
        f'"{VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR}", "VLLM_FLASHINFER_AUTOTUNE_SKIP_OPS",',
    ),
    Fact(
        "vllm",
        VLLM_R,
        "vllm/v1/worker/startup_plan.py",
        "startup plans under the root",
        f'envs.{VLLM_CACHE_ROOT}, "{vllm.STARTUP_PLAN_DIR}", f"startup_plan_{{fingerprint}}.json"',
    ),
    Fact(
        "vllm",
        VLLM_R,
        "vllm/distributed/device_communicators/all_reduce_utils.py",
        "the P2P topology file (left out)",
        f'envs.{VLLM_CACHE_ROOT}, f"gpu_p2p_access_cache_for_{{cache_key}}.json"',
    ),
    Fact(
        "vllm",
        VLLM_R,
        "vllm/model_executor/models/registry.py",
        "modelinfos/ (left out)",
        f'Path(envs.{VLLM_CACHE_ROOT}) / "modelinfos"',
    ),
    Fact(
        "vllm",
        FI_R,
        "flashinfer/jit/env.py",
        "the workspace is <cache>/<version>/<archs>",
        "return FLASHINFER_CACHE_DIR / flashinfer_version / arch",
    ),
    Fact(
        "vllm",
        FI_R,
        "flashinfer/jit/env.py",
        f"its cache is under {FLASHINFER_WORKSPACE_BASE}",
        f'os.getenv("{FLASHINFER_WORKSPACE_BASE}", pathlib.Path.home().as_posix())',
    ),
    Fact(
        "vllm",
        FI_R,
        "flashinfer/autotune_cache.py",
        "the v2 store is FlashInfer's own",
        'return jit_env.FLASHINFER_CACHE_DIR / "autotune"',
    ),
    Fact(
        "vllm",
        FI_R,
        "flashinfer/autotuner/autotuner.py",
        "table metadata: FlashInfer",
        'meta["flashinfer_version"] = _flashinfer_version',
    ),
    Fact(
        "vllm",
        FI_R,
        "flashinfer/autotuner/autotuner.py",
        "table metadata: CuTe DSL",
        'meta["cutlass_dsl_version"] = _get_cute_dsl_version()',
    ),
    Fact(
        "vllm",
        FI_R,
        "flashinfer/autotuner/autotuner.py",
        "table metadata: GPU name",
        'meta["gpu"] = torch.cuda.get_device_name(torch.cuda.current_device())',
    ),
    # --- sglang: the cache dir, the redirects, the JIT dir, what is left out ---
    Fact(
        "sglang",
        SGL_R,
        _SGL_ENV,
        f"{SGLANG_CACHE_DIR} and its default",
        f'{SGLANG_CACHE_DIR} = EnvStr(os.path.expanduser("{sglang.DEFAULT_CACHE}"))',
    ),
    Fact(
        "sglang",
        SGL_R,
        _SGL_ENV,
        "Triton is redirected to triton/",
        f'"{TRITON_CACHE_DIR}": os.path.join(base, "{layouts.TRITON_DIR}")',
    ),
    Fact(
        "sglang",
        SGL_R,
        _SGL_ENV,
        "Inductor is redirected to inductor/",
        f'"{TORCHINDUCTOR_CACHE_DIR}": os.path.join(base, "inductor")',
    ),
    Fact(
        "sglang",
        SGL_R,
        _SGL_ENV,
        "the driver's PTX JIT cache is redirected to nv/",
        f'"{CUDA_CACHE_PATH}": os.path.join(base, "nv")',
    ),
    Fact(
        "sglang",
        SGL_R,
        _SGL_ENV,
        "TileLang is redirected to tilelang/",
        f'"{TILELANG_CACHE_DIR}": os.path.join(base, "tilelang")',
    ),
    Fact(
        "sglang",
        SGL_R,
        _SGL_ENV,
        "FlashInfer's workspace base is the cache dir",
        f'"{FLASHINFER_WORKSPACE_BASE}": base,',
    ),
    Fact(
        "sglang",
        SGL_R,
        _SGL_ENV,
        "a redirect never overrides a variable already set",
        "os.environ.setdefault(key, value)",
    ),
    Fact(
        "sglang",
        SGL_R,
        _SGL_ENV,
        "DeepGEMM goes to deep_gemm/",
        f'SGLANG_DG_CACHE_DIR = EnvStr(lambda: _default_cache_subdir("{layouts.DEEP_GEMM_DIR}"))',
    ),
    Fact(
        "sglang",
        SGL_R,
        "sglang/srt/layers/deep_gemm_wrapper/compile_utils.py",
        f"... handed to DeepGEMM as {DG_JIT_CACHE_DIR}, overriding",
        f'os.environ["{DG_JIT_CACHE_DIR}"] = envs.SGLANG_DG_CACHE_DIR.get()',
    ),
    Fact(
        "sglang",
        SGL_R,
        _SGL_ENV,
        "CuTe DSL AOT objects go to cute_aot/",
        'SGLANG_CUTE_AOT_CACHE_DIR = EnvStr(lambda: _default_cache_subdir("cute_aot"))',
    ),
    Fact(
        "sglang",
        SGL_R,
        _SGL_ENV,
        "ple/ holds model data (left out)",
        'SGLANG_QWEN4_PLE_FILE_DIR = EnvStr(lambda: _default_cache_subdir("ple"))',
    ),
    Fact(
        "sglang",
        SGL_R,
        _SGL_ENV,
        f"{SGLANG_JIT_CACHE_DIR} has no default of its own",
        f"{SGLANG_JIT_CACHE_DIR} = EnvStr(None)",
    ),
    Fact(
        "sglang",
        SGL_R,
        "sglang/kernels/jit/utils/compile/cache.py",
        "the JIT dir's hard-coded default",
        f'envs.{SGLANG_JIT_CACHE_DIR}.get() or "{sglang.DEFAULT_JIT}"',
    ),
    Fact(
        "sglang",
        SGL_R,
        "sglang/kernels/jit/utils/compile/cache.py",
        "JIT leaves: build-/deps-",
        f'_DEPS_FILE = "{sglang.JIT_DEPS_FILE}" _BUILD_KEY_PREFIX = "build-"'
        ' _DEPS_KEY_PREFIX = "deps-"',
    ),
    Fact(
        "sglang",
        SGL_R,
        "sglang/kernels/jit/utils/compile/loader.py",
        "staging builds",
        'staging = scope / f".staging-{uuid.uuid4().hex}"',
    ),
    Fact(
        "sglang",
        SGL_R,
        "sglang/srt/model_executor/runner/flashinfer_autotune.py",
        "autotune tables under flashinfer/autotune/",
        f'Path(envs.{SGLANG_CACHE_DIR}.get()) / "flashinfer" / "autotune" / flashinfer_version',
    ),
    Fact(
        "sglang",
        SGL_R,
        "sglang/srt/compilation/backend.py",
        "the piecewise compile cache",
        'os.path.join( base_cache_dir, "torch_compile_cache", cache_hash, )',
    ),
    Fact(
        "sglang",
        SGL_R,
        "sglang/srt/compilation/compiler_interface.py",
        "its Triton cache (group files rewritten)",
        'triton_cache = os.path.join(self.base_cache_dir, "triton_cache")',
    ),
    Fact(
        "sglang",
        SGL_R,
        "sglang/srt/distributed/device_communicators/custom_all_reduce_utils.py",
        "the P2P topology file (left out)",
        'f"gpu_p2p_access_cache_for_{cuda_visible_devices}.json"',
    ),
    Fact(
        "sglang",
        SGL_R,
        "sglang/srt/rust_extensions/loader.py",
        "Rust extensions' root",
        'Path(sglang_cache).expanduser().resolve() / "rust_extensions"',
    ),
    Fact(
        "sglang",
        SGL_R,
        "sglang/srt/rust_extensions/loader.py",
        "cargo targets (left out)",
        'target_dir = cache_root / "targets" / context.target_fingerprint',
    ),
    Fact(
        "sglang",
        SGL_R,
        "sglang/srt/utils/runai_utils.py",
        "model downloads (left out)",
        'os.makedirs(os.path.join(base_dir, "model_streamer"), exist_ok=True)',
    ),
    Fact(
        "sglang",
        SGL_R,
        "sglang-0.5.23.dist-info/METADATA",
        "the DeepGEMM it pins",
        "Requires-Dist: sgl-deep-gemm==0.2.3.post2",
    ),
    Fact(
        "sglang",
        SGL_R,
        "sglang-0.5.23.dist-info/METADATA",
        "the TileLang it pins",
        "Requires-Dist: tilelang==0.1.12",
    ),
    Fact(
        "sglang",
        SGL_R,
        "sglang-0.5.23.dist-info/METADATA",
        "the FlashInfer it pins",
        "Requires-Dist: flashinfer_python[cu13]==0.7.2",
    ),
    # --- deepgemm: deep_jit as SGLang pins it ---
    Fact(
        "deepgemm",
        DG_R,
        f"{_DJ}/cache/disk.hpp",
        "the variable <prefix>_JIT_CACHE_DIR",
        'env.get<std::string>("JIT_CACHE_DIR")',
    ),
    Fact(
        "deepgemm",
        DG_R,
        f"{_DJ}/cache/disk.hpp",
        "a colon-separated list of roots",
        "env_opt->find(':', begin)",
    ),
    Fact(
        "deepgemm",
        DG_R,
        f"{_DJ}/cache/disk.hpp",
        "the default root ~/.dj",
        f'std::filesystem::path(home) / "{deepgemm.DEFAULT_DIRS[0]}"',
    ),
    Fact(
        "deepgemm",
        DG_R,
        f"{_DJ}/cache/disk.hpp",
        "the commit marker",
        f'kCommitFileName = "{layouts.DEEPGEMM_COMMIT_FILE}"',
    ),
    Fact(
        "deepgemm",
        DG_R,
        f"{_DJ}/cache/disk.hpp",
        "a hit is a committed entry under cache/",
        'const auto path = dir / "cache" / entry_name;'
        " if (std::filesystem::exists(path / kCommitFileName)) {"
        " try_update_mtime(path / kCommitFileName);",
    ),
    Fact(
        "deepgemm",
        DG_R,
        f"{_DJ}/cache/disk.hpp",
        "builds go through tmp/ (left out)",
        'const auto temporary_path = paths[0] / "tmp" / get_uuid();',
    ),
    Fact(
        "deepgemm",
        DG_R,
        f"{_DJ}/utils/env.hpp",
        "the DJ_ fallback prefix",
        'return get_with_prefix<T>("DJ", suffix);',
    ),
    Fact(
        "deepgemm", DG_R, "deep_gemm/_C.so", "the DG prefix, compiled in", "\x00DG\x00", binary=True
    ),
    Fact(
        "deepgemm",
        DG_R,
        f"{_DJ}/backend/cuda/kernel.hpp",
        "a committed entry needs its cubin",
        f'const auto cubin_path = dir / "{layouts.DEEPGEMM_CUBIN}";'
        " if (not std::filesystem::is_regular_file(cubin_path))"
        ' DJ_PANIC("missing CUDA CUBIN: {}", cubin_path.string());',
    ),
    # --- tilelang: 0.1.15 (latest) and 0.1.12 (SGLang's pin) ---
    Fact(
        "tilelang",
        TL_R,
        "tilelang/env.py",
        f"{TILELANG_CACHE_DIR} and its default",
        f'{TILELANG_CACHE_DIR} = EnvVar("{TILELANG_CACHE_DIR}",'
        ' os.path.expanduser("~/.tilelang/cache"))',
    ),
    Fact(
        "tilelang",
        TL_R,
        "tilelang/cache/kernel_cache.py",
        "entry files and dirs",
        f'params_path = "{tilelang.PARAMS}"',
    ),
    Fact(
        "tilelang",
        TL_R,
        "tilelang/cache/kernel_cache.py",
        "the manifest",
        f'manifest_path = "{tilelang.MANIFEST}" cache_root_dir = "kernels"'
        ' staging_root_dir = ".staging"',
    ),
    Fact(
        "tilelang",
        TL_R,
        "tilelang/cache/kernel_cache.py",
        "the manifest's shape",
        'manifest = {"version": 1, "files": files}',
    ),
    Fact(
        "tilelang",
        TL_R,
        "tilelang/cache/kernel_cache.py",
        "<version>/<platform>-<machine>",
        'return os.path.join(version, f"{host_platform}-{host_machine}")',
    ),
    Fact(
        "tilelang",
        TL_R,
        "tilelang/cache/kernel_cache.py",
        "temp siblings (left out)",
        'f".{filename}.{os.getpid()}_{uuid.uuid4().hex}.tmp"',
    ),
    Fact(
        "tilelang",
        TL_R,
        "tilelang/cache/cuda_binary_cache.py",
        "cross-host binaries",
        f'cache_root_dir = "cuda-binaries" cache_format = "{tilelang.BINARY_FORMAT}"',
    ),
    Fact(
        "tilelang",
        TL_OLD,
        "tilelang/cache/kernel_cache.py",
        "the pre-0.1.14 params file",
        f'params_path = "{tilelang.LEGACY_PARAMS}"',
    ),
    Fact(
        "tilelang",
        TL_OLD,
        "tilelang/env.py",
        "the pre-0.1.14 tmp/ dir (left out)",
        'TILELANG_TMP_DIR = EnvVar("TILELANG_TMP_DIR",'
        ' lambda: os.path.join(Environment.TILELANG_CACHE_DIR, "tmp"))',
    ),
)


def sources_dir() -> Path:
    """Where the fetch script unpacked the releases (``$ARTIFACTD_DRIFT_SOURCES`` or default)."""
    return Path(_SOURCES_SETTING) if _SOURCES_SETTING else REPO / ".artifactd" / "drift"


def release_dir(key: str) -> Path:
    """Return the unpacked release; fail (or skip when opted out) when it is not there."""
    release = RELEASES[key]
    out = sources_dir() / key
    try:
        stamp = json.loads((out / ".release.json").read_text())
    except (OSError, ValueError):
        stamp = {}
    if stamp.get("sha256") == release["sha256"]:
        return out
    why = (
        f"the sources of {key} (sha256 {release['sha256']}) are not unpacked in {out}:"
        f" run `python scripts/fetch_drift_sources.py` (scripts/setup.sh --tests does)"
    )
    if _SKIP_SETTING:
        pytest.skip(f"{ENV_DRIFT_SKIP} is set: {why}")
    pytest.fail(why)


def _squash(text: str) -> str:
    return "".join(text.split())


@pytest.mark.parametrize(
    "fact",
    FACTS,
    ids=[f"{f.family}:{f.release}:{f.file.rsplit('/', 1)[-1]}:{f.what}" for f in FACTS],
)
def test_fact_is_still_in_the_release(fact: Fact) -> None:
    path = release_dir(fact.release) / fact.file
    where = f"family {fact.family}: release {fact.release}, {fact.file}"
    assert path.is_file(), f"{where} is gone; the family read '{fact.what}' there: re-read it"
    if fact.binary:
        assert fact.text.encode("latin-1") in path.read_bytes(), (
            f"{where} no longer holds {fact.text!r} ({fact.what}): re-read the release"
        )
        return
    source = path.read_text(encoding="utf-8")
    assert _squash(fact.text) in _squash(source), (
        f"{where} no longer says {fact.text!r} ({fact.what}): the family's layout may have"
        " drifted; re-read that code and update the family, the fact and the pin"
    )


def test_every_guarded_family_and_release_has_facts() -> None:
    assert {f.family for f in FACTS} == set(GUARDED_FAMILIES)
    assert {f.release for f in FACTS} == set(RELEASES)
    for fact in FACTS:
        assert fact.file in RELEASES[fact.release]["members"], (  # type: ignore[operator]
            f"{fact.release}: {fact.file} is not fetched: add it to {RELEASES_FILE.name}"
        )


def test_every_family_docstring_names_the_release_it_was_read_from() -> None:
    for module, releases in (
        (vllm, (VLLM_R, FI_R)),
        (sglang, (SGL_R,)),
        (deepgemm, (DG_R,)),
        (tilelang, (TL_R,)),
    ):
        doc = _squash(module.__doc__ or "")
        for key in releases:
            release = RELEASES[key]
            assert _squash(f"{release['project']} {release['version']}") in doc, (
                module.__name__,
                key,
            )


def _run_fetch(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(FETCH), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        check=False,
    )


def test_fetch_verifies_the_pin_and_unpacks_only_the_members(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    archive = wheels / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("demo/cache.py", 'CACHE = "~/.demo"\n')
        z.writestr("demo/other.py", "x = 1\n")
    data = archive.read_bytes()
    pins = {
        "releases": {
            "demo-1.0": {
                "project": "demo",
                "version": "1.0",
                "filename": archive.name,
                "url": "https://invalid.example/never-fetched.whl",
                "size": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
                "members": ["demo/cache.py"],
            }
        }
    }
    releases = tmp_path / "releases.json"
    releases.write_text(json.dumps(pins))
    dest = tmp_path / "dest"
    ok = _run_fetch("--releases", str(releases), "--from", str(wheels), "--dest", str(dest))
    assert ok.returncode == 0, ok.stderr
    assert (dest / "demo-1.0" / "demo" / "cache.py").read_text() == 'CACHE = "~/.demo"\n'
    assert not (dest / "demo-1.0" / "demo" / "other.py").exists()
    again = _run_fetch("--releases", str(releases), "--dest", str(dest))
    assert again.returncode == 0 and "present" in again.stderr  # no download: pinned and there

    flipped = bytes([data[40] ^ 0xFF])
    archive.write_bytes(data[:40] + flipped + data[41:])  # one byte changed: the pin refuses it
    bad = _run_fetch(
        "--releases", str(releases), "--from", str(wheels), "--dest", str(tmp_path / "d2")
    )
    assert bad.returncode == 1
    assert "sha256" in bad.stderr and "Not unpacked" in bad.stderr
    assert "Traceback" not in bad.stderr
    assert not (tmp_path / "d2" / "demo-1.0").exists()


@pytest.mark.slow  # the inner loop's slowest: waits out deadlines or runs many processes
def test_absent_sources_fail_unless_opted_out(tmp_path: Path) -> None:
    # The guard must never pass silently without the sources: it fails, or skips when asked.
    probe = tmp_path / "test_probe.py"
    probe.write_text(
        "import test_drift_guards as g\n"
        "def test_one():\n"
        "    g.test_fact_is_still_in_the_release(g.FACTS[0])\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": f"{REPO}:{REPO / 'tests'}",
        ENV_DRIFT_SOURCES: str(tmp_path / "empty"),
    }
    env.pop(ENV_DRIFT_SKIP, None)
    cmd = [sys.executable, "-m", "pytest", str(probe), "-q", "-p", "no:cacheprovider", "-rs"]
    failed = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120, check=False)
    assert failed.returncode == 1, failed.stdout
    assert "fetch_drift_sources.py" in failed.stdout
    env[ENV_DRIFT_SKIP] = "1"
    skipped = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120, check=False)
    assert skipped.returncode == 0, skipped.stdout
    assert "1 skipped" in skipped.stdout
