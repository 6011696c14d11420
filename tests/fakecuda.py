"""A fake CUDA device for DeepGEMM's JIT: a HARNESS, not a GPU.

It proves the cache and real code generation, never a kernel run: sgl-deep-gemm's
own ``_C.so`` generates the kernel source and runs the real nvcc (through a
logging wrapper), then "loads" and "launches" into stubs that do nothing.

What stands in, built here with gcc into a tmp dir:

* ``libcudart.so.13``, ``LD_PRELOAD``-ed: device 0 is an sm_90 with 132 SMs (an
  H100 SXM; DeepGEMM takes the arch only from ``cudaGetDeviceProperties``), memsets
  do nothing; it also answers torch's ``aoti_torch_get_current_device_index``.
* on ``LD_LIBRARY_PATH``: ``libtorch_cuda``/``libc10_cuda`` with the six symbols
  the wheel imports, cuBLAS and cuBLASLt whose calls succeed, an empty nvrtc, and a
  ``libcuda.so.1`` whose driver calls succeed and do nothing (a library "holds" one
  kernel, so DeepGEMM's load check passes).
* ``CUDA_HOME/bin/nvcc``: a script that logs its arguments, then runs the real nvcc.

The torch side (tensors relabelled ``cuda:0`` through DLPack, a CUDA-key fallback
to the CPU kernels) is in ``tests/engines/deepgemm_op.py``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

CUDART = r"""
#include <string.h>
#include <cuda_runtime_api.h>
cudaError_t cudaGetDevice(int *d) { *d = 0; return cudaSuccess; }
cudaError_t cudaFree(void *p) { (void)p; return cudaSuccess; }
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d) {
  (void)d; memset(p, 0, sizeof *p); strcpy(p->name, "fake sm_90 (tests/fakecuda.py)");
  p->major = 9; p->minor = 0; p->multiProcessorCount = 132; p->l2CacheSize = 50 << 20;
  p->sharedMemPerBlockOptin = 232448; p->sharedMemPerBlock = 49152; p->warpSize = 32;
  return cudaSuccess; }
cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr a, int d) {
  (void)a; (void)d; *v = 1980000; return cudaSuccess; }
const char *cudaGetErrorName(cudaError_t e) { (void)e; return "cudaSuccess"; }
const char *cudaGetErrorString(cudaError_t e) { (void)e; return "no error"; }
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) {
  (void)p; (void)v; (void)n; (void)s; return cudaSuccess; }
cudaError_t cudaMemset2DAsync(void *p, size_t pitch, int v, size_t w, size_t h, cudaStream_t s) {
  (void)p; (void)pitch; (void)v; (void)w; (void)h; (void)s; return cudaSuccess; }
cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *c) {
  (void)s; *c = cudaStreamCaptureStatusNone; return cudaSuccess; }
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
int aoti_torch_get_current_device_index(int *d) { *d = 0; return 0; }
"""

DRIVER = r"""
static int one;
int cuGetErrorName(int e, const char **s) { (void)e; *s = "CUDA_SUCCESS"; return 0; }
int cuGetErrorString(int e, const char **s) { (void)e; *s = "no error"; return 0; }
int cuLibraryLoadFromFile(void **l) { *l = &one; return 0; }
int cuLibraryGetKernelCount(unsigned *n) { *n = 1; return 0; }
int cuLibraryEnumerateKernels(void **k) { *k = &one; return 0; }
int cuKernelGetFunction(void **f) { *f = &one; return 0; }
#define OK(name) int name(void) { return 0; }
OK(cuInit) OK(cuDeviceGet) OK(cuDeviceGetAttribute) OK(cuFuncSetAttribute) OK(cuLaunchKernelEx)
OK(cuStreamBatchMemOp) OK(cuTensorMapEncodeTiled) OK(cuLibraryUnload)
"""

#: c10::cuda and at::cuda functions the wheel imports, defined by their mangled names.
TORCH_CUDA = r"""
typedef struct { long a, b; } Stream;
static int handle;
void _ZN3c104cuda19CUDAErrorLogCaptureC1Ev(void *self) { (void)self; }
Stream _ZN3c104cuda20getCurrentCUDAStreamEa(signed char d) { Stream s = {1, d}; return s; }
void _ZN3c104cuda29c10_cuda_check_implementationEiPKcS2_jbPNS0_19CUDAErrorLogCaptureE(void) {}
void *_ZNK3c104cuda10CUDAStream6streamEv(const void *self) { (void)self; return 0; }
void *_ZN2at4cuda26getCurrentCUDABlasLtHandleEv(void) { return &handle; }
int aoti_torch_get_current_cuda_stream(int d, void **s) { (void)d; *s = 0; return 0; }
"""

CUBLASLT_CALLS = (
    "Create Destroy Matmul MatmulAlgoGetHeuristic MatmulDescCreate MatmulDescDestroy"
    " MatmulDescSetAttribute MatmulPreferenceCreate MatmulPreferenceDestroy"
    " MatmulPreferenceSetAttribute MatrixLayoutCreate MatrixLayoutDestroy MatrixLayoutSetAttribute"
)
CUBLAS = (
    "#define OK(name) int name(void) { return 0; }\n"
    + "".join(f"OK(cublasLt{n}) " for n in CUBLASLT_CALLS.split())
    + '\nconst char *cublasGetStatusString(int s) { (void)s; return "CUBLAS_STATUS_SUCCESS"; }\n'
)

#: soname -> (source, whether its symbols carry the soname as version, as the wheel asks)
LIBRARIES = {
    "libcudart.so.13": (CUDART, True),
    "libcublasLt.so.13": (CUBLAS, True),
    "libcublas.so.13": (CUBLAS, True),
    "libnvrtc.so.13": ("", False),
    "libcuda.so.1": (DRIVER, False),
    "libtorch_cuda.so": (TORCH_CUDA, False),
    "libc10_cuda.so": (TORCH_CUDA, False),
}


def build_fake_cuda(dest: Path, cuda_home: Path) -> dict[str, str]:
    """Build the stubs and the logging nvcc under ``dest``; return the env a producer needs.

    ``CUDA_HOME`` is ``dest/cuda`` (its ``bin/nvcc`` appends its arguments, one line
    per run, to ``dest/nvcc.log``, then runs ``cuda_home``'s nvcc); the headers of
    ``cuda_home`` give the stubs the real structure layouts.
    """
    lib = dest / "lib"
    lib.mkdir(parents=True)
    for soname, (source, versioned) in LIBRARIES.items():
        flags = [f"-Wl,-soname,{soname}"]
        if versioned:
            script = lib / f"{soname}.map"
            script.write_text(f"{soname} {{ global: *; }};\n")
            flags.append(f"-Wl,--version-script={script}")
        subprocess.run(
            [
                "gcc",
                "-shared",
                "-fPIC",
                "-x",
                "c",
                "-",
                f"-I{cuda_home / 'include'}",
                *flags,
                "-o",
                str(lib / soname),
            ],
            input=source,
            text=True,
            check=True,
        )
    bin_dir = dest / "cuda" / "bin"
    bin_dir.mkdir(parents=True)
    nvcc = bin_dir / "nvcc"
    real = shutil.which("nvcc", path=str(cuda_home / "bin")) or "nvcc"
    nvcc.write_text(f'#!/bin/sh\necho "$*" >> {dest / "nvcc.log"}\nexec {real} "$@"\n')
    nvcc.chmod(0o755)
    inherited = os.environ.get("LD_LIBRARY_PATH")
    return {
        "CUDA_HOME": str(dest / "cuda"),
        "LD_LIBRARY_PATH": f"{lib}{os.pathsep}{inherited}" if inherited else str(lib),
        "LD_PRELOAD": str(lib / "libcudart.so.13"),
    }
