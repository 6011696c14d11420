"""SGLang's JIT kernels proven on their real producer: sglang 0.5.23's ``load_jit``.

``activation_module(torch.bfloat16)`` under SGLang's own
``override_jit_cuda_arch(9, 0)`` (``tests/engines/sglang_jit_op.py``) runs
``nvcc --version`` and ``c++ --version`` (its key), then ninja (nvcc for
sm_90a, the link) under root A, and publishes
``<sm90a>/<module>/build-<key>/deps-<key>/``. ``artifactd harvest`` packs
``SGLANG_JIT_CACHE_DIR`` into a local OCI layout; ``artifactd restore``
installs it under root B (another HOME, TMPDIR and user, as a pod has), whose
image has nvcc only where ``CUDA_HOME`` says, not on ``PATH``, where SGLang
finds it. The module loaded there starts only the two ``--version`` runs, no
build, and writes no file under the restored dir (SGLang bumps the leaf dir's
mtime: a directory, not a file); ``artifactd status`` says ``used``. Then a
pod image with no nvcc, and one with another nvcc, miss the family with
``cuda.nvcc`` named, by ``restore`` and by ``diff``. No GPU: the module is
loaded, never launched (only a GPU shows the kernels run).

The producer is installed by ``scripts/setup.sh --tests``: the ``sglang-jit``
extra (sglang 0.5.23 and the modules its import chain needs, nothing else)
with ``pip install --no-deps --target .artifactd/producers/sglang-0.5.23``, put
on ``PYTHONPATH`` here; apache-tvm-ffi 0.1.11 (SGLang's pin) and ninja come
from the ``tilelang-jit`` and ``flashinfer-jit`` extras in the venv.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import PYTHON, REPO, clean_env, run_artifactd
from producer_checks import beyond_lookups, fake_toolkit, restored_at, written_since

from artifactd.restore.envfile import parse_env_file

pytestmark = [pytest.mark.slow, pytest.mark.torch]

CUDA_HOME = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
PRODUCER = Path(__file__).resolve().parent / "engines" / "sglang_jit_op.py"
#: Where scripts/setup.sh --tests installs SGLang (--target, --no-deps).
SGLANG = REPO / ".artifactd" / "producers" / "sglang-0.5.23"
NVCC = Path(CUDA_HOME) / "bin" / "nvcc"

if not (SGLANG / "sglang").is_dir():
    pytest.skip(
        f"SGLang 0.5.23 is not installed in {SGLANG.relative_to(REPO)} (scripts/setup.sh --tests)",
        allow_module_level=True,
    )
if importlib.util.find_spec("tvm_ffi") is None or shutil.which("ninja") is None:
    pytest.skip("apache-tvm-ffi or ninja missing (the tilelang-jit extra)", allow_module_level=True)
if not NVCC.exists() or shutil.which("c++") is None:
    pytest.skip(f"no CUDA toolkit at {CUDA_HOME} (bin/nvcc), or no c++", allow_module_level=True)


def _pod_path() -> str:
    """A PATH with the venv (ninja), ``c++`` and ``sh``, and no directory holding an nvcc."""
    dirs = [os.path.dirname(sys.executable), "/usr/bin", "/bin"]
    assert not any(Path(d, "nvcc").exists() for d in dirs), dirs
    return os.pathsep.join(dirs)


def _env(root: Path, user: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    (root / "home").mkdir(parents=True, exist_ok=True)
    (root / "tmp").mkdir(parents=True, exist_ok=True)
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = clean_env(
        {
            "HOME": str(root / "home"),
            "TMPDIR": str(root / "tmp"),
            "USER": user,
            "LOGNAME": user,
            "PYTHONPATH": os.pathsep.join([str(SGLANG), *inherited]),
        }
    )
    for var in ("CUDA_HOME", "CUDA_PATH", "CXX"):
        env.pop(var, None)
    env.update(extra or {})
    return env


def _produce(env: dict[str, str], cwd: Path) -> dict[str, Any]:
    cwd.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [PYTHON, str(PRODUCER)],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    doc: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])["sglang_jit_op"]
    return doc


def _cli(*args: str, env: dict[str, str], ok: tuple[int, ...] = (0,)) -> dict[str, Any]:
    proc = run_artifactd(*args, "--json", env=env, timeout=300)
    assert proc.returncode in ok, proc.stderr[-3000:]
    doc: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return doc


def test_an_sglang_jit_module_restored_under_another_root_is_not_rebuilt(tmp_path: Path) -> None:
    jit_a = tmp_path / "a" / "sglang-jit"
    env_a = _env(
        tmp_path / "a",
        "builder",
        {"SGLANG_JIT_CACHE_DIR": str(jit_a), "CUDA_HOME": CUDA_HOME, "PATH": _pod_path()},
    )
    cold = _produce(env_a, tmp_path / "a" / "cwd")
    ran = [Path(argv[0]).name for argv in cold["started"]]
    assert "ninja" in ran, cold["started"]  # the count sees a build
    (leaf,) = cold["leaves"]
    module = leaf.split("/")[1]
    assert leaf.startswith("sm90a/") and (jit_a / leaf / f"{module}.so").is_file()

    store = f"oci:{tmp_path / 'store'}"
    harvested = _cli(
        "harvest", "--store", store, "--family", "sglang", "--gpu-arch", "sm_90a", env=env_a
    )
    (fam,) = harvested["families"]
    assert fam["family"] == "sglang" and fam["found"]["jit"] == str(jit_a)
    built = _cli("fingerprint", "--gpu-arch", "sm_90a", env=env_a)["fingerprint"]["cuda"]["nvcc"]
    assert built, "the build's nvcc, the one SGLang ran (CUDA_HOME's), is in the fingerprint"

    # The pod: another root and user; nvcc where CUDA_HOME says, none on PATH.
    root_b = tmp_path / "pod"
    env_b = _env(tmp_path / "b", "pod-user", {"CUDA_HOME": CUDA_HOME, "PATH": _pod_path()})
    report = _cli(
        "restore", "--store", store, "--target", str(root_b), "--gpu-arch", "sm_90a", env=env_b
    )
    assert report["cache_hit"] and "sglang" in report["restored"], report["plan"]
    warm_env = {**env_b, **parse_env_file(root_b / "artifactd.env")}
    jit_b = Path(warm_env["SGLANG_JIT_CACHE_DIR"])
    assert (jit_b / leaf / f"{module}.so").is_file()

    warm = _produce(warm_env, tmp_path / "b" / "cwd")
    # Only SGLang's key: nvcc --version (CUDA_HOME's) and c++ --version; no ninja, no nvcc build.
    assert sorted(beyond_lookups(warm["started"])) == sorted(
        [[str(NVCC), "--version"], ["c++", "--version"]]
    ), warm["started"]
    assert warm["leaves"] == [leaf]
    assert written_since(jit_b, restored_at(root_b)) == []
    status = _cli("status", "--target", str(root_b), env=warm_env)
    (verdict,) = [f for f in status["families"] if f["family"] == "sglang"]
    assert verdict["verdict"] == "used", verdict

    # A pod image with no nvcc at all, and one with another: SGLang's key differs, the family
    # misses with cuda.nvcc named, by restore's plan and by diff.
    no_nvcc = {**env_b, "CUDA_HOME": str(tmp_path / "no-toolkit")}
    other_nvcc = {**env_b, "CUDA_HOME": str(fake_toolkit(tmp_path / "cuda-12.8", "12.8.93"))}
    artifact = f"{store}:{harvested['tags'][0]}"
    for env, seen in ((no_nvcc, None), (other_nvcc, "12.8.93")):
        planned = _cli(
            "restore",
            "--store",
            store,
            "--target",
            str(tmp_path / "other"),
            "--gpu-arch",
            "sm_90a",
            "--family",
            "sglang",
            "--dry-run",
            env=env,
        )
        (miss,) = planned["plan"]["families"]
        assert miss["verdict"] == "miss", miss
        assert miss["deciding"] == [{"path": "cuda.nvcc", "a": built, "b": seen}]
        diffed = _cli(
            "diff",
            artifact,
            "local",
            "--gpu-arch",
            "sm_90a",
            "--family",
            "sglang",
            env=env,
            ok=(1,),
        )
        (fam_diff,) = diffed["families"]
        assert fam_diff["verdict"] == "miss"
        assert [d["path"] for d in fam_diff["deciding"]] == ["cuda.nvcc"]
    print(
        f"SGLang JIT: cold {cold['load_s']:.1f} s, warm {warm['load_s']:.3f} s,"
        f" {fam['files']} files"
    )
