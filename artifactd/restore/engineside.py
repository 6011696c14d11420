"""The pod's side of vLLM's cache key, gathered in the engine's own image before it starts.

What :func:`artifactd.restore.predict.run_predict` compares the recorded
factors with (:class:`~artifactd.families.vllmkey.PodFactors`):

* env: vLLM's own ``vllm.envs.compile_factors()``, run by the engine's Python
  (``--engine-python``, else this one) in a child process under the pod's
  environment, so the variable list and ignore list are the installed
  release's; its answer is capped (:data:`MAX_ENGINE_OUTPUT`) and its time
  bounded (:data:`ENGINE_TIMEOUT_S`);
* compiler: ``torch_key`` and CUDA from the same child (torch is imported
  there, CPU only, never here); the GPU name from ``--gpu-name`` (a node
  label) or NVML, never a CUDA context;
* config: the leaves the engine's arguments and the model's ``config.json``
  give (:func:`config_leaves`);
* code: :func:`read_traced` re-reads each recorded traced file as vLLM reads
  it (a regular file, capped), and the engine's site-packages are where a
  moved one is looked for.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from artifactd.families.vllm import MAX_FACTORS_BYTES, classify_factor
from artifactd.families.vllmkey import PodFactors, read_source
from artifactd.fsutil import InputFileError, read_regular

#: Most bytes read from the engine's helper process.
MAX_ENGINE_OUTPUT = 4 << 20
#: Ceiling on the engine's helper process (importing torch takes seconds).
ENGINE_TIMEOUT_S = 120.0
#: Most site-packages dirs of the engine's Python tried for a moved traced file.
MAX_SITES = 16

#: What the engine's Python prints: vLLM's env factors, torch_key, CUDA, Triton key.
_ENGINE_SNIPPET = r"""
import json, sys
out = {}
try:
    import vllm.envs as e
    out["env"] = e.compile_factors()
except Exception as exc:
    out["env_error"] = f"{type(exc).__name__}: {exc}"[:300]
if "--torch" in sys.argv:
    try:
        from torch._inductor.codecache import torch_key
        import torch
        out["torch_key"] = torch_key().hex()
        out["cuda"] = torch.version.cuda
    except Exception as exc:
        out["torch_error"] = f"{type(exc).__name__}: {exc}"[:300]
    try:
        from triton.compiler.compiler import triton_key
        out["triton_key"] = triton_key()
    except Exception as exc:
        out["triton_error"] = f"{type(exc).__name__}: {exc}"[:300]
import site, sysconfig
sites = set(getattr(site, "getsitepackages", lambda: [])())
sites.add(sysconfig.get_paths()["purelib"])
out["site_packages"] = sorted(sites)
sys.stdout.write(json.dumps(out, default=str))
"""


def read_traced(path: str) -> str | None:
    """Return a traced file's text as vLLM reads it; None: missing, not regular, too big."""
    return read_source(path)


_DTYPES = {"half": "float16", "float": "float32", "bf16": "bfloat16"}
#: Engine flags whose value is a compile factor, by the factor's leaf name.
_FLAGS = {
    "--max-num-batched-tokens": "max_num_batched_tokens",
    "--tensor-parallel-size": "tensor_parallel_size",
    "-tp": "tensor_parallel_size",
    "--pipeline-parallel-size": "pipeline_parallel_size",
    "-pp": "pipeline_parallel_size",
    "--dtype": "dtype",
    "--model": "model",
}


def _arg_value(text: str) -> Any:
    return int(text) if text.isdigit() else text


def config_leaves(argv: Sequence[str], model_dir: Path | None = None) -> dict[str, Any]:
    """Compile factors the engine's arguments (and the model's ``config.json``) give.

    ``vllm serve MODEL --max-num-batched-tokens N --dtype D -tp N ...``; a
    dtype ``auto`` is the model's ``torch_dtype`` from ``config.json`` when
    ``model_dir`` is given. Dtypes are written as vLLM records them
    (``torch.bfloat16``).
    """
    out: dict[str, Any] = {}
    args = list(argv)
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if flag in _FLAGS:
            if not eq:
                if i + 1 >= len(args):
                    continue
                value = args[i + 1]
            out[_FLAGS[flag]] = _arg_value(value)
    if "serve" in args and "model" not in out:
        k = args.index("serve")
        if k + 1 < len(args) and not args[k + 1].startswith("-"):
            out["model"] = args[k + 1]
    dtype = out.pop("dtype", "auto")
    if dtype == "auto" and model_dir is not None:
        dtype = _model_dtype(model_dir)
    if isinstance(dtype, str) and dtype != "auto":
        out["dtype"] = "torch." + _DTYPES.get(dtype, dtype)
    return out


def _model_dtype(model_dir: Path) -> str:
    try:
        doc = json.loads(read_regular(model_dir / "config.json", MAX_FACTORS_BYTES).decode())
    except (InputFileError, OSError, ValueError, UnicodeDecodeError):
        return "auto"
    value = doc.get("torch_dtype") if isinstance(doc, dict) else None
    return value if isinstance(value, str) else "auto"


def nvml_gpu_name() -> str | None:
    """GPU 0's name from NVML (no CUDA context); None without a driver or nvidia-ml-py."""
    # lazy: only without --gpu-name is the probe module needed
    from artifactd.fingerprint.probe import gpu_from_nvml, has_nvidia_driver  # noqa: PLC0415

    if not has_nvidia_driver():
        return None
    try:
        import pynvml  # noqa: PLC0415  # optional (the gpu extra): absent on most init images

        pynvml.nvmlInit()
    except Exception:  # no NVML here: the GPU name stays unknown
        return None
    try:
        gpu, _driver = gpu_from_nvml(pynvml)
    except Exception:  # a driver that answers oddly: unknown
        return None
    name = gpu.get("name")
    return name if isinstance(name, str) else None


def engine_factors(
    environ: Mapping[str, str], *, python: str = sys.executable, torch: bool = True
) -> dict[str, Any]:
    """Run this image's Python under ``environ``: vLLM's env factors, torch_key, CUDA, triton_key.

    A child process, so the pod's environment is the one vLLM reads and torch
    is never imported here. Its output is capped and its time bounded; what
    fails is reported under ``*_error``.
    """
    cmd = [python, "-c", _ENGINE_SNIPPET] + (["--torch"] if torch else [])
    try:
        proc = subprocess.Popen(  # our own snippet, this image's Python
            cmd,
            env=dict(environ),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
    except OSError as exc:
        return {"env_error": f"the engine's Python did not start: {exc}"[:300]}
    out = _read_capped(proc)
    if out is None:
        return {"env_error": f"the engine's Python did not answer within {ENGINE_TIMEOUT_S:.0f} s"}
    if len(out) > MAX_ENGINE_OUTPUT:
        return {"env_error": f"the engine's answer is over {MAX_ENGINE_OUTPUT} bytes"}
    try:
        doc = json.loads(out.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        return {"env_error": f"the engine's Python exited {proc.returncode} without an answer"}
    return doc if isinstance(doc, dict) else {"env_error": "the engine's answer is not an object"}


def _read_capped(proc: subprocess.Popen[bytes]) -> bytes | None:
    """Read at most MAX_ENGINE_OUTPUT + 1 bytes within ENGINE_TIMEOUT_S; None on the timeout.

    The child is killed when it says more or takes longer, and always reaped.
    """
    got: list[bytes] = []
    assert proc.stdout is not None  # noqa: S101 - opened with stdout=PIPE

    def read() -> None:
        assert proc.stdout is not None  # noqa: S101 - as above
        got.append(proc.stdout.read(MAX_ENGINE_OUTPUT + 1))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(ENGINE_TIMEOUT_S)
    timed_out = reader.is_alive()
    if timed_out or (got and len(got[0]) > MAX_ENGINE_OUTPUT):
        proc.kill()
    reader.join()
    proc.stdout.close()
    proc.wait()
    if timed_out:
        return None
    return got[0] if got else b""


@dataclass(frozen=True)
class PodInputs:
    """What the caller knows of the pod: its environment and engine arguments, and hints.

    ``engine``: the output of :func:`engine_factors` (computed when None);
    ``gpu_name``: a node label's value (else NVML); ``relocations``:
    ``(recorded prefix, pod prefix)`` pairs for traced files (another venv);
    ``groups``: whole factor groups the engine's image computed itself
    (``config``, ``compiler``; :func:`read_groups`), compared whole;
    ``python``: the engine's interpreter, when artifactd runs under another.
    """

    environ: Mapping[str, str]
    argv: tuple[str, ...] = ()
    model_dir: Path | None = None
    gpu_name: str | None = None
    relocations: tuple[tuple[str, str], ...] = ()
    engine: Mapping[str, Any] | None = None
    groups: Mapping[str, Any] = field(default_factory=dict)
    python: str | None = None


def pod_factors(inputs: PodInputs, *, torch: bool = True) -> PodFactors:
    """Gather the pod's side of every factor group (see the module doc for what needs the image).

    ``torch``: import torch in the child for ``torch_key`` (seconds); only
    records that keep the compiler group raw (0.34's) can use it.
    """
    engine = inputs.engine
    if engine is None:
        python = inputs.python or sys.executable
        engine = engine_factors(inputs.environ, python=python, torch=torch)
    why: dict[str, str] = {}
    env = engine.get("env")
    if not isinstance(env, Mapping):
        env = None
        why["env"] = "vLLM's env factors not computed in this image: " + str(
            engine.get("env_error", "no answer")
        )
    compiler: dict[str, Any] = {}
    gpu = inputs.gpu_name or nvml_gpu_name()
    if gpu:
        compiler["device.name"] = gpu
    for key, leaf in (("torch_key", "torch_key"), ("cuda", "version.cuda")):
        if isinstance(engine.get(key), str):
            compiler[leaf] = engine[key]
    why["compiler"] = "Inductor's and functorch's config need the engine's torch config"
    why["config"] = "the other compile factors need the engine to build its config"
    whole = {k: v for k, v in inputs.groups.items() if isinstance(v, Mapping)}
    return PodFactors(
        env=env,
        config=whole.get("config"),
        compiler=whole.get("compiler"),
        config_hash=_text_or_none(inputs.groups.get("config_hash")),
        compiler_hash=_text_or_none(inputs.groups.get("compiler_hash")),
        config_leaves=config_leaves(inputs.argv, inputs.model_dir),
        compiler_leaves=compiler,
        read_file=read_traced,
        relocations=inputs.relocations,
        site_packages=tuple(
            str(p) for p in engine.get("site_packages", ())[:MAX_SITES] if isinstance(p, str)
        ),
        why=why,
        classify=classify_factor,
    )


def _text_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None
