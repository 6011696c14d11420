"""Shared fixtures: clean environments, the CLI runner, cache trees and the ``gpu`` marker."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cachetrees import build_caches
from diskfaults import mount_tmpfs, unmount
from forkserver import ENV_FORK, ForkServer, needs_new_interpreter
from hypothesis import HealthCheck, settings
from registry_server import RegistryServer, start_registry

from artifactd import hashing
from artifactd.constants import CACHE_ENV_VARS, ENV_CACHE_DIR
from artifactd.fingerprint.model import Fingerprint
from artifactd.fingerprint.probe import probe_fingerprint
from artifactd.format import unpack

# Property tests have no wall-clock limit: on a loaded machine (CI runs the suite on two
# workers beside real compiles) an example is slower, not wrong. Hypothesis's 200 ms
# deadline per example and its "too slow to generate" health check are such limits; a
# test's own @settings keep them off too (its other fields inherit this profile).
settings.register_profile("artifactd", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("artifactd")

REPO = Path(__file__).resolve().parent.parent
DEMO_MATRIX = REPO / "warmup_matrices" / "cpu-demo.yaml"
WARMUP = REPO / "warmup_matrices" / "cpu-demo" / "warmup.py"
PYTHON = sys.executable


# --------------------------------------------------------------------------
# GPU or not: decided once per session, for the ``gpu`` marker
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuHost:
    """What this machine has: NVIDIA GPUs (through NVML or libcuda) and a driver."""

    gpus: int
    driver: bool
    why: str


def _nvml_gpus() -> tuple[int | None, str]:
    try:
        # lazy: nvidia-ml-py is optional (the gpu extra): without it, no GPU
        import pynvml  # noqa: PLC0415
    except ImportError:
        return None, "nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded...
        return None, f"NVML does not initialise ({exc})"
    try:
        count = int(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()
    return count, f"NVML sees {count} GPU(s)"


def _libcuda_gpus() -> tuple[int | None, str]:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None, "libcuda.so.1 does not load"
    count = ctypes.c_int(0)
    if lib.cuInit(0) != 0 or lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0, "libcuda loads but cuInit finds no device"
    return count.value, f"libcuda sees {count.value} GPU(s)"


def detect_gpu_host() -> GpuHost:
    """Ask NVML, then libcuda, whether this machine has an NVIDIA GPU and a driver."""
    nvml, nvml_why = _nvml_gpus()
    cuda, cuda_why = _libcuda_gpus()
    return GpuHost(
        gpus=max(nvml or 0, cuda or 0),
        driver=nvml is not None or cuda is not None,
        why=f"{nvml_why}; {cuda_why}",
    )


GPU_HOST = detect_gpu_host()
#: Whether torch is installed (not imported: the fast suite's virtualenvs lack it).
HAS_TORCH = importlib.util.find_spec("torch") is not None


#: Markers that say what a test needs or does and imply ``slow`` (pyproject.toml).
SLOW_KINDS = ("podman", "image", "killloop")


@pytest.hookimpl(tryfirst=True)  # before -m selects: the added slow must count
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Add ``slow`` to podman/image/killloop tests; ``gpu`` runs only where it can.

    A test that uses the container engine (tests/engine.py's ``engine``
    fixture) must say so with ``podman``: collection fails otherwise, so the
    inner loop (``-m "not slow"``) never starts an engine by accident.
    ``@pytest.mark.gpu`` runs only with a GPU; ``gpu(absent=True)`` only
    without a driver. ``@pytest.mark.torch`` runs only where torch is installed.
    """
    for item in items:
        if "engine" in getattr(item, "fixturenames", ()) and not item.get_closest_marker("podman"):
            raise pytest.UsageError(f"{item.nodeid} uses the engine: mark it podman")
        if any(item.get_closest_marker(kind) for kind in SLOW_KINDS):
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("torch") and not HAS_TORCH:
            item.add_marker(pytest.mark.skip("needs torch (the warmup extra): not installed"))
        marker = item.get_closest_marker("gpu")
        if marker is None:
            continue
        if marker.kwargs.get("absent"):
            if GPU_HOST.driver:
                item.add_marker(
                    pytest.mark.skip(f"needs a host without an NVIDIA driver: {GPU_HOST.why}")
                )
        elif not GPU_HOST.gpus:
            item.add_marker(pytest.mark.skip(f"needs an NVIDIA GPU: {GPU_HOST.why}"))


# --------------------------------------------------------------------------
# Environment and the CLI
# --------------------------------------------------------------------------


@pytest.fixture(scope="session")
def _probe_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """artifactd's own cache (library hashes) for the session: not the real home's."""
    return tmp_path_factory.mktemp("artifactd-cache")


@pytest.fixture(scope="session", autouse=True)
def _session_env(
    tmp_path_factory: pytest.TempPathFactory, _probe_cache_dir: Path
) -> Iterator[None]:
    """The environment every process a test starts inherits, module fixtures' included.

    Those processes (the CLI, above all: hundreds per run) keep their bytecode
    under one session directory: with PYTHONDONTWRITEBYTECODE (set in some
    shells) each of them compiled artifactd's modules again, a third of a
    restore's CPU time. The prefix keeps every tree a test snapshots free of
    ``__pycache__``.
    """
    with pytest.MonkeyPatch.context() as patch:
        for name in [k for k in os.environ if k.startswith("ARTIFACTD_")]:
            patch.delenv(name)
        patch.setenv(ENV_CACHE_DIR, str(_probe_cache_dir))
        patch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
        patch.setenv("PYTHONPYCACHEPREFIX", str(tmp_path_factory.mktemp("pycache")))
        yield


@pytest.fixture(autouse=True)
def _no_artifactd_env(monkeypatch: pytest.MonkeyPatch, _probe_cache_dir: Path) -> None:
    """No test sees the ARTIFACTD_* settings of the shell that started pytest."""
    for name in [k for k in os.environ if k.startswith("ARTIFACTD_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv(ENV_CACHE_DIR, str(_probe_cache_dir))


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The test process's env without any cache variable, plus ``extra``.

    ``ARTIFACTD_CACHE_DIR`` (artifactd's own cache, not a command setting) is kept.
    """
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in CACHE_ENV_VARS
        and k not in ("TORCHINDUCTOR_CACHE_DIR", "TMPDIR")
        and (k == ENV_CACHE_DIR or not k.startswith("ARTIFACTD_"))
    }
    env.update(extra or {})
    return env


#: Read at import: the session's fixtures remove every ARTIFACTD_* variable.
_FORK = os.environ.get(ENV_FORK, "1") != "0"
#: This pytest process's fork server, once started ("server": ForkServer).
_FORK_SERVER: dict[str, ForkServer] = {}


def fork_server() -> ForkServer | None:
    """This pytest process's CLI fork server (tests/forkserver.py), started on first use.

    None when ``ARTIFACTD_TEST_FORK=0``: every CLI run then starts a new interpreter.
    """
    if not _FORK:
        return None
    if "server" not in _FORK_SERVER:
        _FORK_SERVER["server"] = ForkServer(PYTHON, clean_env(), REPO)
    return _FORK_SERVER["server"]


@pytest.fixture(scope="session", autouse=True)
def _stop_fork_server(_session_env: None) -> Iterator[None]:
    """Stop the fork server at the end of the session, if a test started it."""
    yield
    server = _FORK_SERVER.pop("server", None)
    if server is not None:
        server.close()


#: CPU seconds :func:`machine_factor`'s loop takes on the idle 2-core development VM.
_REFERENCE_LOOP_S = 0.19


@functools.cache
def machine_factor() -> float:
    """How much slower than the idle development VM this machine runs now: 1 to 20.

    Measured once per session: a fixed CPU-bound loop's wall time over its
    reference (a slower CPU and contention for it both lengthen it), or the
    load average per core, whichever says slower. Time limits in the tests are
    ceilings that prove "does not hang"; each is multiplied by this, so a
    loaded machine passes (:func:`scaled`).
    """
    start = time.perf_counter()
    total = 0
    for i in range(2_000_000):
        total += i
    wall = time.perf_counter() - start
    load = os.getloadavg()[0] / (os.cpu_count() or 1)
    return min(20.0, max(1.0, wall / _REFERENCE_LOOP_S, load))


def scaled(seconds: float) -> float:
    """A test's time limit here: ``seconds`` on the idle VM, times :func:`machine_factor`."""
    return seconds * machine_factor()


def run_artifactd(
    *args: str,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 120,
    prelude: str = "",
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m artifactd ARGS``: the real entry point, errors mapped to exit codes.

    ``env`` defaults to :func:`clean_env`; the caller asserts on the result.
    ``prelude`` is Python run first in that process (to patch a constant or
    plant a fault), then the entry point. The run is a fork of a Python that
    has imported artifactd already (tests/forkserver.py says what that keeps,
    and when a new interpreter starts instead, as it does for a prelude).
    """
    run_env = dict(clean_env() if env is None else env)
    timeout = scaled(timeout)
    server = None if prelude else fork_server()
    if server is not None and not needs_new_interpreter(run_env, server.env):
        return server.run(args, env=run_env, cwd=cwd, timeout=timeout)
    argv = ["-m", "artifactd"]
    if prelude:
        argv = ["-c", f"{prelude}\nfrom artifactd.cli import main\nmain()\n"]
    return subprocess.run(
        [PYTHON, *argv, *args],
        capture_output=True,
        text=True,
        env=run_env,
        cwd=cwd,
        timeout=timeout,
        check=False,
    )


#: A ``run_artifactd`` prelude: the command reports its peak memory (VmHWM) on
#: stderr when it exits, read back by :func:`peak_kib`.
PEAK_PRELUDE = """
import atexit, sys
def _peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            sys.stderr.write(f"\\nPEAK_KIB={line.split()[1]}\\n")
atexit.register(_peak)
"""


def peak_kib(proc: subprocess.CompletedProcess[str]) -> int:
    """The peak memory, in KiB, a run with :data:`PEAK_PRELUDE` reported."""
    line = next(x for x in proc.stderr.splitlines() if x.startswith("PEAK_KIB="))
    return int(line.split("=", 1)[1])


def run_artifactd_json(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 120
) -> dict[str, Any]:
    """Run ``python -m artifactd ARGS --json``, require exit code 0, parse its JSON line."""
    proc = run_artifactd(*args, "--json", env=env, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return doc


# --------------------------------------------------------------------------
# The extractor's two writers
# --------------------------------------------------------------------------

#: The C batch writer (where it was built) and the Python loop, its reference.
#: ``c``: the C batch writer, checking every sha256 (OpenSSL's), as for a layer of bulk data;
#: ``c-small``: as for a small layer (CPython's own sha256 checks, the C writer writes);
#: ``python``: the Python loop alone.
BATCH_WRITERS = ("c", "c-small", "python")


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """Mount a tmpfs of ``size`` (``8m``) at ``path`` for the block; skip where not permitted."""
    why = mount_tmpfs(path, size)
    if why is not None:
        pytest.skip(why)
    try:
        yield path
    finally:
        unmount(path)


def built_natively() -> bool:
    """Whether ``pip install`` here builds the C batch writer: a C compiler and Python's headers.

    The extension is optional (a pure wheel where it cannot be built), so a
    broken build would otherwise pass every test on the Python loop alone.
    """
    headers = Path(sysconfig.get_paths()["include"], "Python.h")
    return shutil.which("cc") is not None and headers.is_file()


@pytest.fixture(params=BATCH_WRITERS)
def batch_writer(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test's in-process extractions with one writer (:data:`BATCH_WRITERS`).

    ``c`` skips where the extension was not built; tests/test_batchwrite.py
    fails where it should have been.
    """
    writer: str = request.param
    if writer == "python":
        monkeypatch.setattr(unpack, "_write_natively", None)
    elif unpack._write_natively is None:
        pytest.skip("the C batch writer is not built here")
    elif writer == "c":
        monkeypatch.setattr(hashing, "BULK", -1)  # every layer is bulk data
    else:
        monkeypatch.setattr(hashing, "BULK", 1 << 62)  # no layer is
    return writer


# --------------------------------------------------------------------------
# Fingerprints, caches and registries
# --------------------------------------------------------------------------


@pytest.fixture
def caches(tmp_path: Path) -> dict[str, str]:
    """Triton and generic caches under tmp_path/build and the environ a harvest of them sees."""
    return build_caches(tmp_path / "build")


@pytest.fixture(scope="session")
def local_fp() -> Fingerprint:
    """This machine's fingerprint with the demo's declared target."""
    return probe_fingerprint(gpu_arch="sm_90a", use_nvml=False)


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryServer]:
    """A real CNCF distribution registry on a free loopback port, for the whole session."""
    server = start_registry(tmp_path_factory.mktemp("registry"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def auth_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryServer]:
    """The same registry with htpasswd (bcrypt) basic auth."""
    server = start_registry(
        tmp_path_factory.mktemp("auth-registry"), user="ci", password="s3cret-pw"
    )
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def repo(request: pytest.FixtureRequest) -> str:
    """A repository name of its own for each test."""
    name = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[:60].strip("-")
    return f"t/{name}"
