"""GPU acceptance warm-ups: one cache family per run, on a real GPU (Hopper).

``scripts/gpu_acceptance.py`` runs this once per family with fresh cache
roots (cold), and again with only the caches ``artifactd restore`` installed
(restored). Each part reuses the CPU demo's warm-ups where they fit
(``warmup_matrices/cpu-demo/warmup.py``: the Inductor graphs, the Triton AOT
kernels, the nvcc cubin and its ptxas record):

* ``inductor``: torch.compile of the demo's three graphs on ``cuda``; hits
  and misses are Inductor's fxgraph counters;
* ``triton``: one ``@triton.jit`` kernel launched on the GPU; hits are what
  Triton's compilation listener reports;
* ``triton-aot``: the demo's Triton kernels compiled ahead of time for
  ``sm_90a`` (no GPU needed: the dry run's Triton part);
* ``cuda-jit``: a PTX module (``nvcc --ptx`` for a virtual arch) loaded
  through the driver API (``cuModuleLoadData``), so the driver compiles it
  to SASS and keeps the result in ``CUDA_CACHE_PATH``; the kernel is
  launched and its result checked;
* ``generic``: the demo's ``nvcc -cubin -arch=sm_90a`` kernel into
  ``ARTIFACTD_GENERIC_DIR``; with a GPU the cubin is loaded and launched too;
* ``flashinfer``: one FlashInfer op (SiLU-and-mul), JIT-built on first use;
* ``cutedsl``: one CuTe DSL kernel (an element-wise add), compiled and run.

The last line on stdout is one JSON object: ``compiled`` and ``hits`` where
the library reports them (else only what ran), ``seconds``, or ``skipped``
with the reason when the part cannot run here. The driver counts the files
each run wrote under every family's cache dirs itself.

Usage: python warmup.py PART [--arch 90] [--ptx FILE]
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
DEMO = HERE.parent / "cpu-demo" / "warmup.py"
#: Elements the driver-API kernels (axpy) run over, and threads per block.
N = 4096
THREADS = 256


def demo() -> ModuleType:
    """Import the CPU demo's warm-up module (its directory name is not a package)."""
    spec = importlib.util.spec_from_file_location("cpu_demo_warmup", DEMO)
    if spec is None or spec.loader is None:
        sys.exit(f"cannot load {DEMO}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def no_torch_cuda() -> str | None:
    """Why torch cannot run on a GPU here, or None when it can."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is not a CUDA build"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    return None


class Driver:
    """The CUDA driver API through ctypes: enough to load a module and launch axpy."""

    def __init__(self) -> None:
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise RuntimeError(f"no libcuda.so.1: {exc}") from exc
        lib = self.lib
        ptr, u32, size = ctypes.c_void_p, ctypes.c_uint, ctypes.c_size_t
        out = ctypes.POINTER
        lib.cuInit.argtypes = [u32]
        lib.cuDeviceGet.argtypes = [out(ctypes.c_int), ctypes.c_int]
        lib.cuDevicePrimaryCtxRetain.argtypes = [out(ptr), ctypes.c_int]
        lib.cuCtxSetCurrent.argtypes = [ptr]
        lib.cuModuleLoadData.argtypes = [out(ptr), ctypes.c_char_p]
        lib.cuModuleGetFunction.argtypes = [out(ptr), ptr, ctypes.c_char_p]
        lib.cuMemAlloc_v2.argtypes = [out(ctypes.c_uint64), size]
        lib.cuMemFree_v2.argtypes = [ctypes.c_uint64]
        lib.cuMemcpyHtoD_v2.argtypes = [ctypes.c_uint64, ptr, size]
        lib.cuMemcpyDtoH_v2.argtypes = [ptr, ctypes.c_uint64, size]
        lib.cuLaunchKernel.argtypes = [ptr, u32, u32, u32, u32, u32, u32, u32, ptr, ptr, ptr]
        lib.cuCtxSynchronize.argtypes = []
        lib.cuGetErrorName.argtypes = [ctypes.c_int, out(ctypes.c_char_p)]
        self.check(lib.cuInit(0), "cuInit")
        device = ctypes.c_int(0)
        self.check(lib.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
        # The primary context is the one torch and Triton share: no context of our own.
        ctx = ctypes.c_void_p()
        self.check(
            lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), device), "cuDevicePrimaryCtxRetain"
        )
        self.check(lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    def check(self, rc: int, what: str) -> None:
        """Raise with the driver's name for ``rc`` unless it is CUDA_SUCCESS."""
        if rc != 0:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(rc, ctypes.byref(name))
            raise RuntimeError(f"{what} failed: {rc} ({(name.value or b'?').decode()})")

    def load(self, image: bytes) -> ctypes.c_void_p:
        """Load a module from a PTX text or a cubin (the driver JIT-compiles PTX)."""
        module = ctypes.c_void_p()
        # PTX must be NUL-terminated; a cubin ignores the extra byte.
        self.check(
            self.lib.cuModuleLoadData(ctypes.byref(module), image + b"\0"), "cuModuleLoadData"
        )
        return module

    def run_axpy(self, module: ctypes.c_void_p) -> float:
        """Launch ``axpy(2, x, y, N)`` from ``module``; return the largest error against the CPU."""
        lib = self.lib
        fn = ctypes.c_void_p()
        self.check(
            lib.cuModuleGetFunction(ctypes.byref(fn), module, b"axpy"), "cuModuleGetFunction"
        )
        nbytes = 4 * N
        x = (ctypes.c_float * N)(*[float(i) for i in range(N)])
        y = (ctypes.c_float * N)(*[1.0] * N)
        dx, dy = ctypes.c_uint64(), ctypes.c_uint64()
        self.check(lib.cuMemAlloc_v2(ctypes.byref(dx), nbytes), "cuMemAlloc")
        self.check(lib.cuMemAlloc_v2(ctypes.byref(dy), nbytes), "cuMemAlloc")
        try:
            self.check(lib.cuMemcpyHtoD_v2(dx, ctypes.addressof(x), nbytes), "cuMemcpyHtoD")
            self.check(lib.cuMemcpyHtoD_v2(dy, ctypes.addressof(y), nbytes), "cuMemcpyHtoD")
            a, n = ctypes.c_float(2.0), ctypes.c_int(N)
            args = (a, dx, dy, n)
            params = (ctypes.c_void_p * len(args))(*[ctypes.addressof(v) for v in args])
            grid = (N + THREADS - 1) // THREADS
            self.check(
                lib.cuLaunchKernel(fn, grid, 1, 1, THREADS, 1, 1, 0, None, params, None),
                "cuLaunchKernel",
            )
            self.check(lib.cuCtxSynchronize(), "cuCtxSynchronize")
            self.check(lib.cuMemcpyDtoH_v2(ctypes.addressof(y), dy, nbytes), "cuMemcpyDtoH")
        finally:
            lib.cuMemFree_v2(dx)
            lib.cuMemFree_v2(dy)
        return max(abs(y[i] - (2.0 * i + 1.0)) for i in range(N))


def run_cuda_jit(ptx: Path) -> dict[str, Any]:
    """Load PTX through the driver (a JIT compile, or a hit in CUDA_CACHE_PATH) and run it."""
    t0 = time.perf_counter()
    cache = os.environ.get("CUDA_CACHE_PATH")
    if not cache:
        return {"skipped": "CUDA_CACHE_PATH is not set"}
    # The driver is closed source: whether it creates a missing cache dir is not known.
    Path(cache).mkdir(parents=True, exist_ok=True)
    try:
        driver = Driver()
    except RuntimeError as exc:
        return {"skipped": str(exc)}
    t_load = time.perf_counter()
    module = driver.load(ptx.read_bytes())
    load_s = time.perf_counter() - t_load
    error = driver.run_axpy(module)
    if error > 1e-3:
        sys.exit(f"axpy from {ptx} computed wrong values (max error {error})")
    return {"modules": 1, "load_seconds": round(load_s, 4), "seconds": _since(t0)}


def run_generic(arch: int, gpu: bool) -> dict[str, Any]:
    """The demo's nvcc cubin; with a GPU, load and launch it to prove it is this GPU's code."""
    t0 = time.perf_counter()
    report: dict[str, Any] = demo().run_nvcc(arch)
    if "skipped" in report or not gpu:
        return report
    cubins = sorted(Path(os.environ["ARTIFACTD_GENERIC_DIR"]).glob(f"axpy-*.sm_{arch}a.cubin"))
    driver = Driver()
    error = driver.run_axpy(driver.load(cubins[-1].read_bytes()))
    if error > 1e-3:
        sys.exit(f"axpy from {cubins[-1]} computed wrong values (max error {error})")
    report["launched"] = True
    report["seconds"] = _since(t0)
    return report


def run_triton_gpu() -> dict[str, Any]:
    """Launch one Triton kernel on the GPU; hits are what Triton's listener reports."""
    t0 = time.perf_counter()
    why = no_torch_cuda()
    if why:
        return {"skipped": why}
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def scaled_add(x, y, out, alpha, n, BLOCK: tl.constexpr):  # noqa: N803
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        v = alpha * tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m)
        tl.store(out + offs, v, mask=m)

    seen: list[bool] = []

    def listener(**kw: Any) -> None:
        seen.append(bool(kw["cache_hit"]))

    triton.knobs.compilation.listener = listener
    x = torch.arange(N, device="cuda", dtype=torch.float32)
    y = torch.ones(N, device="cuda", dtype=torch.float32)
    out = torch.empty_like(x)
    scaled_add[(triton.cdiv(N, 1024),)](x, y, out, 2.0, N, BLOCK=1024)
    torch.cuda.synchronize()
    torch.testing.assert_close(out, 2.0 * x + y)
    hits = sum(seen)
    return {"kernels": 1, "compiled": len(seen) - hits, "hits": hits, "seconds": _since(t0)}


def run_inductor_gpu() -> dict[str, Any]:
    """The demo's three torch.compile graphs, on the GPU."""
    why = no_torch_cuda()
    if why:
        return {"skipped": why}
    import torch

    report: dict[str, Any] = demo().run_inductor(device="cuda")
    torch.cuda.synchronize()
    return report


def run_flashinfer() -> dict[str, Any]:
    """One FlashInfer op (SiLU-and-mul), JIT-built into its workspace on first use.

    An activation op: every release builds it with its ninja JIT, where newer
    ones run RMSNorm through CuTe DSL when nvidia-cutlass-dsl is installed.
    """
    t0 = time.perf_counter()
    why = no_torch_cuda()
    if why:
        return {"skipped": why}
    if importlib.util.find_spec("flashinfer") is None:
        return {"skipped": "flashinfer-python is not installed (pass it in --wheels)"}
    if importlib.util.find_spec("flashinfer_jit_cache") is not None:
        return {"skipped": "flashinfer-jit-cache is installed: its prebuilt ops JIT nothing"}
    import flashinfer
    import torch
    import torch.nn.functional as F  # noqa: N812

    torch.manual_seed(0)
    hidden = 4096
    x = torch.randn(16, 2 * hidden, device="cuda", dtype=torch.float16)
    y = flashinfer.activation.silu_and_mul(x)
    torch.cuda.synchronize()
    ref = F.silu(x[..., :hidden].float()) * x[..., hidden:].float()
    torch.testing.assert_close(y.float(), ref, atol=2e-2, rtol=2e-2)
    return {"ops": 1, "version": flashinfer.__version__, "seconds": _since(t0)}


def run_cutedsl() -> dict[str, Any]:
    """One CuTe DSL kernel (an element-wise add), compiled, launched and checked."""
    t0 = time.perf_counter()
    why = no_torch_cuda()
    if why:
        return {"skipped": why}
    if importlib.util.find_spec("cutlass") is None:
        return {"skipped": "nvidia-cutlass-dsl is not installed (pass it in --wheels)"}
    import torch

    sys.path.insert(0, str(HERE))
    import cute_add  # its kernels are module-level: the DSL reads their source

    a = torch.randn(128, 1024, device="cuda", dtype=torch.float16)
    b = torch.randn(128, 1024, device="cuda", dtype=torch.float16)
    c = cute_add.add(a, b)
    torch.cuda.synchronize()
    torch.testing.assert_close(c, a + b)
    return {"kernels": 1, "seconds": _since(t0)}


def _since(t0: float) -> float:
    return round(time.perf_counter() - t0, 3)


def main() -> None:
    """Run one part and print its report as the last line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "part",
        choices=[
            "inductor",
            "triton",
            "triton-aot",
            "cuda-jit",
            "generic",
            "flashinfer",
            "cutedsl",
        ],
    )
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("--ptx", type=Path, help="the PTX the cuda-jit part loads")
    parser.add_argument("--gpu", action="store_true", help="generic: also launch the cubin")
    args = parser.parse_args()
    try:
        report = run_part(args)
    except RuntimeError as exc:  # a driver API call failed: one line, not a traceback
        sys.exit(f"{args.part}: {exc}")
    print(json.dumps(report), flush=True)


def run_part(args: argparse.Namespace) -> dict[str, Any]:
    """Run the part ``args`` names and return its report."""
    if args.part == "inductor":
        report = run_inductor_gpu()
    elif args.part == "triton":
        report = run_triton_gpu()
    elif args.part == "triton-aot":
        report = demo().run_triton(args.arch)
    elif args.part == "cuda-jit":
        if args.ptx is None:
            sys.exit("cuda-jit needs --ptx FILE")
        report = run_cuda_jit(args.ptx)
    elif args.part == "generic":
        report = run_generic(args.arch, args.gpu)
    elif args.part == "flashinfer":
        report = run_flashinfer()
    else:
        report = run_cutedsl()
    return report


if __name__ == "__main__":
    main()
