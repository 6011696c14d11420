"""One DeepGEMM FP8 GEMM under the fake device of ``tests/fakecuda.py``: the producer of the
``deepgemm`` test. A HARNESS: it proves DeepGEMM's cache and its real code generation
(sgl-deep-gemm's own JIT and the real nvcc), never a kernel run.

Run as ``python deepgemm_op.py`` with the env :func:`fakecuda.build_fake_cuda` returns; it
prints one JSON line last: ``{"deepgemm_op": {"seconds", "deep_gemm"}}``, the seconds the
GEMM call took and the dir of the imported ``deep_gemm`` package.

The torch side of the fake: a CPU tensor is relabelled ``cuda:0`` by editing the device
of its DLPack capsule (the data stays in host memory), and a fallback on the CUDA
dispatch key runs any aten op on CUDA tensors as the CPU kernel would, relabelling
what it returns. DeepGEMM's own ops then see CUDA tensors on an sm_90 with 132 SMs:
``fp8_gemm_nt`` at m=128, n=4096, k=7168 (FP8 e4m3 inputs, FP32 scales, BF16 out),
which needs ``transpose_fp32`` (the scales into the TMA layout) and
``sm90_fp8_gemm_1d2d``: both are generated, compiled by nvcc, and "launched" into a
driver stub. The output is whatever the buffer held.
"""

import ctypes
import json
import os
import sys
import time
from typing import Any

import torch

CPU, CUDA = 1, 2  # DLPack's kDLCPU, kDLCUDA
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def relabel(tensor: torch.Tensor, device_type: int) -> torch.Tensor:
    """The same memory as a tensor of the other device type (DLTensor.device at offset 8)."""
    # Not Tensor.__dlpack__: for a CUDA tensor it asks torch.cuda for the current device.
    capsule = torch.utils.dlpack.to_dlpack(tensor)  # type: ignore[attr-defined]
    ctypes.c_int32.from_address(_capsule_pointer(capsule, b"dltensor") + 8).value = device_type
    return torch.utils.dlpack.from_dlpack(capsule)


def convert(value: Any, device_type: int) -> Any:
    """``value`` with every tensor (and a ``cuda`` device argument) moved by relabelling."""
    if isinstance(value, torch.Tensor):
        on_cuda = value.device.type == "cuda"
        return relabel(value, device_type) if on_cuda != (device_type == CUDA) else value
    if isinstance(value, torch.device) and value.type == "cuda":
        return torch.device("cpu")
    if isinstance(value, (list, tuple)):
        return type(value)(convert(v, device_type) for v in value)
    return value


def cpu_fallback(op: Any, *args: Any, **kwargs: Any) -> Any:
    """Run a CUDA-key aten op as the CPU kernel on the same memory."""
    out = op(*convert(args, CPU), **{k: convert(v, CPU) for k, v in kwargs.items()})
    return convert(out, CUDA)


def main() -> None:
    torch.cuda._lazy_init = lambda: None  # a CPU build of torch: nothing to initialise
    fallback = torch.library.Library("_", "IMPL")  # type: ignore[no-untyped-call]
    fallback.fallback(cpu_fallback, "CUDA")  # type: ignore[no-untyped-call]
    import deep_gemm  # noqa: PLC0415 (after the fallback: import registers its ops)

    m, n, k = 128, 4096, 7168
    a = relabel(torch.randn(m, k).to(torch.float8_e4m3fn), CUDA)
    b = relabel(torch.randn(n, k).to(torch.float8_e4m3fn), CUDA)
    a_sf = relabel(torch.ones(m, k // 128), CUDA)
    b_sf = relabel(torch.ones(n // 128, k // 128), CUDA)
    d = relabel(torch.empty(m, n, dtype=torch.bfloat16), CUDA)
    start = time.monotonic()
    deep_gemm.fp8_gemm_nt((a, a_sf), (b, b_sf), d)
    seconds = time.monotonic() - start
    report = {"seconds": seconds, "deep_gemm": os.path.dirname(deep_gemm.__file__)}
    sys.stdout.write(json.dumps({"deepgemm_op": report}) + "\n")


if __name__ == "__main__":
    main()
