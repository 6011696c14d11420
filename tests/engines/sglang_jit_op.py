"""One SGLang JIT kernel module built by SGLang's own JIT: the producer of the ``sglang`` tests.

Run as ``python sglang_jit_op.py``; it prints one JSON line last:
``{"sglang_jit_op": {"load_s", "import_s", "started", "leaves"}}``.

The module is SGLang 0.5.23's activation kernels for bfloat16
(``sglang.kernels.ops.activation.activation.activation_module``), built as an
H100 or H200 builds it, without a GPU: SGLang's own
``override_jit_cuda_arch(9, 0)`` sets the target (sm_90a) that the device
would. ``load_jit`` keys the build on the module, its sources, the target,
``nvcc --version`` and ``c++ --version`` (run at every start) and package
versions; it looks for a leaf under ``SGLANG_JIT_CACHE_DIR`` whose recorded
dependencies still hash to its name, and on a miss runs ninja (nvcc, then the
link) in a ``.staging-<uuid>`` dir and renames it into place. The module is
loaded (``tvm_ffi.load_module``), never launched.

``started`` is every process the run started (:mod:`spawns`, recorded before
SGLang is imported): ``nvcc --version`` and ``c++ --version`` always, ninja on
a miss. ``leaves`` lists the ``<target>/<module>/build-*/deps-*`` dirs found.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import spawns

STARTED = spawns.record()


def main() -> dict[str, Any]:
    """Build (or load) the module once; return what SGLang did."""
    t0 = time.monotonic()
    # lazy: torch and SGLang are optional (the sglang-jit extra) and imported after the hook
    import torch  # noqa: PLC0415
    from sglang.kernels.jit.utils.arch import override_jit_cuda_arch  # noqa: PLC0415
    from sglang.kernels.ops.activation.activation import activation_module  # noqa: PLC0415

    t1 = time.monotonic()
    with override_jit_cuda_arch(9, 0):
        module = activation_module(torch.bfloat16)
    load_s = time.monotonic() - t1
    assert module is not None
    root = Path(os.environ["SGLANG_JIT_CACHE_DIR"])
    return {
        "import_s": round(t1 - t0, 3),
        "load_s": round(load_s, 3),
        "started": [argv[:2] for argv in STARTED],
        "leaves": sorted(str(p.relative_to(root)) for p in root.glob("*/*/build-*/deps-*")),
    }


if __name__ == "__main__":
    report = main()
    sys.stdout.write(json.dumps({"sglang_jit_op": report}) + "\n")
