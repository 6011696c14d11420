"""Predict the engine's own compile-cache hit before it starts (``artifactd predict``).

Runs in an init container from the engine's own image, CPU only, with the
pod's command line and environment. For each vLLM compile cache entry (a
``torch_compile_cache/<key>`` dir with its ``cache_key_factors.json``, read
from a cache root on disk or from an artifact's config, never its layers) it
first recomputes ``<key>`` from the recorded factors (an unknown recipe is
said, never guessed: :func:`artifactd.families.vllmkey.self_check`), then
checks each factor group against what this pod gives (gathered by
:mod:`artifactd.restore.engineside`):

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
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from artifactd.errors import ConfigError, NotFoundError
from artifactd.events import EventSink, discard
from artifactd.families import vllmkey
from artifactd.families.vllm import MAX_FACTORS_BYTES, read_factors
from artifactd.families.vllmkey import FactorCheck, PodFactors
from artifactd.fsutil import InputFileError, read_regular
from artifactd.restore.engineside import PodInputs, pod_factors

PredictedOutcome = Literal["hit", "miss", "unknown"]

#: Most cache entries predicted from one source (the rest are counted as unknown).
MAX_ENTRIES = 256
#: The family whose engine key is predicted.
FAMILY = "vllm"


@dataclass(frozen=True)
class EntryPrediction:
    """The prediction for one cache entry (a hash dir) of one family."""

    family: str
    entry: str
    outcome: PredictedOutcome
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
    def outcome(self) -> PredictedOutcome:
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
