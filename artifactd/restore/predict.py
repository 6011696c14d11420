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

``restore --predict`` asks the same before it downloads anything:
:func:`predict_restore` reads the vLLM layer's recorded factors from the
resolved artifact's config (the plan holds it; no layer is fetched), or, for
a no-op restore, from the caches already in the target.

An entry ``will hit`` when every group matches, ``will miss`` naming each
factor that differs, or is ``unknown`` with the reason. The pod hits when
any entry hits. Triton and Inductor per-graph entries are not predicted
(their keys hash each graph and kernel source); the whole-component checks
here (``torch_key``, GPU, CUDA) are coarse.
"""

from __future__ import annotations

import json
import shlex
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from artifactd.errors import ConfigError, NotFoundError, PredictedMissError, UsageError
from artifactd.events import EventSink, discard
from artifactd.families import vllmkey
from artifactd.families.vllm import MAX_FACTORS_BYTES, read_factors
from artifactd.families.vllmkey import FactorCheck, PodFactors
from artifactd.fsutil import InputFileError, read_regular
from artifactd.restore.engineside import PodInputs, pod_factors

if TYPE_CHECKING:
    from artifactd.restore.resolve import RestorePlan

PredictedOutcome = Literal["hit", "miss", "unknown"]

#: Most cache entries predicted from one source (the rest are counted as unknown).
MAX_ENTRIES = 256
#: The family whose engine key is predicted.
FAMILY = "vllm"
#: The vLLM family's component that is a ``VLLM_CACHE_ROOT`` (a plan's dirs are by component).
CACHE_COMPONENT = "cache"
#: Most --relocate pairs (each is tried for every traced file missing at its path).
MAX_RELOCATIONS = 64
#: Longest ``--engine-args`` string, and most arguments it may split into.
MAX_ENGINE_ARGS_CHARS = 64 << 10
MAX_ENGINE_ARGS = 4096


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
            "lines": {e.entry: e.line()[: vllmkey.MAX_VALUE_CHARS] for e in entries},
        }
    )
    return result


def recorded_from_root(root: Path) -> dict[str, dict[str, Any]]:
    """``{hash dir: factors}`` under a ``VLLM_CACHE_ROOT`` (files capped, regular only)."""
    return read_factors(root)


def recorded_from_facts(facts: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``{hash dir: factors}`` from the vLLM layer's recorded facts in an artifact's config.

    A 0.33 entry's traced-file list the build recovered rides with its
    factors under :data:`~artifactd.families.vllmkey.TRACED_KEY`.
    """
    cache = facts.get("cache", {})
    found = cache.get("cache_key_factors", {}) if isinstance(cache, Mapping) else {}
    if not isinstance(found, Mapping):
        return {}
    traced = cache.get("traced_files", {})
    traced = traced if isinstance(traced, Mapping) else {}
    out: dict[str, dict[str, Any]] = {}
    for name, doc in found.items():
        if isinstance(doc, Mapping):
            out[str(name)] = dict(doc)
            if isinstance(traced.get(name), Mapping):
                out[str(name)][vllmkey.TRACED_KEY] = dict(traced[name])
    return out


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
    return predict_recorded(recorded, inputs, source=source, events=events)


def predict_recorded(
    recorded: Mapping[str, Mapping[str, Any]],
    inputs: PodInputs,
    *,
    source: str,
    events: EventSink = discard,
    none_why: str = "no vLLM compile cache entry with recorded factors",
) -> Prediction:
    """Gather the pod's factors (only when there is something to compare) and predict."""
    if not recorded:
        return _nothing(source, none_why, events)
    torch = any(isinstance(doc.get("compiler"), Mapping) for doc in recorded.values())
    return predict(recorded, pod_factors(inputs, torch=torch), source=source, events=events)


def _nothing(source: str, why: str, events: EventSink) -> Prediction:
    entry = EntryPrediction(FAMILY, "-", "unknown", reason=why)
    events(
        {
            "stage": "predict",
            "event": "predicted",
            "source": source,
            "outcome": "unknown",
            "entries": {"-": "unknown"},
            "lines": {"-": entry.line()},
        }
    )
    return Prediction(source, (entry,), (COARSE_NOTE,))


@dataclass(frozen=True)
class PredictOptions:
    """``restore --predict``: what the pod gives, and whether a miss stops the restore."""

    inputs: PodInputs
    #: ``--require-hit``: nothing is installed and the restore exits 17 unless it will hit.
    require_hit: bool = False


def predict_restore(plan: RestorePlan, inputs: PodInputs, *, events: EventSink) -> Prediction:
    """``restore --predict``: predict from what the plan resolved, before any layer is fetched.

    A vLLM layer the plan will install: its recorded factors, from the
    artifact's config (already read to resolve it). A no-op restore: the
    caches in the target (:func:`recorded_from_root`). No vLLM hit: unknown.
    """
    fam = next((f for f in plan.families if f.family == FAMILY), None)
    if fam is None or fam.verdict != "hit":
        why = fam.reason if fam is not None and fam.reason else "not selected"
        return _nothing(
            plan.store, f"this restore installs no vLLM cache ({why})"[:MAX_REASON], events
        )
    source = f"{plan.store}@{fam.artifact}" if fam.artifact else plan.store
    if fam.layer is not None:
        recorded = recorded_from_facts(fam.layer.facts)
    else:
        root = fam.dirs.get(CACHE_COMPONENT)
        recorded = recorded_from_root(Path(root)) if root else {}
        source = root or source
    return predict_recorded(
        recorded,
        inputs,
        source=source,
        events=events,
        none_why="the vLLM cache restored holds no compile cache entry with recorded factors",
    )


#: Longest reason carried in an event.
MAX_REASON = 400


def miss_error(result: Prediction) -> PredictedMissError:
    """Return the error ``--require-hit`` raises (exit 17) when ``result`` is not a hit."""
    misses = [e.line() for e in result.entries]
    return PredictedMissError(
        f"the engine will not hit its compile cache ({result.outcome}): "
        + " | ".join(misses)[:2000],
        hint="fix the factor named (or rebuild the artifact for this pod); "
        "drop --require-hit to start anyway",
    )


def parse_relocations(values: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """Read ``--relocate OLD=NEW`` values: absolute path pairs, :data:`MAX_RELOCATIONS` at most."""
    if len(values) > MAX_RELOCATIONS:
        raise UsageError(
            f"{len(values)} --relocate pairs: at most {MAX_RELOCATIONS}",
            hint="name the venv or site-packages roots, not each file",
        )
    out = []
    for value in values:
        old, eq, new = value.partition("=")
        if not eq or not old.startswith("/") or not new.startswith("/"):
            raise UsageError(
                f"--relocate {value!r} is not OLD=NEW with two absolute paths",
                hint="e.g. --relocate /opt/venv-build=/opt/venv",
            )
        out.append((old, new))
    return tuple(out)


def engine_argv(args: Sequence[str], text: str | None) -> tuple[str, ...]:
    """Return the engine's command line: the arguments after ``--``, else ``--engine-args``."""
    if args or not text:
        return tuple(args)
    if len(text) > MAX_ENGINE_ARGS_CHARS:
        raise UsageError(
            f"--engine-args is {len(text)} characters: at most {MAX_ENGINE_ARGS_CHARS}",
            hint="pass the engine's own command line, not a script",
        )
    try:
        argv = shlex.split(text)
    except ValueError as exc:
        raise UsageError(
            f"--engine-args cannot be split as a shell would ({exc})",
            hint="close the quotes: 'vllm serve /models/m --max-num-batched-tokens 8192'",
        ) from None
    if len(argv) > MAX_ENGINE_ARGS:
        raise UsageError(
            f"--engine-args has {len(argv)} arguments: at most {MAX_ENGINE_ARGS}",
            hint="pass the engine's own command line",
        )
    return tuple(argv)


def pod_inputs(
    *,
    environ: Mapping[str, str],
    args: Sequence[str] = (),
    engine_args_text: str | None = None,
    gpu_name: str | None = None,
    model_dir: Path | None = None,
    relocate: Sequence[str] = (),
    engine_factors: Path | None = None,
    engine_python: str | None = None,
) -> PodInputs:
    """Read the pod's side from the options ``predict`` and ``restore --predict`` share."""
    return PodInputs(
        environ=environ,
        argv=engine_argv(args, engine_args_text),
        model_dir=model_dir,
        gpu_name=gpu_name,
        relocations=parse_relocations(relocate),
        groups=read_groups(engine_factors) if engine_factors is not None else {},
        python=engine_python,
    )
