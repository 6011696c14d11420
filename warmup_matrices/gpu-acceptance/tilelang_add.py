"""One TileLang kernel for the GPU acceptance: ``c = a + b`` over 1024 floats.

The kernel ``tests/engines/tilelang_op.py`` compiles on the CPU for the
producer test, compiled the same way (the dict target ``sm_90a``, the
``tvm_ffi`` execution backend) and here also launched. Imported only by
``warmup.py tilelang`` (it needs TileLang and a GPU). No ``from __future__
import annotations``: TileLang evaluates the kernel's annotations.
"""

from typing import Any

import tilelang
import tilelang.language as T  # noqa: N812

#: Elements, threads per block and the element type of the vectors.
N, BLOCK, DTYPE = 1024, 128, "float32"


@T.prim_func  # type: ignore[untyped-decorator]
def add(
    A: T.Tensor((N,), DTYPE),  # type: ignore[valid-type]  # noqa: N803
    B: T.Tensor((N,), DTYPE),  # type: ignore[valid-type]  # noqa: N803
    C: T.Tensor((N,), DTYPE),  # type: ignore[valid-type]  # noqa: N803
) -> None:
    """Write ``A + B`` into ``C``, one block of threads per 128 elements."""
    with T.Kernel(T.ceildiv(N, BLOCK), threads=BLOCK) as bx:
        for i in T.Parallel(BLOCK):
            C[bx * BLOCK + i] = A[bx * BLOCK + i] + B[bx * BLOCK + i]


def compile_add() -> Any:
    """Compile (or load from ``TILELANG_CACHE_DIR``) the kernel; its call returns ``C``."""
    return tilelang.compile(
        add,
        out_idx=[2],
        target={"kind": "cuda", "arch": "sm_90a"},
        execution_backend="tvm_ffi",
    )
