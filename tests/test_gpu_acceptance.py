"""The GPU acceptance script (scripts/gpu-acceptance.sh) in its dry mode, here, without a GPU.

What runs here is real: nvcc compiles the PTX and the sm_90a cubin, Triton
compiles its kernels ahead of time for sm_90a, ``artifactd harvest``,
``restore`` and ``status`` run as processes on a local OCI layout, and the
restored warm-ups run with only the env file's variables. The steps that need
a GPU must say they were skipped and name what is missing. A failing step
(a wheels folder pip cannot install) must make the script exit 1 naming it.
Nothing is mocked but the GPU itself: the driver-API warm-ups (cuda-jit,
generic) run here against a libcuda double (``LIBCUDA_DOUBLE``), since this
machine has no driver. On a GPU host the dry run is forced by ``--dry-run``.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from conftest import GPU_HOST, PYTHON, REPO, clean_env

SCRIPT = REPO / "scripts" / "gpu-acceptance.sh"
SUMMARY = re.compile(
    r"^gpu-acceptance: (?P<ok>\d+) ok, (?P<failed>\d+) failed(?: \((?P<names>[^)]*)\))?, "
    r"(?P<skipped>\d+) skipped(?: \((?P<why>.*)\))? in \d+ s$"
)
#: Steps that need a GPU (or a package a GPU node gets through --wheels).
GPU_FAMILIES = (
    "cuda-jit",
    "inductor",
    "flashinfer",
    "cutedsl",
    "tilelang",
    "sglang",
    "deepgemm",
    "vllm",
)
#: The families whose warm-up needs an optional library: its distribution and module.
OPTIONAL = (
    ("flashinfer", "flashinfer-python", "flashinfer"),
    ("cutedsl", "nvidia-cutlass-dsl", "cutlass"),
    ("tilelang", "tilelang", "tilelang"),
    ("sglang", "sglang", "sglang"),
    ("deepgemm", "sgl-deep-gemm", "deep_gemm"),
    ("vllm", "vllm", "vllm"),
)
GPU_STEPS = (
    "gpu-probe",
    *(f"{w} {f}" for w in ("cold", "restored") for f in GPU_FAMILIES),
    "canary",
)
#: Steps that need no GPU: they must pass here.
HERE_STEPS = (
    "wheels",
    "environment",
    "nvcc-ptx",
    "cold generic",
    "cold triton",
    "harvest",
    "restore",
    "restored generic",
    "restored triton",
    "status",
)


def acceptance(out: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run the script as a maintainer would, with this suite's Python."""
    return subprocess.run(
        ["bash", str(SCRIPT), "--python", PYTHON, "--out", str(out), *args],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=timeout,
        check=False,
    )


def tiny_wheel(folder: Path) -> Path:
    """Write a real, installable wheel of one module (what a --wheels folder holds)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "acceptance_extra-1.0-py3-none-any.whl"
    files = {
        "acceptance_extra.py": b"VALUE = 42\n",
        # A path line in a .pth file, as CuTe DSL's wheel puts its packages on sys.path.
        "acceptance_extra.pth": b"acceptance_extra_lib\n",
        "acceptance_extra_lib/acceptance_lib.py": b"VALUE = 43\n",
        "acceptance_extra-1.0.dist-info/METADATA": (
            b"Metadata-Version: 2.1\nName: acceptance-extra\nVersion: 1.0\n"
        ),
        "acceptance_extra-1.0.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = "".join(f"{name},,\n" for name in files) + "acceptance_extra-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr("acceptance_extra-1.0.dist-info/RECORD", record)
    return path


def steps_of(out: Path) -> dict[str, dict[str, Any]]:
    report = json.loads((out / "report.json").read_text())
    return {s["name"]: s for s in report["steps"]}


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.parametrize("relocate", [False, True], ids=["same-path", "relocated"])
def test_dry_run_runs_what_needs_no_gpu_and_says_why_it_skipped_the_rest(
    tmp_path: Path, relocate: bool
) -> None:
    out = tmp_path / "acc"
    wheel = tiny_wheel(tmp_path / "wheels")
    flags = ["--relocate"] if relocate else []
    proc = acceptance(out, "--dry-run", "--wheels", str(wheel.parent), *flags)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    last = proc.stdout.strip().splitlines()[-1]
    summary = SUMMARY.match(last)
    assert summary, last
    assert summary["failed"] == "0"
    steps = steps_of(out)
    assert int(summary["ok"]) == sum(s["status"] == "ok" for s in steps.values())
    assert int(summary["skipped"]) == sum(s["status"] == "skipped" for s in steps.values())

    for name in HERE_STEPS:
        assert steps[name]["status"] == "ok", (name, steps[name]["reason"])
    # The extra wheel went into OUT/site, offline, and only there.
    assert steps["wheels"]["status"] == "ok"
    assert steps["wheels"]["data"]["wheels"] == [wheel.name]
    assert (out / "site" / "acceptance_extra.py").read_text() == "VALUE = 42\n"
    # OUT/site is no site dir: its .pth lines reach the commands through the script.
    site = out / "site"
    assert steps["wheels"]["data"]["paths"][:2] == [str(site), str(site / "acceptance_extra_lib")]
    if not GPU_HOST.driver:  # what is missing here, by name
        dry = "no GPU: no NVML (libnvidia-ml.so.1 not found: no NVIDIA driver)"
    else:
        dry = "dry run (--dry-run)"
    assert dry in summary["why"]
    # Every step is one of these: the ten families' cold and restored runs, no more.
    assert set(steps) == {*GPU_STEPS, *HERE_STEPS}
    for name in GPU_STEPS:
        assert steps[name]["status"] == "skipped", name
        assert steps[name]["reason"].startswith(dry), (name, steps[name]["reason"])
    # A missing optional library is named, by its distribution, where this Python lacks it.
    for family, dist, module in OPTIONAL:
        lacking = importlib.util.find_spec(module) is None
        named = f"{dist} is not installed"
        assert (named in steps[f"cold {family}"]["reason"]) == lacking, (family, lacking)
        assert (named in summary["why"]) == lacking, (family, lacking)

    # The cold runs compiled (the libraries say so, and wrote their caches) ...
    ptx = out / "work" / "axpy.compute_90.ptx"
    assert ".target sm_90" in ptx.read_text()
    assert steps["cold generic"]["data"]["report"]["compiled"] == 1
    assert steps["cold generic"]["data"]["files_written"]["generic"] == 1
    assert steps["cold triton"]["data"]["report"]["compiled"] == 3
    assert steps["cold triton"]["data"]["files_written"]["triton"] > 0
    assert set(steps["harvest"]["data"]["families"]) == {"generic", "triton"}
    assert any(t.startswith("fp-") for t in steps["harvest"]["data"]["tags"])
    # ... the restore installed the same cubin in a fresh root (the cold one moved aside,
    # or left where it was with --relocate, where Triton's group files are rewritten) ...
    cold_root = out / ("cache" if relocate else "cache-cold")
    restored_root = out / ("restored" if relocate else "cache")
    assert (restored_root / "artifactd.env").is_file()
    (cold_cubin,) = (cold_root / "generic").glob("*.sm_90a.cubin")
    (restored_cubin,) = (restored_root / "generic").glob("*.sm_90a.cubin")
    assert restored_cubin.name == cold_cubin.name
    assert restored_cubin.read_bytes() == cold_cubin.read_bytes()
    # ... and the restored runs compiled nothing, as the libraries and status say.
    restored_nvcc = steps["restored generic"]["data"]["report"]
    assert (restored_nvcc["compiled"], restored_nvcc["hits"]) == (0, 1)
    assert steps["restored triton"]["data"]["report"]["compiled"] == 0
    assert steps["restored triton"]["data"]["report"]["hits"] == 3
    assert steps["restored triton"]["data"]["files_written"] == {}
    assert steps["status"]["data"]["verdicts"] == {"generic": "used", "triton": "used"}
    for family in ("generic", "triton"):
        assert re.search(rf"^  {family} +[\d.]+ +[\d.]+ +\d+ +0$", proc.stdout, re.M), family


def test_a_wheels_folder_pip_cannot_install_fails_the_run_naming_the_step(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "broken-1.0-py3-none-any.whl").write_bytes(b"not a zip archive")
    out = tmp_path / "acc"
    proc = acceptance(out, "--wheels", str(wheels), "--dry-run", timeout=120)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    last = proc.stdout.strip().splitlines()[-1]
    summary = SUMMARY.match(last)
    assert summary, last
    assert (summary["ok"], summary["failed"], summary["names"]) == ("0", "1", "wheels")
    steps = steps_of(out)
    assert steps["wheels"]["status"] == "failed"
    # pip's own exit and its log, not a guess.
    assert re.match(r"exit [1-9]\d*: .*\(log: .*wheels\.log\)$", steps["wheels"]["reason"])
    assert "broken-1.0-py3-none-any.whl" in (out / "logs" / "wheels.log").read_text()
    # Nothing runs on a half-installed node: every later step says why.
    later = [s for name, s in steps.items() if name != "wheels"]
    assert later
    assert all((s["status"], s["reason"]) == ("skipped", "wheels failed") for s in later)


def test_a_wheels_path_that_is_no_folder_fails_at_once(tmp_path: Path) -> None:
    proc = acceptance(tmp_path / "acc", "--wheels", str(tmp_path / "absent"), timeout=120)
    assert proc.returncode == 1
    assert f"wheels               failed: --wheels {tmp_path / 'absent'} is not a directory" in (
        proc.stdout
    )
    assert (
        proc.stdout.strip().splitlines()[-1].startswith("gpu-acceptance: 0 ok, 1 failed (wheels)")
    )


def test_a_fixture_name_that_cannot_be_a_file_name_is_a_usage_error(tmp_path: Path) -> None:
    proc = acceptance(tmp_path / "acc", "--fixture", "../h200", timeout=60)
    assert proc.returncode == 2
    assert "argument --fixture: '../h200': use lowercase letters" in proc.stderr
    assert not (tmp_path / "acc").exists()


def test_a_python_that_is_not_there_is_a_usage_error(tmp_path: Path) -> None:
    proc = subprocess.run(
        ["bash", str(SCRIPT), "--python", str(tmp_path / "nopython"), "--dry-run"],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == "gpu-acceptance: no Python found (pass --python PATH)"
    assert not (tmp_path / "gpu-acceptance").exists()


#: A double of the few libcuda calls the warm-ups' ctypes ``Driver`` makes: it
#: stands in for the GPU and driver this machine cannot have. Memory is host
#: memory, and "launching" axpy computes it on the CPU from the kernel
#: parameters as the driver would receive them, so a wrong argument type, size
#: or order in the ctypes plumbing gives wrong values or an error code.
LIBCUDA_DOUBLE = r"""
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
typedef int CUresult;
static int inited, module, context;
CUresult cuInit(unsigned flags) { if (flags) return 1; inited = 1; return 0; }
CUresult cuDeviceGet(int *dev, int ordinal) {
    if (!inited) return 3; if (ordinal) return 101; *dev = 0; return 0; }
CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) {
    if (dev) return 101; *ctx = &context; return 0; }
CUresult cuCtxSetCurrent(void *ctx) { return ctx == &context ? 0 : 201; }
CUresult cuModuleLoadData(void **mod, const char *image) {
    /* PTX must name the entry; a cubin must be a CUDA ELF (machine 190). */
    if (memcmp(image, "\x7f" "ELF", 4) == 0) { if (*(uint16_t *)(image + 18) != 190) return 200; }
    else if (!strstr(image, ".entry axpy")) return 200;
    *mod = &module; return 0; }
CUresult cuModuleGetFunction(void **fn, void *mod, const char *name) {
    if (mod != &module) return 400; if (strcmp(name, "axpy")) return 500; *fn = &module; return 0; }
CUresult cuMemAlloc_v2(uint64_t *ptr, size_t size) {
    void *p = malloc(size); if (!p) return 2; *ptr = (uint64_t)(uintptr_t)p; return 0; }
CUresult cuMemFree_v2(uint64_t ptr) { free((void *)(uintptr_t)ptr); return 0; }
CUresult cuMemcpyHtoD_v2(uint64_t dst, const void *src, size_t n) {
    memcpy((void *)(uintptr_t)dst, src, n); return 0; }
CUresult cuMemcpyDtoH_v2(void *dst, uint64_t src, size_t n) {
    memcpy(dst, (void *)(uintptr_t)src, n); return 0; }
CUresult cuLaunchKernel(void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned shared, void *stream,
                        void **params, void **extra) {
    if (fn != &module || gy != 1 || gz != 1 || by != 1 || bz != 1 || shared || stream || extra)
        return 1;
    float a = *(float *)params[0];
    float *x = (float *)(uintptr_t)*(uint64_t *)params[1];
    float *y = (float *)(uintptr_t)*(uint64_t *)params[2];
    int n = *(int *)params[3];
    if ((uint64_t)gx * bx < (uint64_t)n) return 1;
    for (int i = 0; i < n; i++) y[i] = a * x[i] + y[i];
    return 0; }
CUresult cuCtxSynchronize(void) { return 0; }
CUresult cuGetErrorName(CUresult rc, const char **name) {
    *name = rc == 200 ? "CUDA_ERROR_INVALID_IMAGE" : "CUDA_ERROR_DOUBLE"; return 0; }
"""
WARMUP = REPO / "warmup_matrices" / "gpu-acceptance" / "warmup.py"


@pytest.mark.slow
def test_the_driver_api_warmups_pass_their_arguments_as_the_driver_reads_them(
    tmp_path: Path,
) -> None:
    """The cuda-jit and generic warm-ups against a libcuda double (no GPU here)."""
    lib = tmp_path / "lib"
    lib.mkdir()
    (tmp_path / "libcuda.c").write_text(LIBCUDA_DOUBLE)
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-o", str(lib / "libcuda.so.1"), str(tmp_path / "libcuda.c")],
        check=True,
    )
    ptx = tmp_path / "axpy.ptx"
    axpy = REPO / "warmup_matrices" / "cpu-demo" / "axpy.cu"
    subprocess.run(["nvcc", "--ptx", "-arch=compute_90", "-o", str(ptx), str(axpy)], check=True)
    env = clean_env(
        {
            "LD_LIBRARY_PATH": str(lib),
            "CUDA_CACHE_PATH": str(tmp_path / "cuda-jit"),
            "ARTIFACTD_GENERIC_DIR": str(tmp_path / "generic"),
        }
    )

    def warmup(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [PYTHON, str(WARMUP), *args], capture_output=True, text=True, env=env, timeout=120
        )

    jit = warmup("cuda-jit", "--ptx", str(ptx))
    assert jit.returncode == 0, jit.stderr
    assert json.loads(jit.stdout.splitlines()[-1])["modules"] == 1
    assert (tmp_path / "cuda-jit").is_dir()  # made for the driver, which fills it
    # The sm_90a cubin nvcc wrote is loaded and "launched" too.
    generic = warmup("generic", "--gpu")
    assert generic.returncode == 0, generic.stderr
    report = json.loads(generic.stdout.splitlines()[-1])
    assert (report["compiled"], report["launched"]) == (1, True)
    # A driver error is one line naming the call and the driver's error, no traceback.
    (tmp_path / "other.ptx").write_text(".version 8.0\n.target sm_90\n")
    bad = warmup("cuda-jit", "--ptx", str(tmp_path / "other.ptx"))
    assert bad.returncode == 1
    assert bad.stderr.strip() == "cuda-jit: cuModuleLoadData failed: 200 (CUDA_ERROR_INVALID_IMAGE)"


def load_driver() -> Any:
    """Import scripts/gpu_acceptance.py (a script, not a package module)."""
    spec = importlib.util.spec_from_file_location(
        "gpu_acceptance", REPO / "scripts" / "gpu_acceptance.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


#: A stand-in for a GPU warm-up (the one part this machine cannot run): it writes
#: one cache file when WRITE names it and prints OUTPUT as the warm-up's output.
FAKE_WARMUP = """
import json, os, pathlib, sys
if os.environ.get("WRITE"):
    path = pathlib.Path(os.environ["WRITE"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("kernel")
report = {"compiled": int(os.environ["COMPILED"]), "output": json.loads(os.environ["OUTPUT"])}
print(json.dumps(report))
"""


@pytest.mark.slow
def test_a_restored_warmup_must_compute_what_the_cold_one_did(tmp_path: Path) -> None:
    """The driver keeps a cold warm-up's output and fails a restored run that differs."""
    driver = load_driver()
    acc = driver.Acceptance(tmp_path / "acc", None, dry_run=True)
    acc.work.mkdir(parents=True)
    script = tmp_path / "fake_warmup.py"
    script.write_text(FAKE_WARMUP)
    acc.warmup_argv = lambda family: [PYTHON, str(script)]
    entry = acc.cache / "vllm" / "torch_compile_cache" / "abc" / "rank_0_0" / "backbone" / "x"

    def run(restored: bool, output: list[int], write: Path | None = None) -> Any:
        step = driver.Step("restored vllm" if restored else "cold vllm")
        env = clean_env({"COMPILED": "0" if restored else "2", "OUTPUT": json.dumps(output)})
        if write:
            env["WRITE"] = str(write)
        acc.warm(step, family="vllm", env=env, restored=restored)
        return step

    cold = run(False, [11, 12, 13, 14], write=entry)
    assert cold.reason.startswith("2 compiled, 1 file(s)"), cold.reason
    assert acc.outputs == {"vllm": [11, 12, 13, 14]}
    acc.harvested = ["vllm"]
    assert run(True, [11, 12, 13, 14]).reason.startswith("0 compiled")
    with pytest.raises(driver.StepError) as err:
        run(True, [11, 12, 99, 14])
    assert str(err.value) == (
        "the restored run computed [11, 12, 99, 14], the cold run [11, 12, 13, 14]"
    )
