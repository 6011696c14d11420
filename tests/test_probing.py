"""The pydantic-free probe and the typed fingerprint must never drift apart."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest
from producer_checks import fake_toolkit

from artifactd.fingerprint import probe as probing
from artifactd.fingerprint import tools
from artifactd.fingerprint.key import flatten, hashed_view, raw_hash
from artifactd.fingerprint.model import Fingerprint
from artifactd.fingerprint.probe import probe_raw
from artifactd.fingerprint.probecache import CACHE_FILE_NAME, ProbeCache


def test_raw_probe_has_the_models_exact_shape() -> None:
    raw = probe_raw(gpu_arch="sm_90a", workload={"model": "m"}, use_nvml=False)
    model = Fingerprint.model_validate(raw)
    assert model.model_dump(mode="json") == raw
    assert raw_hash(raw) == model.hash
    assert flatten(hashed_view(raw)) == model.flatten()


def test_raw_hash_ignores_info_only() -> None:
    raw = probe_raw(use_nvml=False)
    other = json.loads(json.dumps(raw))
    other["info"]["hostname"] = "elsewhere"
    other["info"]["probed_at"] = 0
    assert raw_hash(other) == raw_hash(raw)
    other["workload"] = {"tp": "8"}
    assert raw_hash(other) != raw_hash(raw)


def test_probe_with_a_warm_cache_hashes_nothing_and_answers_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache" / CACHE_FILE_NAME
    cold = probe_raw(gpu_arch="sm_90a", use_nvml=False, cache=ProbeCache(cache))
    if not cold["libraries"]:
        pytest.skip("no tracked library is installed here")
    calls: list[Path] = []

    def counted(path: Path) -> str:
        calls.append(path)
        return "x"

    monkeypatch.setattr(probing, "record_digest", counted)
    warm = probe_raw(gpu_arch="sm_90a", use_nvml=False, cache=ProbeCache(cache))
    assert raw_hash(warm) == raw_hash(cold)
    assert warm["libraries"] == cold["libraries"]
    assert calls == []
    uncached = probe_raw(gpu_arch="sm_90a", use_nvml=False, cache=ProbeCache(None))
    assert len(calls) == len(cold["libraries"])
    assert all(lib["content_hash"] == "x" for lib in uncached["libraries"].values())


def test_probe_puts_its_cache_where_the_environment_says(tmp_path: Path) -> None:
    env = {"PATH": os.environ.get("PATH", ""), "ARTIFACTD_CACHE_DIR": str(tmp_path / "c")}
    raw = probe_raw(use_nvml=False, environ=env)
    written = tmp_path / "c" / CACHE_FILE_NAME
    assert written.exists() == any(lib["content_hash"] for lib in raw["libraries"].values())


def test_run_version_answers_only_for_a_tool_that_succeeds_in_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    py = sys.executable
    assert tools.run_version([py, "-c", "print('tool 1.2')"]) == "tool 1.2\n"
    assert tools.run_version([py, "-c", "print('tool 1.2'); raise SystemExit(3)"]) is None
    assert tools.run_version([str(tmp_path / "missing-tool"), "--version"]) is None
    monkeypatch.setattr(tools, "TOOL_TIMEOUT_S", 0.2)
    start = time.monotonic()
    assert tools.run_version([py, "-c", "import time; time.sleep(30)"]) is None
    assert time.monotonic() - start < 10  # killed at the deadline, not waited for


def test_pending_probe_reads_the_tools_it_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cc = tmp_path / "cc"
    cc.write_text("#!/bin/sh\necho 'fake-cc (artifactd test) 9.9'\n")
    cc.chmod(0o755)
    env = {"PATH": os.environ.get("PATH", ""), "CC": str(cc)}
    pending = probing.PendingProbe(use_nvml=False, environ=env, cache=ProbeCache(None))
    assert pending.result()["compilers"]["cc"] == "fake-cc (artifactd test) 9.9"
    assert pending.result() is pending.result()


def test_one_compiler_under_two_names_is_one_identity(tmp_path: Path) -> None:
    """GCC prints the name it was invoked by: ``cc`` and ``gcc`` must not read as two compilers."""
    real = tmp_path / "x86_64-test-gcc-12"
    real.write_text('#!/bin/sh\necho "$(basename "$0") (Test 12.2.0-14) 12.2.0"\n')
    real.chmod(0o755)
    (tmp_path / "cc").symlink_to(real.name)
    (tmp_path / "gcc").symlink_to(real.name)
    path = str(tmp_path)
    ids = {
        name: tools.compiler_identity(
            name, tools.run_version([str(tmp_path / name), "--version"]), path
        )
        for name in ("cc", "gcc", str(real))
    }
    assert set(ids.values()) == {"x86_64-test-gcc-12 (Test 12.2.0-14) 12.2.0"}, ids
    # A compiler whose line does not start with its name keeps the line as written.
    assert tools.compiler_identity("cc", "Debian clang version 14.0.6\nTarget: x") == (
        "Debian clang version 14.0.6"
    )
    assert tools.compiler_identity("cc", None) is None


@pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("cc") is None, reason="no gcc")
def test_cc_and_gcc_probe_to_the_same_key_when_they_are_one_binary() -> None:
    """On this machine ``cc`` is GCC through alternatives: the probe's key agrees."""
    if os.path.realpath(shutil.which("cc") or "") != os.path.realpath(shutil.which("gcc") or ""):
        pytest.skip("cc and gcc are different binaries here")
    seen = {}
    for cc in ("cc", "gcc"):
        env = {"PATH": os.environ.get("PATH", ""), "CC": cc}
        raw = probing.PendingProbe(use_nvml=False, environ=env, cache=ProbeCache(None)).result()
        seen[cc] = raw["compilers"]["cc"]
    assert seen["cc"] == seen["gcc"] and seen["cc"] is not None, seen


def test_the_probe_asks_the_nvcc_the_jit_libraries_run(tmp_path: Path) -> None:
    """``$CUDA_HOME/bin/nvcc`` first, as SGLang, TileLang and DeepGEMM find it; ``PATH`` after.

    A pod image whose ``CUDA_HOME`` names another toolkit than the ``nvcc`` on its
    ``PATH`` compiles (and keys its SGLang and DeepGEMM JIT caches) with the former.
    """
    on_path = fake_toolkit(tmp_path / "path-cuda", "13.0.88")
    home = fake_toolkit(tmp_path / "cuda-12.8", "12.8.93")
    cuda_path = fake_toolkit(tmp_path / "cuda-path", "12.9.41")
    path = os.pathsep.join([str(on_path / "bin"), os.environ.get("PATH", "")])

    def nvcc(**env: str) -> str | None:
        environ = {"PATH": path, **env}
        assert tools.nvcc_path(environ).endswith("/bin/nvcc")
        raw = probing.PendingProbe(use_nvml=False, environ=environ, cache=ProbeCache(None))
        release: str | None = raw.result()["cuda"]["nvcc"]
        return release

    assert nvcc() == "13.0.88"
    assert nvcc(CUDA_HOME=str(home)) == "12.8.93"
    assert nvcc(CUDA_PATH=str(cuda_path)) == "12.9.41"
    assert nvcc(CUDA_HOME=str(home), CUDA_PATH=str(cuda_path)) == "12.8.93"
    assert nvcc(CUDA_HOME="", CUDA_PATH=str(cuda_path)) == "12.9.41"  # empty is unset
    # A CUDA_HOME without nvcc: the JIT finds none either (no falling back to PATH).
    assert nvcc(CUDA_HOME=str(tmp_path / "empty")) is None
    assert tools.nvcc_path({"PATH": str(tmp_path / "nothing")}) == "/usr/local/cuda/bin/nvcc"
    assert probing.PROBED_ENV["CUDA_HOME"] == probing.PROBED_ENV["CUDA_PATH"] == "cuda.nvcc"


def test_a_background_probe_that_fails_raises_on_the_callers_thread() -> None:
    """The NVML probe runs on a thread: its error reaches the caller, not the thread's stderr."""
    bg = probing._Background()

    def broken() -> None:
        raise OSError("NVML: driver/library version mismatch")

    bg.start("nvml", broken)
    with pytest.raises(OSError, match="version mismatch"):
        bg.results()
