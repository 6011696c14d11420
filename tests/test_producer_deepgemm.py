"""DeepGEMM as SGLang installs it (sgl-deep-gemm 0.2.3.post2) on its real producer.

No GPU here: ``tests/fakecuda.py`` builds a fake sm_90 device (stub CUDA libraries, a
logging nvcc) and ``tests/engines/deepgemm_op.py`` relabels CPU tensors ``cuda:0``. That
is a HARNESS: it proves DeepGEMM's cache and its real code generation, never a kernel
run. What is real: sgl-deep-gemm's ``_C.so`` (its heuristics, its code generator, its
deep_jit cache with its own key) and nvcc, which compiles ``transpose_fp32`` and
``sm90_fp8_gemm_1d2d`` for sm_90a into ``$HOME/.dj/cache/<name>.<digest>/``.

Built as ``builder`` under one HOME, harvested, restored as ``poduser`` under another
root, whose nvcc is only under ``CUDA_HOME`` (not on ``PATH``; the fingerprint asks the
nvcc DeepGEMM runs, so the family still matches); the same GEMM there compiles
nothing: nvcc ran only for ``--version`` (deep_jit's key holds its whole output, read at
every start), the only files written are the two ``.committed`` markers deep_jit touches
on a hit (the family's listed load rewrite), and ``artifactd status`` says ``used``. A
pod with another nvcc misses the family, the field named. Before any of it, ``artifactd
lint`` finds only warnings: the build paths in ``meta.json`` are never read back.

Needs sgl-deep-gemm (the ``deepgemm-jit`` extra; ``scripts/setup.sh --tests`` installs it
``--no-deps``), gcc, and a CUDA toolkit with nvcc and its headers (``CUDA_HOME``, else
``/usr/local/cuda``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import PYTHON, clean_env, run_artifactd, run_artifactd_json
from fakecuda import build_fake_cuda

from artifactd.families.layouts import DEEPGEMM_META_COST
from artifactd.pod.verdict import wait_past, written_after
from artifactd.restore.envfile import parse_env_file

CUDA_HOME = Path(os.environ.get("CUDA_HOME") or "/usr/local/cuda")
PRODUCER = Path(__file__).resolve().parent / "engines" / "deepgemm_op.py"
ARCH = "sm_90a"
KERNELS = ["sm90_fp8_gemm_1d2d", "transpose_fp32"]
ENTRY = [".committed", "kernel.cu", "kernel.cubin", "meta.json"]
#: ELF machine of CUDA binaries.
EM_CUDA = 190

pytestmark = [
    pytest.mark.slow,
    pytest.mark.torch,
    pytest.mark.skipif(
        importlib.util.find_spec("deep_gemm") is None,
        reason="sgl-deep-gemm is not importable: install the deepgemm-jit extra "
        "(scripts/setup.sh --tests)",
    ),
    pytest.mark.skipif(
        not (CUDA_HOME / "include" / "cuda_runtime_api.h").is_file()
        or shutil.which("nvcc", path=str(CUDA_HOME / "bin")) is None
        or shutil.which("gcc") is None,
        reason=f"needs gcc and a CUDA toolkit at {CUDA_HOME} (bin/nvcc, include/)",
    ),
]


def env_for(root: Path, user: str, fake: dict[str, str]) -> dict[str, str]:
    """A process environment of its own: HOME, TMPDIR and user under ``root``, the fake device."""
    (root / "home").mkdir(parents=True, exist_ok=True)
    (root / "tmp").mkdir(exist_ok=True)
    env = clean_env({"HOME": str(root / "home"), "TMPDIR": str(root / "tmp"), **fake})
    env.update({"USER": user, "LOGNAME": user})
    return env


def without_nvcc(env: dict[str, str]) -> dict[str, str]:
    """``env`` with no nvcc on its PATH: the toolkit is only where ``CUDA_HOME`` says."""
    path = env.get("PATH", "").split(os.pathsep)
    kept = [d for d in path if d and not os.access(os.path.join(d, "nvcc"), os.X_OK)]
    return env | {"PATH": os.pathsep.join(kept)}


def produce(env: dict[str, str]) -> dict[str, Any]:
    proc = subprocess.run(
        [PYTHON, str(PRODUCER)], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])["deepgemm_op"]
    return report


def entries(cache: Path) -> dict[str, list[str]]:
    """Kernel name -> the files of its entry dir, for every ``cache/<name>.<digest>/``."""
    return {
        d.name.split(".", 1)[0]: sorted(p.name for p in d.iterdir())
        for d in sorted((cache / "cache").iterdir())
    }


def cubin_sm(cubin: Path) -> tuple[int, int]:
    """The ELF machine and SM number of a cubin: e_flags bits 8-15 in CUDA 13's ELF ABI
    (OS ABI 0x41 in e_ident), the low byte before it. The ``a`` of sm_90a is not in
    e_flags; nvcc's command line says it."""
    elf = cubin.read_bytes()
    assert elf[:4] == b"\x7fELF"
    flags: int = struct.unpack_from("<I", elf, 48)[0]
    sm = (flags >> 8) & 0xFF if elf[7] == 0x41 else flags & 0xFF
    return struct.unpack_from("<H", elf, 18)[0], sm


def test_deepgemm_kernels_restored_under_another_root_are_not_compiled_again(
    tmp_path: Path,
) -> None:
    fake = build_fake_cuda(tmp_path / "fake", CUDA_HOME)
    nvcc_log = tmp_path / "fake" / "nvcc.log"
    env_a = env_for(tmp_path / "a", "builder", fake)
    cold = produce(env_a)
    cache_a = tmp_path / "a" / "home" / ".dj"
    assert entries(cache_a) == dict.fromkeys(KERNELS, ENTRY)
    runs = nvcc_log.read_text().splitlines()
    assert runs[0] == "--version" and len(runs) == 3, runs
    assert all("--gpu-architecture=sm_90a" in r and "--cubin" in r for r in runs[1:]), runs
    for cubin in (cache_a / "cache").glob("*/kernel.cubin"):
        assert cubin_sm(cubin) == (EM_CUDA, 90), cubin
    assert not any((cache_a / "tmp").iterdir()), "deep_jit renamed its staging dirs away"
    # meta.json names the staging dir and site-packages; deep_jit never reads it back.
    meta = json.loads(next((cache_a / "cache").glob("sm90_*/meta.json")).read_text())
    assert str(cache_a / "tmp") in meta["command"]
    linted = run_artifactd("lint", "--family", "deepgemm", "--json", env=env_a)
    assert linted.returncode == 0, linted.stdout + linted.stderr[-2000:]
    findings = json.loads(linted.stdout)["findings"]
    assert findings and {(f["severity"], Path(f["file"]).name) for f in findings} == {
        ("warning", "meta.json")
    }, findings
    assert {f["cost"] for f in findings if f["kind"] == "absolute-path"} == {DEEPGEMM_META_COST}

    store = f"oci:{tmp_path / 'store'}"
    harvested = run_artifactd_json(
        "harvest", "--store", store, "--family", "deepgemm", "--gpu-arch", ARCH, env=env_a
    )
    (fam,) = harvested["families"]
    assert (fam["family"], fam["files"]) == ("deepgemm", 8), fam

    root_b = tmp_path / "pod"
    # The pod's nvcc is only under CUDA_HOME, where DeepGEMM looks first (not on PATH).
    env_b = without_nvcc(env_for(tmp_path / "b", "poduser", fake))
    report = run_artifactd_json(
        "restore", "--store", store, "--target", str(root_b), "--gpu-arch", ARCH, env=env_b
    )
    assert report.get("restored") == ["deepgemm"] and report["cache_hit"], report
    (plan,) = [f for f in report["plan"]["families"] if f["family"] == "deepgemm"]
    assert plan["layer"]["pinned_paths"] == [str(Path(cold["deep_gemm"]).parent)]
    restored = parse_env_file(root_b / "artifactd.env")
    cache_b = Path(restored["DG_JIT_CACHE_DIR"])
    assert cache_b.is_relative_to(root_b) and entries(cache_b) == dict.fromkeys(KERNELS, ENTRY)
    marker = root_b / ".artifactd" / "restored.json"
    since = max(json.loads(marker.read_text())["restored_at"], marker.stat().st_mtime)
    ran_before = len(nvcc_log.read_text().splitlines())
    wait_past(cache_b, since)  # what the GEMM writes gets a later mtime than the restore's

    warm = produce({**env_b, **restored})
    assert nvcc_log.read_text().splitlines()[ran_before:] == ["--version"]
    written = sorted(
        p.relative_to(cache_b).as_posix()
        for p in cache_b.rglob("*")
        if p.is_file() and written_after(p.stat(), since)
    )
    assert [Path(p).name for p in written] == [".committed", ".committed"], written
    assert not (cache_b / "tmp").exists(), "a hit stages nothing"
    status = run_artifactd_json("status", "--target", str(root_b), env={**env_b, **restored})
    (verdict,) = [f for f in status["families"] if f["family"] == "deepgemm"]
    assert verdict["verdict"] == "used", verdict

    # A pod whose nvcc is another release: deep_jit keys on nvcc's --version, so a miss.
    other = run_artifactd_json(
        "restore",
        "--store",
        store,
        "--target",
        str(tmp_path / "other"),
        "--gpu-arch",
        ARCH,
        "--set",
        "cuda.nvcc=12.9.86",
        env=env_b,
    )
    assert other["cache_hit"] is False
    (miss,) = [f for f in other["plan"]["families"] if f["family"] == "deepgemm"]
    assert miss["verdict"] == "miss"
    assert [d["path"] for d in miss["deciding"]] == ["cuda.nvcc"]
    print(f"cold {cold['seconds']:.1f} s, warm {warm['seconds']:.3f} s, {fam['files']} files")
