"""TileLang proven on its real producer, both cache layouts: 0.1.15 and 0.1.12 (SGLang's pin).

``tilelang.compile`` (``tests/engines/tilelang_op.py``: one kernel, target
``{"kind": "cuda", "arch": "sm_90a"}``, the ``tvm_ffi`` backend, ``CUDA_HOME``
set) runs nvcc and the host compiler under root A (one HOME, TMPDIR, user and
``TILELANG_CACHE_DIR``) and publishes the entry: 0.1.15's layout
(``manifest.json``, ``params.json``, ``cuda-binaries/<key>/``) or 0.1.12's
(``params.pkl``, a flat ``cuda-binaries/<key>.cubin``). ``artifactd harvest``
packs it into a local OCI layout; ``artifactd restore`` installs it under root
B (another HOME, TMPDIR and user, as a pod has); the same kernel compiled there
starts no process (counted by an audit hook installed before TileLang is
imported: :mod:`spawns`) and writes no file under the restored dir;
``artifactd status`` says ``used``. Then a machine with another TileLang
release misses the family, the field named. No GPU: the kernel is never
launched (only a GPU shows that the cubin runs).

TileLang 0.1.15 comes from the ``tilelang-jit`` extra; 0.1.12 (which needs
apache-tvm-ffi <= 0.1.11, the pin of that extra) is installed with
``pip install --no-deps --target .artifactd/producers/tilelang-0.1.12`` and put
first on ``PYTHONPATH``. ``scripts/setup.sh --tests`` does both.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import PYTHON, REPO, clean_env, run_artifactd
from producer_checks import beyond_lookups, restored_at, written_since

from artifactd.restore.envfile import parse_env_file

pytestmark = [pytest.mark.slow, pytest.mark.torch]

CUDA_HOME = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
PRODUCER = Path(__file__).resolve().parent / "engines" / "tilelang_op.py"
#: Where scripts/setup.sh --tests installs the older release (--target, --no-deps).
OLD_RELEASE = REPO / ".artifactd" / "producers" / "tilelang-0.1.12"
#: The files TileLang publishes per kernel entry with the tvm_ffi backend, by release.
ENTRY_FILES = {
    "0.1.15": {"device_kernel.cu", "host_kernel.cu", "params.json", "manifest.json"},
    "0.1.12": {"device_kernel.cu", "host_kernel.cu", "params.pkl"},
}
LIBRARY = "executable.so"

if shutil.which("nvcc") is None and not (Path(CUDA_HOME) / "bin" / "nvcc").exists():
    pytest.skip(f"no CUDA toolkit at {CUDA_HOME} (bin/nvcc)", allow_module_level=True)


def _pythonpath(version: str) -> str | None:
    """The PYTHONPATH that makes ``version`` the TileLang imported, or None when it is absent."""
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if version == "0.1.12":
        if not (OLD_RELEASE / "tilelang").is_dir():
            return None
        return os.pathsep.join([str(OLD_RELEASE), *inherited])
    if importlib.util.find_spec("tilelang") is None:
        return None
    return os.pathsep.join(inherited)


def _env(
    root: Path, user: str, pythonpath: str, extra: dict[str, str] | None = None
) -> dict[str, str]:
    (root / "home").mkdir(parents=True, exist_ok=True)
    (root / "tmp").mkdir(parents=True, exist_ok=True)
    env = clean_env(
        {
            "HOME": str(root / "home"),
            "TMPDIR": str(root / "tmp"),
            "USER": user,
            "LOGNAME": user,
            "CUDA_HOME": CUDA_HOME,
            "PYTHONPATH": pythonpath,
        }
    )
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
    doc: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])["tilelang_op"]
    return doc


def _cli(*args: str, env: dict[str, str]) -> dict[str, Any]:
    proc = run_artifactd(*args, "--json", env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return doc


@pytest.mark.parametrize("version", ["0.1.15", "0.1.12"])
def test_a_tilelang_kernel_restored_under_another_root_compiles_nothing(
    version: str, tmp_path: Path
) -> None:
    pythonpath = _pythonpath(version)
    if pythonpath is None:
        pytest.skip(
            f"TileLang {version} is not installed (scripts/setup.sh --tests: the tilelang-jit "
            f"extra, and {OLD_RELEASE.relative_to(REPO)} for 0.1.12)"
        )
    cache_a = tmp_path / "a" / "tilelang-cache"
    env_a = _env(tmp_path / "a", "builder", pythonpath, {"TILELANG_CACHE_DIR": str(cache_a)})
    cold = _produce(env_a, tmp_path / "a" / "cwd")
    assert cold["version"] == version
    compilers = {Path(argv[0]).name for argv in cold["started"]}
    assert "nvcc" in compilers, cold["started"]  # the count sees a compile
    (entry,) = (cache_a / version).glob("*/kernels/*")
    assert ENTRY_FILES[version] | {LIBRARY} <= {p.name for p in entry.iterdir()}
    assert list((cache_a / version / "cuda-binaries").iterdir()), "the cubin is published"

    store = f"oci:{tmp_path / 'store'}"
    harvested = _cli(
        "harvest", "--store", store, "--family", "tilelang", "--gpu-arch", "sm_90a", env=env_a
    )
    (fam,) = harvested["families"]
    assert fam["family"] == "tilelang" and fam["files"] >= len(ENTRY_FILES[version]) + 2
    assert fam["skipped"] <= 3  # the empty .staging/ dirs (and 0.1.12's tmp/), left out

    root_b = tmp_path / "pod"
    env_b = _env(tmp_path / "b", "pod-user", pythonpath)
    report = _cli(
        "restore", "--store", store, "--target", str(root_b), "--gpu-arch", "sm_90a", env=env_b
    )
    assert report["restored"] == ["tilelang"] and report["cache_hit"]
    warm_env = {**env_b, **parse_env_file(root_b / "artifactd.env")}
    cache_b = Path(warm_env["TILELANG_CACHE_DIR"])
    assert cache_b.is_relative_to(root_b)

    warm = _produce(warm_env, tmp_path / "b" / "cwd")
    assert beyond_lookups(warm["started"]) == [], "TileLang compiled again under the pod's root"
    assert warm["source"] == cold["source"]
    assert written_since(cache_b, restored_at(root_b)) == []
    status = _cli("status", "--target", str(root_b), env=warm_env)
    (verdict,) = [f for f in status["families"] if f["family"] == "tilelang"]
    assert verdict["verdict"] == "used", verdict

    # A machine with another TileLang release: the family misses, the field named.
    other = _cli(
        "restore",
        "--store",
        store,
        "--target",
        str(tmp_path / "other"),
        "--gpu-arch",
        "sm_90a",
        "--family",
        "tilelang",
        "--set",
        "libraries.tilelang.version=0.1.14",
        env=env_b,
    )
    assert other["cache_hit"] is False
    (miss,) = [f for f in other["plan"]["families"] if f["family"] == "tilelang"]
    assert miss["verdict"] == "miss"
    assert [d["path"] for d in miss["deciding"]] == ["libraries.tilelang.version"]
    print(
        f"TileLang {version}: cold compile {cold['compile_s']:.1f} s, warm {warm['compile_s']:.3f}"
        f" s, {fam['files']} files"
    )
