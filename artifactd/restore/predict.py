"""Predict the engine's own compile-cache hit before it starts (``artifactd predict``).

Runs in an init container from the engine's own image, CPU only, with the
pod's command line and environment. For each vLLM compile cache entry (a
``torch_compile_cache/<key>`` dir with its ``cache_key_factors.json``, read
from a cache root on disk or from an artifact's config, never its layers) it
first recomputes ``<key>`` from the recorded factors (an unknown recipe is
said, never guessed: :func:`artifactd.families.vllmkey.self_check`), then
checks each factor group against what this pod gives:

* env: vLLM's own ``vllm.envs.compile_factors()`` run in this image's Python
  under the pod's environment (needs the engine's image: vLLM importable);
* code: each recorded traced file re-hashed here (missing, moved, changed);
* compiler: GPU name from NVML or ``--gpu-name`` (a node label), never a CUDA
  context; ``torch_key`` and CUDA from this image's torch (imported in a
  child process: CPU only; needs the engine's image);
* config: ``max_num_batched_tokens``, ``dtype``, the parallel layout and the
  model from the engine's arguments and the model's ``config.json``; what
  cannot be rebuilt without the engine stays ``unknown``.

An entry ``will hit`` when every group matches, ``will miss`` naming each
factor that differs, or is ``unknown`` with the reason. The pod hits when
any entry hits. Triton and Inductor per-graph entries are not predicted
(their keys hash each graph and kernel source); the whole-component checks
here (``torch_key``, GPU, CUDA) are coarse.
"""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from artifactd.errors import ConfigError, NotFoundError
from artifactd.events import EventSink, discard
from artifactd.families import vllmkey
from artifactd.families.vllm import MAX_FACTORS_BYTES, read_factors
from artifactd.families.vllmkey import FactorCheck, PodFactors
from artifactd.fsutil import InputFileError, read_regular

Outcome = Literal["hit", "miss", "unknown"]

#: The largest traced source file re-hashed (vLLM's model files are well under this).
MAX_TRACED_FILE_BYTES = 16 << 20
#: Most cache entries predicted from one source (the rest are counted as unknown).
MAX_ENTRIES = 256
#: Most bytes read from the engine's helper process.
MAX_ENGINE_OUTPUT = 4 << 20
#: Ceiling on the engine's helper process (importing torch takes seconds).
ENGINE_TIMEOUT_S = 120.0
#: Most site-packages dirs of the engine's Python tried for a moved traced file.
MAX_SITES = 16
#: The family whose engine key is predicted.
FAMILY = "vllm"

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


@dataclass(frozen=True)
class EntryPrediction:
    """The prediction for one cache entry (a hash dir) of one family."""

    family: str
    entry: str
    outcome: Outcome
    recipe: str | None = None
    checks: tuple[FactorCheck, ...] = ()
    reason: str = ""

    def line(self) -> str:
        """Say ``will hit``, ``will miss: <factor>: <recorded> -> <pod>; ...`` or ``unknown``."""
        if self.outcome == "hit":
            return "will hit"
        if self.outcome == "miss":
            named = [d.describe() for c in self.checks for d in c.differences]
            return "will miss: " + "; ".join(named)
        return f"unknown: {self.reason}"


@dataclass(frozen=True)
class Prediction:
    """What ``predict`` found: one entry per cache entry; ``outcome`` is the pod's."""

    source: str
    entries: tuple[EntryPrediction, ...]
    notes: tuple[str, ...] = ()

    @property
    def outcome(self) -> Outcome:
        """``hit`` if any entry hits, ``miss`` if every entry misses, else ``unknown``."""
        if any(e.outcome == "hit" for e in self.entries):
            return "hit"
        if self.entries and all(e.outcome == "miss" for e in self.entries):
            return "miss"
        return "unknown"


COARSE_NOTE = (
    "triton, inductor: per-kernel and per-graph keys are not predicted (they hash each"
    " graph and kernel source); only the whole-component factors above (torch_key, GPU"
    " name, CUDA) are checked, which is coarse"
)


def predict_entry(name: str, doc: Mapping[str, Any], pod: PodFactors) -> EntryPrediction:
    """Self-check one recorded entry, then compare it with ``pod``."""
    recipe = vllmkey.self_check(name, doc)
    if recipe is None:
        return EntryPrediction(
            FAMILY,
            name,
            "unknown",
            reason="unknown recipe: no hash recipe artifactd knows recomputes this dir name"
            " from its recorded factors (another vLLM release?)",
        )
    checks = tuple(vllmkey.compare(doc, recipe, pod))
    status = vllmkey.verdict(checks)
    if status == "match":
        return EntryPrediction(FAMILY, name, "hit", recipe, checks)
    if status == "differs":
        return EntryPrediction(FAMILY, name, "miss", recipe, checks)
    why = "; ".join(f"{c.group}: {c.reason}" for c in checks if c.status == "unknown")
    return EntryPrediction(FAMILY, name, "unknown", recipe, checks, reason=why)


def predict(
    recorded: Mapping[str, Mapping[str, Any]],
    pod: PodFactors,
    *,
    source: str,
    events: EventSink = discard,
) -> Prediction:
    """Predict every recorded entry (``{hash dir name: factors}``) for ``pod``; emit one event."""
    entries: list[EntryPrediction] = []
    for name in sorted(recorded)[:MAX_ENTRIES]:
        entries.append(predict_entry(name, recorded[name], pod))
    if len(recorded) > MAX_ENTRIES:
        entries.append(
            EntryPrediction(
                FAMILY,
                f"... {len(recorded) - MAX_ENTRIES} more",
                "unknown",
                reason=f"more than {MAX_ENTRIES} entries: not predicted",
            )
        )
    result = Prediction(source, tuple(entries), (COARSE_NOTE,))
    events(
        {
            "stage": "predict",
            "event": "predicted",
            "source": source,
            "outcome": result.outcome,
            "entries": {e.entry: e.outcome for e in entries},
        }
    )
    return result


# --------------------------------------------------------------------------
# The recorded side: a cache root on disk, or an artifact's config
# --------------------------------------------------------------------------


def recorded_from_root(root: Path) -> dict[str, dict[str, Any]]:
    """``{hash dir: factors}`` under a ``VLLM_CACHE_ROOT`` (files capped, regular only)."""
    return read_factors(root)


def recorded_from_facts(facts: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``{hash dir: factors}`` from the vLLM layer's recorded facts in an artifact's config."""
    found = facts.get("cache", {}).get("cache_key_factors", {})
    if not isinstance(found, Mapping):
        return {}
    return {str(k): dict(v) for k, v in found.items() if isinstance(v, Mapping)}


def recorded_from_ref(ref: str, *, insecure: bool = False) -> dict[str, dict[str, Any]]:
    """Read an artifact's config (never a layer) and return its vLLM entries' factors."""
    # lazy: only --from reads a store; a prediction from a cache root never loads one
    from artifactd.stores import open_store, parse_manifest_ref  # noqa: PLC0415
    from artifactd.stores.artifacts import read_artifact  # noqa: PLC0415  # lazy: as above

    store, reference = parse_manifest_ref(ref)
    with open_store(store, insecure=insecure) as st:
        art = read_artifact(st, reference)
    if art is None:
        raise NotFoundError(f"{store} has no artifact {reference}")
    out: dict[str, dict[str, Any]] = {}
    for rec in art.config.layers:
        if rec.family == FAMILY:
            out.update(recorded_from_facts(rec.facts))
    return out


# --------------------------------------------------------------------------
# The pod's side
# --------------------------------------------------------------------------


def read_traced(path: str) -> str | None:
    """Return a traced file's text as vLLM reads it; None: missing, not regular, too big."""
    try:
        return read_regular(path, MAX_TRACED_FILE_BYTES, follow=True).decode("utf-8")
    except (InputFileError, OSError, UnicodeDecodeError):
        return None


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
    records that keep the compiler group raw (main's) can use it.
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
    )


def _text_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def read_groups(path: Path) -> dict[str, Any]:
    """Read ``--engine-factors FILE``: a JSON object of whole groups the engine's image computed.

    Keys ``config``, ``compiler`` (objects, as vLLM records them) and
    ``config_hash``, ``compiler_hash`` (vLLM 0.33's strings); a regular file of
    at most :data:`~artifactd.families.vllm.MAX_FACTORS_BYTES`.
    """
    try:
        doc = json.loads(read_regular(path, MAX_FACTORS_BYTES).decode("utf-8"))
    except InputFileError as exc:
        raise ConfigError(str(exc), hint="pass a JSON file the engine's image wrote") from None
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ConfigError(
            f"{path}: not a JSON document ({exc})", hint="pass a JSON object"
        ) from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: not a JSON object", hint="pass a JSON object")
    return {k: doc[k] for k in ("config", "compiler", "config_hash", "compiler_hash") if k in doc}


def _check_root(root: Path) -> None:
    """Refuse a cache root that is not a directory this user can list (exit 2, with the reason)."""
    try:
        mode = root.stat().st_mode
        if stat.S_ISDIR(mode):
            next(iter(root.iterdir()), None)
            return
        why = "is not a directory"
    except OSError as exc:
        why = f"cannot be read ({exc.strerror or exc})"
    raise ConfigError(f"{root} {why}", hint="pass the VLLM_CACHE_ROOT to check (--cache-root)")


def run_predict(
    *,
    cache_root: Path | None,
    ref: str | None,
    inputs: PodInputs,
    insecure: bool = False,
    events: EventSink = discard,
) -> Prediction:
    """``artifactd predict``: read the recorded factors, gather the pod's, predict."""
    if (cache_root is None) == (ref is None):
        raise ConfigError(
            "predict needs exactly one of a cache root and an artifact reference",
            hint="pass --cache-root DIR (a VLLM_CACHE_ROOT) or --from REF",
        )
    if ref is None:
        assert cache_root is not None  # noqa: S101 - one of the two, checked above
        _check_root(cache_root)
        recorded = recorded_from_root(cache_root)
        source = str(cache_root)
    else:
        recorded = recorded_from_ref(ref, insecure=insecure)
        source = ref
    if not recorded:
        events({"stage": "predict", "event": "predicted", "source": source, "outcome": "unknown"})
        return Prediction(
            source,
            (
                EntryPrediction(
                    FAMILY,
                    "-",
                    "unknown",
                    reason="no vLLM compile cache entry with recorded factors",
                ),
            ),
            (COARSE_NOTE,),
        )
    torch = any(isinstance(doc.get("compiler"), Mapping) for doc in recorded.values())
    return predict(recorded, pod_factors(inputs, torch=torch), source=source, events=events)
