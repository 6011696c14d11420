"""One CuTe DSL kernel for the GPU acceptance: ``c = a + b`` over a 2-D fp16 tensor.

Module-level on purpose: the DSL reads each decorated function's source to
rewrite its control flow. Imported only by ``warmup.py cutedsl`` (it needs
nvidia-cutlass-dsl and a GPU). Its first call goes through the DSL's file
cache (``cute_dsl_<hash>.mlir`` under ``$TMPDIR/<user>/cutlass_python_cache``),
whose key includes the working directory: the acceptance runs every warm-up
in the same one.
"""

from __future__ import annotations

from typing import Any

import cutlass.cute as cute
import torch
from cutlass.cute.runtime import from_dlpack

#: Threads per block; the tensor's element count must be a multiple of it.
THREADS = 256


@cute.kernel
def _add_kernel(g_a: cute.Tensor, g_b: cute.Tensor, g_c: cute.Tensor) -> None:
    tidx, _, _ = cute.arch.thread_idx()
    bidx, _, _ = cute.arch.block_idx()
    bdim, _, _ = cute.arch.block_dim()
    idx = bidx * bdim + tidx
    _m, n = g_a.shape
    row = idx // n
    col = idx % n
    g_c[row, col] = g_a[row, col] + g_b[row, col]


@cute.jit
def _add(m_a: cute.Tensor, m_b: cute.Tensor, m_c: cute.Tensor) -> None:
    m, n = m_a.shape
    _add_kernel(m_a, m_b, m_c).launch(grid=((m * n) // THREADS, 1, 1), block=(THREADS, 1, 1))


def add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Compile the kernel for these shapes (or load it from the DSL's file cache) and run it."""
    if a.numel() % THREADS:
        raise ValueError(f"the element count must be a multiple of {THREADS}")
    c = torch.empty_like(a)
    args: list[Any] = [from_dlpack(t, assumed_align=16) for t in (a, b, c)]
    # Called directly: cute.compile compiles with the caches off (compile_only),
    # a call looks the module up in the file cache and writes it there.
    _add(*args)
    return c
