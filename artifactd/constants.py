"""Every environment variable artifactd reads, named in one place.

Library code never calls ``os.environ`` directly for settings: it takes an
``environ`` mapping (defaulting to :func:`current_environ`) so tests and
"what-if" probes can pass their own.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from types import TracebackType

# --- artifactd's own settings (each CLI flag of the init-container commands
# also takes one of these, so Kubernetes users configure through env) ---------
ENV_STORE = "ARTIFACTD_STORE"
ENV_TARGET = "ARTIFACTD_TARGET"
ENV_FROM_DIR = "ARTIFACTD_FROM_DIR"
ENV_SOFTWARE_FROM = "ARTIFACTD_SOFTWARE_FROM"
ENV_NODE_STORE = "ARTIFACTD_NODE_STORE"
ENV_NODE_LINK = "ARTIFACTD_NODE_LINK"
ENV_METRICS_FILE = "ARTIFACTD_METRICS_FILE"
ENV_ENV_FILE = "ARTIFACTD_ENV_FILE"
ENV_REQUIRE = "ARTIFACTD_REQUIRE"
ENV_DRY_RUN = "ARTIFACTD_DRY_RUN"
ENV_JSON = "ARTIFACTD_JSON"
ENV_FAMILIES = "ARTIFACTD_FAMILIES"
ENV_GPU_ARCH = "ARTIFACTD_GPU_ARCH"
ENV_IMAGE_DIGEST = "ARTIFACTD_IMAGE_DIGEST"
ENV_CONSUMER_USER = "ARTIFACTD_CONSUMER_USER"
ENV_TRACEBACK = "ARTIFACTD_TRACEBACK"
ENV_GENERIC_DIR = "ARTIFACTD_GENERIC_DIR"
ENV_INSECURE = "ARTIFACTD_INSECURE"
ENV_WORKLOAD = "ARTIFACTD_WORKLOAD"
ENV_SET = "ARTIFACTD_SET"
ENV_MAX_BYTES = "ARTIFACTD_MAX_BYTES"
#: Development only (scripts/fetch_drift_sources.py, tests/test_drift_guards.py): where the
#: pinned library releases the drift guards read are unpacked (default .artifactd/drift).
ENV_DRIFT_SOURCES = "ARTIFACTD_DRIFT_SOURCES"
#: Development only: set to skip (not pass) the drift guards when those sources are absent.
ENV_DRIFT_SKIP = "ARTIFACTD_DRIFT_SKIP"
ENV_LOCK_TIMEOUT = "ARTIFACTD_LOCK_TIMEOUT"
# --- ``predict`` (the engine's own cache key, recomputed before it starts) ---
ENV_PREDICT_CACHE_ROOT = "ARTIFACTD_PREDICT_CACHE_ROOT"
ENV_PREDICT_FROM = "ARTIFACTD_PREDICT_FROM"
ENV_GPU_NAME = "ARTIFACTD_GPU_NAME"
ENV_MODEL_DIR = "ARTIFACTD_MODEL_DIR"
ENV_RELOCATE = "ARTIFACTD_RELOCATE"
ENV_REQUIRE_HIT = "ARTIFACTD_REQUIRE_HIT"
ENV_ENGINE_FACTORS = "ARTIFACTD_ENGINE_FACTORS"
ENV_ENGINE_PYTHON = "ARTIFACTD_ENGINE_PYTHON"
#: ``restore --predict`` and ``predict --engine-args``: the engine's command line, one string.
ENV_PREDICT = "ARTIFACTD_PREDICT"
ENV_ENGINE_ARGS = "ARTIFACTD_ENGINE_ARGS"
ENV_MEGACACHE_DIR = "ARTIFACTD_MEGACACHE_DIR"
ENV_EXEC_RESTORE = "ARTIFACTD_EXEC_RESTORE"
ENV_ENGINE_LOG = "ARTIFACTD_ENGINE_LOG"
ENV_FAIL_ON_COMPILE = "ARTIFACTD_FAIL_ON_COMPILE"
ENV_STATUS_SERVE = "ARTIFACTD_STATUS_SERVE"
#: ``status`` readiness (:mod:`artifactd.pod.readiness`): the engine's base URL,
#: the matrix whose warm-up requests to send, its cell, and the level to require.
ENV_ENGINE_URL = "ARTIFACTD_ENGINE_URL"
ENV_PREWARM = "ARTIFACTD_PREWARM"
ENV_PREWARM_CELL = "ARTIFACTD_PREWARM_CELL"
#: ``status --prewarm-timeout``: seconds every warm-up request together may take.
ENV_PREWARM_TIMEOUT = "ARTIFACTD_PREWARM_TIMEOUT"
ENV_READY = "ARTIFACTD_READY"
#: ``status --canary``: replay the restored artifact's canary on the engine.
ENV_CANARY = "ARTIFACTD_CANARY"
#: ``exec --on-canary-fail cold``: replay it once the engine is up, restart cold if it fails.
ENV_ON_CANARY_FAIL = "ARTIFACTD_ON_CANARY_FAIL"
#: The registry (``HOST[:PORT]``) the ``ARTIFACTD_REGISTRY_USERNAME``/``PASSWORD``
#: pair belongs to: the pair is sent there and nowhere else (see
#: :mod:`artifactd.stores.credentials`).
ENV_REGISTRY_HOST = "ARTIFACTD_REGISTRY_HOST"
ENV_REGISTRY_USERNAME = "ARTIFACTD_REGISTRY_USERNAME"
ENV_REGISTRY_PASSWORD = "ARTIFACTD_REGISTRY_PASSWORD"  # noqa: S105 - a variable name
#: Mirrors (:mod:`artifactd.stores.mirrors`): ``--mirror`` URLs (whitespace-separated, in
#: order), containerd's hosts directory (``--hosts-dir``, default
#: :data:`DEFAULT_HOSTS_DIR`) and the ``registries.conf`` v2 file (``--registries-conf``,
#: default :data:`DEFAULT_REGISTRIES_CONF`, with its ``.d`` directory beside it).
ENV_MIRRORS = "ARTIFACTD_MIRRORS"
ENV_HOSTS_DIR = "ARTIFACTD_HOSTS_DIR"
ENV_REGISTRIES_CONF = "ARTIFACTD_REGISTRIES_CONF"
DEFAULT_HOSTS_DIR = "/etc/containerd/certs.d"
DEFAULT_REGISTRIES_CONF = "/etc/containers/registries.conf"
#: Key specs (a PEM file's path, or ``env://NAME``): see :mod:`artifactd.trust.keys`.
ENV_SIGN_KEY = "ARTIFACTD_SIGN_KEY"
ENV_VERIFY_KEY = "ARTIFACTD_VERIFY_KEY"
#: The password of an encrypted private key (``keygen`` and every ``--sign-key``).
ENV_KEY_PASSWORD = "ARTIFACTD_KEY_PASSWORD"  # noqa: S105 - a variable name
#: Where the probe keeps the digests it may reuse (see :mod:`artifactd.fingerprint.probecache`);
#: default ``$XDG_CACHE_HOME/artifactd``, else ``~/.cache/artifactd``. Safe to delete.
ENV_CACHE_DIR = "ARTIFACTD_CACHE_DIR"
#: Where a runtime image carries baked stores (``<dir>/<fingerprint hash>/``).
ENV_PREBUILT = "ARTIFACTD_PREBUILT"
#: Set by Kubernetes in each pod of an Indexed Job: ``build``'s default ``--cell``.
JOB_COMPLETION_INDEX = "JOB_COMPLETION_INDEX"
DEFAULT_PREBUILT = "/opt/prebuilt-cache"
#: The reproducible-builds convention: a publish stamps this Unix time as the
#: artifact's creation time instead of now (what ``prune`` ages artifacts by).
SOURCE_DATE_EPOCH = "SOURCE_DATE_EPOCH"

#: Where the embedded default store lives, relative to the working directory.
DEFAULT_STORE = "oci:.artifactd/store"

# --- the libraries' own variables, read to find their caches ---------------
TRITON_CACHE_DIR = "TRITON_CACHE_DIR"
TRITON_HOME = "TRITON_HOME"
TORCHINDUCTOR_CACHE_DIR = "TORCHINDUCTOR_CACHE_DIR"
TMPDIR = "TMPDIR"
HOME = "HOME"
#: The CUDA toolkit the JIT libraries compile with (tvm-ffi, TileLang, SGLang, FlashInfer,
#: DeepGEMM, torch's cpp_extension): ``$CUDA_HOME/bin/nvcc``, else ``$CUDA_PATH/bin/nvcc``.
CUDA_HOME = "CUDA_HOME"
CUDA_PATH = "CUDA_PATH"
DOCKER_CONFIG = "DOCKER_CONFIG"
#: The container engine's address, as the docker CLI and SDK read it (``image build``).
DOCKER_HOST = "DOCKER_HOST"
#: Where a toolchain the probe asks for its version is looked up.
PATH = "PATH"
#: The GPUs a process may use: the builder gives each cell its own.
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"

# --- JIT cache families: DeepGEMM, TileLang, CuTe DSL / FA4, CUDA driver JIT ---
DG_JIT_CACHE_DIR = "DG_JIT_CACHE_DIR"
#: deep_jit's global fallback for DG_JIT_CACHE_DIR (sgl-deep-gemm 0.2.x).
DJ_JIT_CACHE_DIR = "DJ_JIT_CACHE_DIR"
TILELANG_CACHE_DIR = "TILELANG_CACHE_DIR"
CUTE_DSL_CACHE_DIR = "CUTE_DSL_CACHE_DIR"
FLASH_ATTENTION_CUTE_DSL_CACHE_DIR = "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"
#: Written (not read) at restore: FA4 ignores its disk cache unless this is "1".
FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED = "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"
CUDA_CACHE_PATH = "CUDA_CACHE_PATH"
#: CuTe DSL names its default cache dir after ``$USER``, then ``$USERNAME``.
USER = "USER"
USERNAME = "USERNAME"
#: The lint looks for the user's name under either.
LOGNAME = "LOGNAME"
#: ``getpass.getuser`` reads it after ``$LOGNAME`` and ``$USER``, before ``$USERNAME``.
LNAME = "LNAME"
#: Other temp-dir variables a warm-up cell must not inherit.
TEMP = "TEMP"
TMP = "TMP"
#: Tools the probe asks for their version (Triton's ptxas override, the C compiler).
TRITON_PTXAS_PATH = "TRITON_PTXAS_PATH"
CC = "CC"

# --- engine families: FlashInfer, vLLM, SGLang ---
FLASHINFER_WORKSPACE_BASE = "FLASHINFER_WORKSPACE_BASE"
VLLM_CACHE_ROOT = "VLLM_CACHE_ROOT"
#: vLLM's override of its FlashInfer autotune dir (default under VLLM_CACHE_ROOT).
VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR = "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"
XDG_CACHE_HOME = "XDG_CACHE_HOME"
SGLANG_CACHE_DIR = "SGLANG_CACHE_DIR"
SGLANG_JIT_CACHE_DIR = "SGLANG_JIT_CACHE_DIR"

# Variables that would make a probe read the wrong thing if inherited by a
# warm-up cell; the runner clears them before setting fresh cache roots.
CACHE_ENV_VARS = (
    TRITON_CACHE_DIR,
    TORCHINDUCTOR_CACHE_DIR,
    ENV_GENERIC_DIR,
    ENV_MEGACACHE_DIR,
    DG_JIT_CACHE_DIR,
    DJ_JIT_CACHE_DIR,
    TILELANG_CACHE_DIR,
    CUTE_DSL_CACHE_DIR,
    FLASH_ATTENTION_CUTE_DSL_CACHE_DIR,
    CUDA_CACHE_PATH,
    FLASHINFER_WORKSPACE_BASE,
    VLLM_CACHE_ROOT,
    VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR,
    SGLANG_CACHE_DIR,
    SGLANG_JIT_CACHE_DIR,
)


#: pydantic's own switch for its plugin scan (at the first model build it reads
#: the entry points of every installed distribution, and imports each plugin).
PYDANTIC_DISABLE_PLUGINS = "PYDANTIC_DISABLE_PLUGINS"
#: python-zstandard's own choice of backend (``cext``, ``cffi``...): when set, the package
#: decides, so :mod:`artifactd.format.zstd` imports it instead of loading its C backend.
PYTHON_ZSTANDARD_IMPORT_POLICY = "PYTHON_ZSTANDARD_IMPORT_POLICY"


def current_environ() -> Mapping[str, str]:
    """Return the process environment (the one place that reads ``os.environ``)."""
    return os.environ


def pydantic_plugins_off() -> _PluginsOff:
    """Turn pydantic's plugin scan off while a ``with`` block runs, unless its variable is set.

    A restore's documents are validated by artifactd's own models, which no
    plugin is meant to observe, and the scan (the entry points of every
    installed distribution) is part of a restore's fixed cost. The variable
    is pydantic's own switch, read at each model build; it is removed again
    when the block ends, so what runs next (``exec``'s engine, which may use
    pydantic and its plugins) inherits the environment it was given.
    """
    return _PluginsOff()


class _PluginsOff:
    """The block of :func:`pydantic_plugins_off` (a class: ``contextlib`` is off the fast path)."""

    def __init__(self) -> None:
        self._set = False

    def __enter__(self) -> None:
        if PYDANTIC_DISABLE_PLUGINS not in os.environ:
            os.environ[PYDANTIC_DISABLE_PLUGINS] = "__all__"
            self._set = True

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._set:
            os.environ.pop(PYDANTIC_DISABLE_PLUGINS, None)
