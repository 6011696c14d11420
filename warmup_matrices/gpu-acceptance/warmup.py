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
* ``cutedsl``: one CuTe DSL kernel (an element-wise add), compiled and run;
* ``tilelang``: the TileLang kernel the producer test compiles on the CPU
  (``tests/engines/tilelang_op.py``: a vector add for ``sm_90a``, ``tvm_ffi``),
  compiled or loaded from ``TILELANG_CACHE_DIR``, launched and checked;
  ``compiled`` is the nvcc runs TileLang started;
* ``sglang``: SGLang's JIT activation module for bfloat16 (as in
  ``tests/engines/sglang_jit_op.py``), built or loaded from
  ``SGLANG_JIT_CACHE_DIR``, its SiLU-and-mul run and checked; ``compiled``
  is the ninja builds SGLang started;
* ``deepgemm``: DeepGEMM's ``fp8_gemm_nt`` at the producer test's shape
  (``tests/engines/deepgemm_op.py``), on real CUDA tensors, checked against
  the dequantized GEMM in torch; DeepGEMM starts nvcc from C++, which no
  Python hook sees: only the files written count;
* ``vllm``: ``vllm.LLM`` on a tiny 2-layer Llama (``load_format="dummy"``,
  torch.compile on, CUDA graphs on), one greedy generate; ``compiled`` is
  vLLM's own counter of Inductor and AOT compiles, ``output`` the token ids
  (the driver compares the restored run's with the cold run's).

The tilelang and sglang parts record every process the run starts before
importing the library (``tests/engines/spawns.py``, the producer tests' hook).

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
#: The producer tests' engines: ``spawns`` (the process-start hook) is reused.
ENGINES = HERE.parent.parent / "tests" / "engines"
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


def record_spawns() -> list[list[str]]:
    """Start recording every process this run starts (before the library is imported)."""
    sys.path.insert(0, str(ENGINES))
    import spawns

    started: list[list[str]] = spawns.record()
    return started


def compiler_runs(started: list[list[str]], program: str) -> int:
    """Count the runs of ``program`` in ``started`` that were not a ``--version`` query."""
    words = [" ".join(argv).split() for argv in started]  # a shell line is one string
    return sum(1 for w in words if w and Path(w[0]).name == program and "--version" not in w)


def missing(module: str, dist: str) -> dict[str, Any] | None:
    """A ``skipped`` report naming what is missing for a part, or None when it can run."""
    why = no_torch_cuda()
    if why:
        return {"skipped": why}
    if importlib.util.find_spec(module) is None:
        return {"skipped": f"{dist} is not installed (pass it in --wheels)"}
    return None


def run_tilelang() -> dict[str, Any]:
    """The producer test's TileLang kernel, compiled or loaded, launched and checked."""
    t0 = time.perf_counter()
    skipped = missing("tilelang", "tilelang")
    if skipped:
        return skipped
    started = record_spawns()
    import torch

    sys.path.insert(0, str(HERE))
    import tilelang_add

    kernel = tilelang_add.compile_add()
    a = torch.randn(tilelang_add.N, device="cuda", dtype=torch.float32)
    b = torch.randn(tilelang_add.N, device="cuda", dtype=torch.float32)
    c = kernel(a, b)
    torch.cuda.synchronize()
    torch.testing.assert_close(c, a + b)
    return {
        "kernels": 1,
        "compiled": compiler_runs(started, "nvcc"),
        "version": tilelang_add.tilelang.__version__,
        "seconds": _since(t0),
    }


def run_sglang() -> dict[str, Any]:
    """SGLang's JIT activation module (bfloat16), built or loaded; SiLU-and-mul checked."""
    t0 = time.perf_counter()
    skipped = missing("sglang", "sglang")
    if skipped:
        return skipped
    started = record_spawns()
    import torch
    import torch.nn.functional as F  # noqa: N812
    from sglang.kernels.ops.activation.activation import activation_module

    module = activation_module(torch.bfloat16)
    torch.manual_seed(0)
    hidden = 4096
    x = torch.randn(16, 2 * hidden, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(16, hidden, device="cuda", dtype=torch.bfloat16)
    module.run_activation(x, out, "silu")
    torch.cuda.synchronize()
    ref = F.silu(x[:, :hidden].float()) * x[:, hidden:].float()
    torch.testing.assert_close(out.float(), ref, atol=3e-2, rtol=3e-2)
    return {"modules": 1, "compiled": compiler_runs(started, "ninja"), "seconds": _since(t0)}


def run_deepgemm() -> dict[str, Any]:
    """DeepGEMM's FP8 GEMM at the producer test's shape, checked against torch."""
    t0 = time.perf_counter()
    skipped = missing("deep_gemm", "sgl-deep-gemm")
    if skipped:
        return skipped
    import deep_gemm
    import torch

    torch.manual_seed(0)
    m, n, k = 128, 4096, 7168
    a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
    # Per token per 128 columns (a), per 128x128 block (b): DeepGEMM's SM90 recipe.
    a_sf = torch.rand(m, k // 128, device="cuda") + 0.5
    b_sf = torch.rand(n // 128, k // 128, device="cuda") + 0.5
    d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    deep_gemm.fp8_gemm_nt((a, a_sf), (b, b_sf), d)
    torch.cuda.synchronize()
    a_ref = (a.float().view(m, k // 128, 128) * a_sf[:, :, None]).view(m, k)
    b_ref = b.float().view(n // 128, 128, k // 128, 128) * b_sf[:, None, :, None]
    ref = a_ref @ b_ref.view(n, k).t()
    # DeepGEMM's own test measure: 1 - cosine-like similarity, over the whole output.
    out = d.double()
    diff = 1 - 2 * (out * ref.double()).sum() / (out * out + ref.double() ** 2).sum()
    if not float(diff) < 1e-3:
        sys.exit(f"deepgemm: fp8_gemm_nt differs from torch (diff {float(diff):.2e})")
    return {"kernels": 1, "diff": float(diff), "seconds": _since(t0)}


#: The tiny model of the vllm part: a 2-layer Llama, random ("dummy") weights.
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1024,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def run_vllm() -> dict[str, Any]:
    """vLLM's compile of a tiny Llama, one greedy generate; vLLM's counter says what compiled."""
    t0 = time.perf_counter()
    skipped = missing("vllm", "vllm")
    if skipped:
        return skipped
    # The model dir is part of vLLM's cache key: the same path (the acceptance's
    # work dir) in the cold and the restored run.
    model = Path.cwd() / "tiny-llama"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps(TINY_LLAMA), encoding="utf-8")
    # The engine core in this process, so vLLM's compile counter is readable here.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams
    from vllm.compilation.counter import compilation_counter

    llm = LLM(
        model=str(model),
        load_format="dummy",
        skip_tokenizer_init=True,
        dtype="bfloat16",
        enforce_eager=False,
        max_model_len=128,
        max_num_seqs=1,
        gpu_memory_utilization=0.2,
        seed=0,
    )
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True, detokenize=False)
    out = llm.generate([{"prompt_token_ids": [1, 5, 7, 9]}], params)
    tokens = list(out[0].outputs[0].token_ids)
    if len(tokens) != 4:
        sys.exit(f"vllm: generated {len(tokens)} token(s), not 4")
    compiled = sum(
        getattr(compilation_counter, name, 0)
        for name in ("num_inductor_compiles", "num_aot_compiles")
    )
    return {"models": 1, "compiled": compiled, "output": tokens, "seconds": _since(t0)}


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
            "tilelang",
            "sglang",
            "deepgemm",
            "vllm",
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
    elif args.part == "cutedsl":
        report = run_cutedsl()
    else:
        report = {
            "tilelang": run_tilelang,
            "sglang": run_sglang,
            "deepgemm": run_deepgemm,
            "vllm": run_vllm,
        }[args.part]()
    return report


if __name__ == "__main__":
    main()
