"""The canary: what a serve cell's engine answered to a few fixed prompts, as a document.

A matrix's ``serve.canary`` (:class:`CanarySpec`) asks every serve cell of a
build to record, through the engine's OpenAI-compatible API, a few greedy
completions: per prompt the prompt's token ids, the generated token ids and a
sha256 of the top-k logprobs of each generated token, rounded to
``precision`` decimal places (:class:`CanaryPrompt`), with the GPU model,
driver and engine version they were recorded on (:class:`RecordedOn`). The
document (:class:`Canary`) travels in the artifact's config
(:attr:`artifactd.format.config.ArtifactConfig.canaries`), so the manifest's
signature covers it; a restore writes it beside its marker for the pod.

The rules that record, replay and compare it live in :mod:`artifactd.pod.canary`.
Every field is bounded (:mod:`artifactd.bounds`): a canary is a few KiB; a
document over :data:`~artifactd.bounds.MAX_CANARY_BYTES` is refused unread.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from artifactd import bounds as B  # noqa: N812
from artifactd.errors import SchemaError
from artifactd.format.oci import DIGEST_PATTERN

#: The fixed prompts a ``count`` picks (the first ``count`` of them): plain
#: text every tokenizer turns into ids, long enough to exercise a prefill.
FIXED_PROMPTS = (
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived",
    "def fibonacci(n):\n    ",
    "The three primary colors are",
    "Water boils at a temperature of",
    "A haiku about autumn leaves:",
    "In 1969, the first person to walk on the moon was",
    "The quick brown fox jumps over the lazy dog. The lazy dog",
)

_TOKEN_ID = Annotated[int, Field(ge=0, le=2**31 - 1)]
_LABEL = Annotated[str, Field(max_length=256)]


def _f(rng: B.Range) -> dict[str, Any]:
    return rng.field()


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)


class CanarySpec(_Model):
    """``serve.canary`` of a matrix: which prompts, how many tokens, how the digest is made."""

    prompts: (
        list[
            Annotated[str, Field(min_length=1, max_length=B.MAX_CANARY_PROMPT_CHARS, pattern=r"\S")]
        ]
        | None
    ) = Field(
        None,
        min_length=1,
        max_length=B.MAX_CANARY_PROMPTS,
        description="The prompts (default: the first `count` fixed prompts).",
    )
    count: int = Field(2, **_f(B.CANARY_COUNT), description="Fixed prompts, when no `prompts`.")
    tokens: int = Field(16, **_f(B.CANARY_TOKENS), description="Tokens generated per prompt.")
    top_k: int = Field(5, **_f(B.CANARY_TOP_K), description="Logprobs kept per token.")
    precision: int = Field(
        4, **_f(B.CANARY_PRECISION), description="Decimal places of the hashed logprobs."
    )
    seed: int = Field(0, **_f(B.CANARY_SEED), description="The seed of every canary request.")
    deadline_s: float = Field(
        60, **_f(B.CANARY_DEADLINE_S), description="The whole canary, at build and at replay."
    )
    match_rate: float = Field(
        0.9,
        **_f(B.CANARY_MATCH_RATE),
        description="Tolerance check (another GPU, driver or engine): the token match rate needed.",
    )

    def texts(self) -> list[str]:
        """Return the prompts sent, in order."""
        return list(self.prompts) if self.prompts else list(FIXED_PROMPTS[: self.count])


class CanaryPrompt(_Model):
    """One prompt's record: its ids, the greedy ids and the digest of the rounded top-k logprobs."""

    id: str = Field(pattern=r"^p[0-9]{1,2}$", description="p0, p1... in prompt order.")
    text: str = Field(max_length=B.MAX_CANARY_PROMPT_CHARS)
    prompt_ids: list[_TOKEN_ID] = Field(max_length=B.MAX_CANARY_PROMPT_IDS)
    greedy_ids: list[_TOKEN_ID] = Field(max_length=int(B.CANARY_TOKENS.hi))
    logprobs_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class RecordedOn(_Model):
    """Where a canary was recorded (or replayed): GPU model, driver and engine version."""

    gpu: _LABEL | None = Field(None, description="GPU model as NVML names it; None: no GPU.")
    driver: _LABEL | None = None
    engine: _LABEL | None = Field(None, description="What the engine's GET /version said.")


class Canary(_Model):
    """One serve cell's canary, as the artifact carries it."""

    schema_version: Literal[1] = 1
    cell: str = Field(max_length=256, description="The serve cell it was recorded in.")
    model: str = Field(max_length=256, description="The `model` of the requests.")
    spec: CanarySpec
    prompts: list[CanaryPrompt] = Field(min_length=1, max_length=B.MAX_CANARY_PROMPTS)
    recorded_on: RecordedOn

    @model_validator(mode="after")
    def _one_record_per_prompt(self) -> Canary:
        texts = self.spec.texts()
        if [p.text for p in self.prompts] != texts:
            raise ValueError(f"the prompts recorded are not the spec's {len(texts)} prompt(s)")
        if [p.id for p in self.prompts] != [f"p{i}" for i in range(len(texts))]:
            raise ValueError("prompt ids are not p0, p1... in order")
        return self


class RestoredCanaries(_Model):
    """``<target>/.artifactd/canary.json``: the canaries of the artifact a restore installed.

    Written by a restore of a whole artifact, before its marker; trusted only
    while ``artifact`` is the artifact the marker records (a file left by an
    earlier restore names another one).
    """

    schema_version: Literal[1] = 1
    artifact: str = Field(pattern=DIGEST_PATTERN, description="The manifest they came from.")
    canaries: list[Canary] = Field(max_length=B.MAX_CELLS)

    def pick(self, cell: str | None) -> Canary | None:
        """Return the canary of ``cell``, or the only one when ``cell`` is None."""
        if cell is None:
            return self.canaries[0] if len(self.canaries) == 1 else None
        return next((c for c in self.canaries if c.cell == cell), None)

    @classmethod
    def from_json(cls, data: bytes | str, *, source: str = "canary.json") -> RestoredCanaries:
        """Parse and validate; raise :class:`SchemaError` on anything unexpected or too large."""
        if len(data) > B.MAX_CANARY_BYTES:
            raise SchemaError(
                f"{source} is over {B.MAX_CANARY_BYTES} bytes",
                hint="a canary is a few KiB per serve cell: this is not one artifactd wrote",
            )
        try:
            return cls.model_validate_json(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise SchemaError(
                f"{source} is not an artifactd canary document: {first['loc']}: {first['msg']}",
                hint="restore again: the restore rewrites it from the signed artifact",
            ) from None


__all__ = [
    "FIXED_PROMPTS",
    "Canary",
    "CanaryPrompt",
    "CanarySpec",
    "RecordedOn",
    "RestoredCanaries",
]
