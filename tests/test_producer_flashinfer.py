"""FlashInfer proven on its real producer: flashinfer-python 0.7.2's own JIT.

``gen_act_and_mul_module("silu").build()`` runs nvcc for sm_90a
(``FLASHINFER_CUDA_ARCH_LIST=9.0a``) and ninja under root A (one HOME, TMPDIR
and user); ``artifactd harvest`` packs the workspace into a local OCI layout;
``artifactd restore`` installs it under root B, another HOME, TMPDIR and user
name, as a pod has; the op is built again there with B's environment and
ninja has no work (its own ``-n -d explain`` verdict, and no file under the
restored dir newer than the restore); ``artifactd status`` says ``used``.
Then a machine differing in one scoped field (``--set``) misses, the field
named. No GPU is needed: the link step's ``-lcuda`` is satisfied by an empty
stub library built here (nothing loads it); nothing else stands in.

Needs the ``flashinfer-jit`` extra (pyproject.toml; ``scripts/setup.sh --tests``
installs it), nvcc and a CUDA toolkit with ``lib64/libcudart.so`` (``CUDA_HOME``, else
``/usr/local/cuda``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import PYTHON, clean_env, run_artifactd

from artifactd.restore.envfile import parse_env_file

pytestmark = pytest.mark.slow

CUDA_HOME = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
if importlib.util.find_spec("flashinfer") is None:
    pytest.skip(
        "flashinfer-python is not importable: install the flashinfer-jit extra "
        "(scripts/setup.sh --tests)",
        allow_module_level=True,
    )
if not (Path(CUDA_HOME) / "lib64" / "libcudart.so").exists() or shutil.which("nvcc") is None:
    pytest.skip(
        f"no CUDA toolkit at {CUDA_HOME} (nvcc, lib64/libcudart.so)", allow_module_level=True
    )

#: Builds the op in the process's environment; prints ninja's dry-run verdict and timings.
PRODUCER = textwrap.dedent(
    """
    import json, subprocess, sys, time
    t0 = time.monotonic()
    from flashinfer.jit.activation import gen_act_and_mul_module
    spec = gen_act_and_mul_module("silu")
    explain = None
    if spec.ninja_path.exists():
        spec.write_ninja()  # as build() does first: FlashInfer's own file for this root
        dry = subprocess.run(
            ["ninja", "-n", "-d", "explain", "-C", str(spec.build_dir), "-f", str(spec.ninja_path)],
            capture_output=True, text=True,
        )
        explain = dry.stdout + dry.stderr
    t1 = time.monotonic()
    spec.build()
    print(json.dumps({"build_s": time.monotonic() - t1, "import_s": t1 - t0,
                      "explain": explain, "so": str(spec.jit_library_path)}))
    """
)


def _env(root: Path, user: str, stubs: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    (root / "home").mkdir(parents=True, exist_ok=True)
    (root / "tmp").mkdir(parents=True, exist_ok=True)
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    env = clean_env(
        {
            "HOME": str(root / "home"),
            "TMPDIR": str(root / "tmp"),
            "USER": user,
            "LOGNAME": user,
            "PATH": path,  # the venv's ninja (the flashinfer-jit extra) first
            "CUDA_HOME": CUDA_HOME,
            "FLASHINFER_CUDA_ARCH_LIST": "9.0a",
            "FLASHINFER_EXTRA_LDFLAGS": f"-L{stubs}",
        }
    )
    env.pop("FLASHINFER_WORKSPACE_BASE", None)
    env.update(extra or {})
    return env


def _produce(env: dict[str, str]) -> dict[str, Any]:
    proc = subprocess.run(
        [PYTHON, "-c", PRODUCER], env=env, capture_output=True, text=True, timeout=900, check=False
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    doc: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return doc


def _cli(*args: str, env: dict[str, str]) -> dict[str, Any]:
    proc = run_artifactd(*args, "--json", env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return doc


def _libcuda_stub(tmp_path: Path) -> Path:
    """Return a dir holding an empty ``libcuda.so``: the link's ``-lcuda`` on a machine
    without a driver (nothing loads it)."""
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    subprocess.run(
        ["gcc", "-shared", "-x", "c", "-", "-o", str(stubs / "libcuda.so")],
        input="void cuInit(void) {}\n",
        text=True,
        check=True,
    )
    return stubs


def _written_since(cache: Path, since: float) -> list[str]:
    """Names of the files under ``cache`` (its ``tmp/`` left out) written at or after ``since``."""
    return [
        p.name
        for p in cache.rglob("*")
        if p.is_file() and p.stat().st_mtime >= since and "tmp" not in p.relative_to(cache).parts
    ]


def test_flashinfer_op_restored_under_another_root_is_not_rebuilt(tmp_path: Path) -> None:
    stubs = _libcuda_stub(tmp_path)
    env_a = _env(tmp_path / "a", "builder", stubs)
    cold = _produce(env_a)
    so_a = Path(cold["so"])
    assert so_a.is_file() and str(tmp_path / "a" / "home") in cold["so"]

    store = f"oci:{tmp_path / 'store'}"
    harvested = _cli(
        "harvest", "--store", store, "--family", "flashinfer", "--gpu-arch", "sm_90a", env=env_a
    )
    (fam,) = harvested["families"]
    assert fam["family"] == "flashinfer" and fam["files"] >= 5

    root_b = tmp_path / "pod"
    env_b = _env(tmp_path / "b", "pod-user", stubs)
    before_restore = time.time()
    report = _cli(
        "restore", "--store", store, "--target", str(root_b), "--gpu-arch", "sm_90a", env=env_b
    )
    assert report["restored"] == ["flashinfer"] and report["cache_hit"]
    warm_env = {**env_b, **parse_env_file(root_b / "artifactd.env")}
    cache_b = root_b / "flashinfer-home" / ".cache" / "flashinfer"

    warm = _produce(warm_env)
    assert Path(warm["so"]).is_relative_to(cache_b)
    assert "ninja: no work to do" in warm["explain"], warm["explain"]
    assert "is dirty" not in warm["explain"]
    # Nothing written since the restore but what the family leaves out (the JIT log, locks).
    newer = _written_since(cache_b, before_restore)
    assert newer == ["flashinfer_jit.log"], newer
    status = _cli("status", "--target", str(root_b), env=warm_env)
    (verdict,) = [f for f in status["families"] if f["family"] == "flashinfer"]
    assert verdict["verdict"] == "used", verdict

    # A machine with another FlashInfer release: the family misses, the field named.
    other = _cli(
        "restore",
        "--store",
        store,
        "--target",
        str(tmp_path / "other"),
        "--gpu-arch",
        "sm_90a",
        "--family",
        "flashinfer",
        "--set",
        "libraries.flashinfer-python.version=0.7.1",
        env=env_b,
    )
    assert other["cache_hit"] is False
    (miss,) = [f for f in other["plan"]["families"] if f["family"] == "flashinfer"]
    assert miss["verdict"] == "miss"
    assert [d["path"] for d in miss["deciding"]] == ["libraries.flashinfer-python.version"]
    print(f"cold {cold['build_s']:.1f} s, warm {warm['build_s']:.3f} s, {fam['files']} files")


def test_a_flashinfer_tree_sglang_hosts_is_not_rebuilt_under_another_root(tmp_path: Path) -> None:
    """SGLang points FlashInfer's workspace base at its own cache dir: the sglang family ships it.

    The same real op, built under SGLang's cache dir on root A and harvested as the
    ``sglang`` family's ``cache`` component, restored under root B (another user),
    where FlashInfer's base is the restored SGLang cache: ninja has no work.
    """
    stubs = _libcuda_stub(tmp_path)
    sglang_a = tmp_path / "a" / "sglang-cache"
    sglang_a.mkdir(parents=True)
    env_a = _env(
        tmp_path / "a",
        "builder",
        stubs,
        {"SGLANG_CACHE_DIR": str(sglang_a), "FLASHINFER_WORKSPACE_BASE": str(sglang_a)},
    )
    cold = _produce(env_a)
    assert Path(cold["so"]).is_relative_to(sglang_a / ".cache" / "flashinfer")

    store = f"oci:{tmp_path / 'store'}"
    harvested = _cli(
        "harvest", "--store", store, "--family", "sglang", "--gpu-arch", "sm_90a", env=env_a
    )
    (fam,) = harvested["families"]
    assert fam["family"] == "sglang" and fam["files"] >= 5

    root_b = tmp_path / "pod"
    env_b = _env(tmp_path / "b", "pod-user", stubs)
    before_restore = time.time()
    report = _cli(
        "restore", "--store", store, "--target", str(root_b), "--gpu-arch", "sm_90a", env=env_b
    )
    assert report["restored"] == ["sglang"] and report["cache_hit"]
    restored = parse_env_file(root_b / "artifactd.env")
    # As SGLang does: FlashInfer's workspace base is SGLang's cache dir.
    warm_env = {
        **env_b,
        **restored,
        "FLASHINFER_WORKSPACE_BASE": restored["SGLANG_CACHE_DIR"],
    }
    cache_b = Path(restored["SGLANG_CACHE_DIR"]) / ".cache" / "flashinfer"

    warm = _produce(warm_env)
    assert Path(warm["so"]).is_relative_to(cache_b)
    assert "ninja: no work to do" in warm["explain"], warm["explain"]
    newer = _written_since(cache_b, before_restore)
    assert newer == ["flashinfer_jit.log"], newer
    status = _cli("status", "--target", str(root_b), env=warm_env)
    (verdict,) = [f for f in status["families"] if f["family"] == "sglang"]
    assert verdict["verdict"] == "used", verdict
