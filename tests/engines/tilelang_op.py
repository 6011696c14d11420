"""One TileLang kernel compiled by TileLang's own JIT: the producer of the ``tilelang`` tests.

Run as ``python tilelang_op.py``; it prints one JSON line last:
``{"tilelang_op": {"version", "compile_s", "import_s", "started", "source"}}``.

The kernel is an elementwise add of two 1024-float vectors. It is compiled as
an H100 or H200 would compile it, without a GPU: the target is the dict form
``{"kind": "cuda", "arch": "sm_90a"}`` (TileLang 0.1.15 refuses the string form
without a device; no device is queried with the dict), the execution backend
``tvm_ffi`` (``executable.so``, a host library linked here), ``CUDA_HOME``
names the toolkit. TileLang looks the kernel up in ``TILELANG_CACHE_DIR``
first and on a miss runs nvcc and the host compiler, then publishes the entry.
The kernel is never launched.

``started`` is every process the run started (:mod:`spawns`, recorded before
TileLang is imported): nvcc and g++ on a miss, nothing on a hit. ``source`` is
the sha256 of the CUDA source TileLang generated or loaded.
"""

# No `from __future__ import annotations`: TileLang evaluates the kernel's annotations.
import hashlib
import json
import sys
import time
from typing import Any

import spawns

STARTED = spawns.record()


def main() -> dict[str, Any]:
    """Compile (or load) the kernel once; return what TileLang did."""
    t0 = time.monotonic()
    # lazy: TileLang is optional (the tilelang-jit extra) and imported after the hook
    import tilelang  # noqa: PLC0415
    import tilelang.language as T  # noqa: N812, PLC0415

    n, block, dtype = 1024, 128, "float32"

    @T.prim_func  # type: ignore[untyped-decorator]
    def add(
        A: T.Tensor((n,), dtype),  # type: ignore[valid-type]  # noqa: N803
        B: T.Tensor((n,), dtype),  # type: ignore[valid-type]  # noqa: N803
        C: T.Tensor((n,), dtype),  # type: ignore[valid-type]  # noqa: N803
    ) -> None:
        with T.Kernel(T.ceildiv(n, block), threads=block) as bx:
            for i in T.Parallel(block):
                C[bx * block + i] = A[bx * block + i] + B[bx * block + i]

    t1 = time.monotonic()
    kernel = tilelang.compile(
        add,
        out_idx=[2],
        target={"kind": "cuda", "arch": "sm_90a"},
        execution_backend="tvm_ffi",
    )
    compile_s = time.monotonic() - t1
    source = kernel.get_kernel_source()
    return {
        "version": tilelang.__version__,
        "import_s": round(t1 - t0, 3),
        "compile_s": round(compile_s, 3),
        "started": [argv[:1] + argv[1:2] for argv in STARTED],
        "source": hashlib.sha256(source.encode()).hexdigest(),
    }


if __name__ == "__main__":
    report = main()
    sys.stdout.write(json.dumps({"tilelang_op": report}) + "\n")
