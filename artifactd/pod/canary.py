"""The canary: record what the engine computes at build, replay and compare it before ready.

The one owner of the canary's rules, used by a build's serve cells (record),
``verify`` (replay on its re-run of the cells) and ``status --canary`` (replay
in the pod, before it is ready):

* **one request**: every prompt of the canary goes in one
  ``POST /v1/completions`` (a list of prompts, ``temperature`` 0, the
  canary's ``seed``, ``logprobs`` = ``top_k``, ``return_token_ids``, vLLM's
  names), the whole exchange within the canary's ``deadline_s`` and its answer
  at most :data:`MAX_ANSWER_BYTES`;
* **the record** per prompt (:func:`observe`): the prompt's token ids, the
  greedy token ids, and a sha256 over the top-k logprobs of each generated
  token rounded to ``precision`` decimal places (:func:`logprobs_digest`);
  a logprob that is not finite is NaN output, never hashed;
* **the comparison** (:func:`compare`), in one of two modes:

  - *exact*, when the replay runs on the GPU model, driver and engine version
    the canary was recorded on (a replayed artifact is bit-identical there):
    equal ids and digests are ``verified``; equal ids and another digest are
    ``drift`` (ready, with a warning); other ids, NaN, an empty answer or
    an error are ``failed``, naming the prompt and the first differing token;
  - *tolerance*, anywhere else (another GPU, a driver or an engine version
    that differs: autotuning picks other kernels, so bitwise equality means
    nothing there): ``verified`` when the share of generated tokens equal to
    the recording's, position by position, is at least the canary's
    ``match_rate`` and nothing is NaN; ``failed`` otherwise. The result says
    which mode applied and why.

The engine is someone else's and may misbehave: nothing here hangs (one
deadline), reads an unbounded answer, or raises for what the engine answers;
an engine problem is a ``failed`` result that says what happened.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from artifactd.boundedhttp import ExchangeError, exchange, redact_url
from artifactd.bounds import MAX_CANARY_BYTES
from artifactd.errors import ArtifactdError, SchemaError, UsageError
from artifactd.events import EventSink, discard
from artifactd.fingerprint.probe import probe_gpu_nvml
from artifactd.format.canary import (
    Canary,
    CanaryPrompt,
    CanarySpec,
    RecordedOn,
    RestoredCanaries,
)
from artifactd.fsutil import InputFileError, read_regular
from artifactd.restore.destination import CacheVolume
from artifactd.stores.nodestore import node_root, quarantine

if TYPE_CHECKING:
    from artifactd.pod.readiness import Readiness

#: Largest answer read for the canary request (a few prompts of at most 64 tokens).
MAX_ANSWER_BYTES = 4 << 20
#: Largest answer read from ``GET /version``.
VERSION_MAX_BYTES = 64 << 10
#: ``GET /version`` may take this long (an engine that does not serve it is "unknown").
VERSION_TIMEOUT_S = 2.0
#: Most logprob entries read per generated token: ``top_k`` and the chosen
#: token (vLLM adds it when it is not among the top k).
_EXTRA_ENTRIES = 1

Outcome = Literal["verified", "drift", "failed"]
Mode = Literal["exact", "tolerance"]


class CanaryAnswerError(Exception):
    """The engine's answer to the canary request is not usable (says why)."""


@dataclass(frozen=True)
class Observed:
    """What the engine answered for one prompt (``error`` set: nothing usable)."""

    prompt_ids: list[int] = field(default_factory=list)
    greedy_ids: list[int] = field(default_factory=list)
    logprobs_sha256: str | None = None
    nan: bool = False
    error: str | None = None


@dataclass(frozen=True)
class CanaryResult:
    """A replay's verdict.

    ``outcome``: ``verified``, ``drift`` (ready, with a warning) or ``failed``;
    ``mode``: ``exact`` or ``tolerance`` (``mode_why`` says what differs from
    the recording). ``why`` explains anything but a plain ``verified``;
    ``prompt``/``token`` name the first prompt and token index that differ
    (``expected``/``got`` the token ids there). ``match_rate`` is the share of
    generated tokens equal to the recording's.
    """

    outcome: Outcome
    mode: Mode
    why: str | None
    match_rate: float
    seconds: float
    recorded_on: RecordedOn
    replayed_on: RecordedOn
    mode_why: str | None = None
    prompt: str | None = None
    token: int | None = None
    expected: int | None = None
    got: int | None = None

    @property
    def ready(self) -> bool:
        """Whether the pod may serve: ``verified`` or ``drift``."""
        return self.outcome != "failed"


def request_body(spec: CanarySpec, model: str) -> dict[str, Any]:
    """Return the one canary request's body (OpenAI ``/v1/completions``, vLLM's extra fields)."""
    return {
        "model": model,
        "prompt": spec.texts(),
        "max_tokens": spec.tokens,
        "temperature": 0,
        "seed": spec.seed,
        "logprobs": spec.top_k,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
    }


def _rounded(value: float, precision: int) -> str:
    text = f"{value:.{precision}f}"
    # -0.0000 and 0.0000 are the same logprob.
    return text.lstrip("-") if text.lstrip("-").strip("0.") == "" else text


def logprobs_digest(top: list[dict[str, float]], precision: int) -> str | None:
    """SHA-256 of the rounded top-k logprobs, token by token; None if any is not finite.

    Each position's entries are sorted by token, each value written with
    ``precision`` decimal places: canonical JSON of ``[[[token, "value"], ...], ...]``.
    """
    rows = []
    for entries in top:
        row = []
        for token in sorted(entries):
            value = entries[token]
            if value - value != 0:  # NaN or an infinity
                return None
            row.append([token, _rounded(value, precision)])
        rows.append(row)
    data = json.dumps(rows, separators=(",", ":"), ensure_ascii=False).encode()
    return hashlib.sha256(data).hexdigest()


def _ids(value: Any, what: str, cap: int) -> list[int]:
    if not isinstance(value, list) or len(value) > cap:
        raise CanaryAnswerError(f"{what} is not a list of at most {cap} token ids")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        raise CanaryAnswerError(f"{what} holds something that is not a token id")
    return list(value)


def _parse_choice(choice: Any, spec: CanarySpec) -> Observed:
    """One choice of the answer, checked and bounded; raise CanaryAnswerError."""
    if not isinstance(choice, dict):
        raise CanaryAnswerError("a choice is not an object")
    prompt_ids = _ids(choice.get("prompt_token_ids"), "prompt_token_ids", 1 << 20)
    greedy = _ids(choice.get("token_ids"), "token_ids", spec.tokens)
    if not prompt_ids:
        raise CanaryAnswerError(
            "no prompt_token_ids in the answer (the engine must honour return_token_ids)"
        )
    logprobs = choice.get("logprobs")
    top = logprobs.get("top_logprobs") if isinstance(logprobs, dict) else None
    if not isinstance(top, list) or len(top) != len(greedy):
        raise CanaryAnswerError(
            "logprobs.top_logprobs is not one entry per generated token "
            "(the engine must honour `logprobs`)"
        )
    parsed: list[dict[str, float]] = []
    for entries in top:
        if not isinstance(entries, dict) or len(entries) > spec.top_k + _EXTRA_ENTRIES:
            raise CanaryAnswerError(f"a top_logprobs entry is not at most {spec.top_k} logprobs")
        row: dict[str, float] = {}
        for token, value in entries.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise CanaryAnswerError("a logprob is not a number")
            row[str(token)[:64]] = float(value)
        parsed.append(row)
    digest = logprobs_digest(parsed, spec.precision)
    return Observed(prompt_ids[: 1 << 12], greedy, digest, nan=digest is None)


def observe(base_url: str, model: str, spec: CanarySpec) -> list[Observed]:
    """Send the canary's one request; return one :class:`Observed` per prompt.

    Never raises for what the engine does: no answer, an error status or an
    answer of the wrong shape gives every prompt an ``error``.
    """
    texts = spec.texts()
    url = base_url.rstrip("/") + "/v1/completions"
    data = json.dumps(request_body(spec, model)).encode()
    try:
        answer = exchange(
            url,
            method="POST",
            body=data,
            headers={"Content-Type": "application/json"},
            timeout_s=spec.deadline_s,
            max_bytes=MAX_ANSWER_BYTES,
        )
        if answer.status != 200:
            head = answer.body[:300].decode(errors="replace").strip()
            raise CanaryAnswerError(f"HTTP {answer.status}: {head}")
        try:
            doc = json.loads(answer.body)
        except ValueError:
            raise CanaryAnswerError("the answer is not JSON") from None
        choices = doc.get("choices") if isinstance(doc, dict) else None
        if not isinstance(choices, list) or len(choices) != len(texts):
            raise CanaryAnswerError(f"the answer does not hold {len(texts)} choice(s)")
        ordered = sorted(choices, key=lambda c: c.get("index", 0) if isinstance(c, dict) else 0)
        return [_parse_choice(c, spec) for c in ordered]
    except ExchangeError as exc:
        what = f"POST {redact_url(url)}: no answer ({exc.why})"
    except UsageError as exc:
        what = exc.message
    except CanaryAnswerError as exc:
        what = f"POST {redact_url(url)}: {exc}"
    return [Observed(error=what) for _ in texts]


def engine_version(base_url: str) -> str | None:
    """Return what the engine's ``GET /version`` says (vLLM's ``{"version": ...}``), or None."""
    try:
        answer = exchange(
            base_url.rstrip("/") + "/version",
            timeout_s=VERSION_TIMEOUT_S,
            max_bytes=VERSION_MAX_BYTES,
        )
        doc = json.loads(answer.body) if answer.status == 200 else None
    except (ArtifactdError, ValueError):
        return None
    version = doc.get("version") if isinstance(doc, dict) else None
    return version[:256] if isinstance(version, str) else None


def here(base_url: str) -> RecordedOn:
    """Return the node's GPU model and driver (NVML; None without a GPU), the engine's version."""
    gpu = driver = None
    probed = probe_gpu_nvml()
    if probed is not None:
        raw_gpu, raw_driver, _ = probed
        gpu, driver = raw_gpu.get("name"), raw_driver.get("version")
    return RecordedOn(
        gpu=gpu if isinstance(gpu, str) else None,
        driver=driver if isinstance(driver, str) else None,
        engine=engine_version(base_url),
    )


def record(base_url: str, model: str, spec: CanarySpec, cell: str) -> Canary:
    """Record the canary of ``cell`` from the engine at ``base_url``.

    Raises :class:`CanaryAnswerError` naming the prompt when the engine's
    answer is unusable (an error, NaN, an empty completion): a canary is only
    recorded from a healthy engine.
    """
    on = here(base_url)
    prompts = []
    answers = observe(base_url, model, spec)
    for i, (text, seen) in enumerate(zip(spec.texts(), answers, strict=True)):
        if seen.error is not None:
            raise CanaryAnswerError(seen.error)
        if seen.nan or seen.logprobs_sha256 is None:
            raise CanaryAnswerError(f"prompt p{i}: the engine's logprobs are NaN")
        if not seen.greedy_ids:
            raise CanaryAnswerError(f"prompt p{i}: the engine generated no token")
        prompts.append(
            CanaryPrompt(
                id=f"p{i}",
                text=text,
                prompt_ids=seen.prompt_ids,
                greedy_ids=seen.greedy_ids,
                logprobs_sha256=seen.logprobs_sha256,
            )
        )
    return Canary(cell=cell, model=model, spec=spec, prompts=prompts, recorded_on=on)


def _differs(recorded: RecordedOn, replayed: RecordedOn) -> str | None:
    diffs = [
        f"{name} {getattr(recorded, name)!r} here {getattr(replayed, name)!r}"
        for name in ("gpu", "driver", "engine")
        if getattr(recorded, name) != getattr(replayed, name)
    ]
    return "recorded on " + ", ".join(diffs) if diffs else None


def compare(
    canary: Canary, observed: list[Observed], replayed_on: RecordedOn, seconds: float = 0.0
) -> CanaryResult:
    """Judge a replay against the recording (the module's rules, one owner)."""
    mode_why = _differs(canary.recorded_on, replayed_on)
    total = sum(len(p.greedy_ids) for p in canary.prompts)
    equal = sum(
        sum(1 for a, b in zip(p.greedy_ids, seen.greedy_ids, strict=False) if a == b)
        for p, seen in zip(canary.prompts, observed, strict=False)
    )
    rate = round(equal / total, 4) if total else 0.0
    common: dict[str, Any] = {
        "mode": "tolerance" if mode_why else "exact",
        "mode_why": mode_why,
        "match_rate": rate,
        "seconds": round(seconds, 3),
        "recorded_on": canary.recorded_on,
        "replayed_on": replayed_on,
    }
    broken = _broken(canary, observed)
    if broken is not None:
        return CanaryResult("failed", why=broken[1], prompt=broken[0], **common)
    if mode_why:
        need = canary.spec.match_rate
        if rate >= need:
            why = f"tolerance check: {rate:.2%} of tokens match (at least {need:.2%} needed)"
            return CanaryResult("verified", why=f"{why}, no NaN; {mode_why}", **common)
        why = f"tolerance check: {rate:.2%} of tokens match, under the {need:.2%} needed"
        return CanaryResult("failed", why=f"{why}; {mode_why}", **common)
    return _exact(canary, observed, common)


def _broken(canary: Canary, observed: list[Observed]) -> tuple[str | None, str] | None:
    """(prompt id, why) for an answer no mode accepts: an error, NaN, an empty output."""
    if len(observed) != len(canary.prompts):
        return None, "the replay answered another number of prompts"
    for p, seen in zip(canary.prompts, observed, strict=True):
        if seen.error is not None:
            return p.id, f"prompt {p.id}: {seen.error}"
        if seen.nan:
            return p.id, f"prompt {p.id}: NaN in the engine's logprobs"
        if not seen.greedy_ids:
            return p.id, f"prompt {p.id}: empty output"
    return None


def _exact(canary: Canary, observed: list[Observed], common: dict[str, Any]) -> CanaryResult:
    """Compare exactly: the ids, then the logprobs digest."""
    for p, seen in zip(canary.prompts, observed, strict=True):
        if seen.prompt_ids != p.prompt_ids:
            why = f"prompt {p.id}: the engine tokenised it into other ids (another tokenizer?)"
            return CanaryResult("failed", why=why, prompt=p.id, **common)
        if seen.greedy_ids != p.greedy_ids:
            pairs = zip(p.greedy_ids, seen.greedy_ids, strict=False)
            at = next(
                (i for i, (a, b) in enumerate(pairs) if a != b),
                min(len(p.greedy_ids), len(seen.greedy_ids)),
            )
            want = p.greedy_ids[at] if at < len(p.greedy_ids) else None
            got = seen.greedy_ids[at] if at < len(seen.greedy_ids) else None
            why = f"prompt {p.id}: token {at} is {got}, the recording has {want}"
            return CanaryResult(
                "failed", why=why, prompt=p.id, token=at, expected=want, got=got, **common
            )
    for p, seen in zip(canary.prompts, observed, strict=True):
        if seen.logprobs_sha256 != p.logprobs_sha256:
            why = (
                f"prompt {p.id}: same tokens, other logprobs (their digest at "
                f"{canary.spec.precision} decimal places differs)"
            )
            return CanaryResult("drift", why=why, prompt=p.id, **common)
    return CanaryResult("verified", why=None, **common)


def restored_canary(
    target: Path, cell: str | None = None, *, env_file: Path | None = None
) -> tuple[Canary | None, str | None, str | None]:
    """Return the canary the restore into ``target`` installed, the artifact's digest, and why not.

    Trusted only with the marker (:meth:`~artifactd.restore.destination.CacheVolume.installed`)
    of a whole artifact's restore, and only when the document names the artifact
    the marker records. ``cell`` picks a serve cell's canary (default: the only
    one). The file is read as a regular file, at most
    :data:`~artifactd.bounds.MAX_CANARY_BYTES`, without blocking; a hostile
    one is a reason, never a hang or a traceback.
    """
    volume = CacheVolume(target, env_file=env_file)
    marker = volume.installed()
    if marker is None:
        return None, None, "no trusted restore marker: nothing restored to verify"
    artifacts = {f["artifact"] for f in marker["families"].values()}
    if marker["match"] != "full" or len(artifacts) != 1:
        return None, None, "the restore installed no whole artifact (a partial one has no canary)"
    artifact = artifacts.pop()
    doc = _read_restored(volume.canary_path)
    if isinstance(doc, str):
        return None, artifact, doc
    if doc.artifact != artifact:
        return (
            None,
            artifact,
            (
                f"{volume.canary_path} is another artifact's ({doc.artifact[:19]}...), "
                "not the one restored"
            ),
        )
    canary = doc.pick(cell)
    if canary is None:
        cells = ", ".join(c.cell for c in doc.canaries[:10])
        which = f"no canary for cell {cell!r}" if cell else "several canaries and no cell given"
        return None, artifact, f"{which} (the artifact has: {cells}): give --prewarm-cell ID"
    return canary, artifact, None


def quarantine_restored(
    target: Path, node_store: str, why: str, *, env_file: Path | None = None
) -> str | None:
    """Quarantine, in ``node_store``, the artifact the restore into ``target`` installed.

    Its manifest digest and every layer the marker records
    (:func:`artifactd.stores.nodestore.quarantine`): no restore from that node
    store serves them again. Returns the digest, or None when no trusted marker
    names one.
    """
    marker = CacheVolume(target, env_file=env_file).installed()
    if marker is None or not marker["families"]:
        return None
    fams = marker["families"].values()
    digests = sorted({f["artifact"] for f in fams})
    layers = sorted({f["layer"] for f in fams})
    root = node_root(node_store)
    for digest in digests:
        quarantine(root, digest, layers, why)
    return digests[0]


def replay_restored(
    target: Path,
    engine_url: str,
    cell: str | None = None,
    *,
    env_file: Path | None = None,
    on_event: EventSink = discard,
) -> tuple[CanaryResult | None, str | None]:
    """Replay the canary the restore into ``target`` installed; or None and why not.

    One event (``stage: "canary"``, the outcome as ``event``) says how it went.
    """
    found, _, why = restored_canary(target, cell, env_file=env_file)
    if found is None:
        return None, f"no canary to replay: {why}"
    result = replay(found, engine_url)
    on_event(
        {
            "stage": "canary",
            "event": result.outcome,
            "mode": result.mode,
            "prompt": result.prompt,
            "token": result.token,
            "match_rate": result.match_rate,
            "elapsed_ms": round(result.seconds * 1000, 1),
        }
    )
    return result, None


def quarantine_failed(
    ready: Readiness, target: Path, node_store: str, env_file: Path | None = None
) -> Readiness:
    """Return ``ready``; if its canary failed, quarantine the artifact in ``node_store`` first."""
    if not ready.canary_failed:
        return ready

    why = f"canary failed: {ready.why_not}"
    digest = quarantine_restored(target, node_store, why, env_file=env_file)
    return replace(ready, quarantined=digest)


def _read_restored(path: Path) -> RestoredCanaries | str:
    """Read ``canary.json`` (bounded, regular file, no blocking); a string says why not."""
    try:
        return RestoredCanaries.from_json(read_regular(path, MAX_CANARY_BYTES), source=str(path))
    except InputFileError as exc:
        if exc.reason == "missing":
            return "the artifact carries no canary (its matrix has no serve.canary)"
        return f"{path} {exc.problem}"
    except SchemaError as exc:
        return exc.message


def replay(canary: Canary, base_url: str) -> CanaryResult:
    """Send the canary's one request to the engine and compare (:func:`compare`)."""
    started = time.monotonic()
    on = here(base_url)
    seen = observe(base_url, canary.model, canary.spec)
    return compare(canary, seen, on, time.monotonic() - started)


__all__ = [
    "CanaryAnswerError",
    "CanaryResult",
    "Observed",
    "compare",
    "engine_version",
    "here",
    "logprobs_digest",
    "observe",
    "quarantine_failed",
    "quarantine_restored",
    "record",
    "replay",
    "replay_restored",
    "request_body",
    "restored_canary",
]
