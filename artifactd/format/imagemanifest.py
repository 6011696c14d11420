"""The OCI image manifest and descriptor models artifactd reads and writes."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from artifactd.errors import SchemaError
from artifactd.format.oci import ARTIFACT_TYPE, DIGEST_PATTERN
from artifactd.hashing import canonical_json
from artifactd.jsontext import json_type


class _Model(BaseModel):
    # Other tools may add fields we do not know: accept and ignore them when reading.
    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True, defer_build=True)


class Descriptor(_Model):
    """An OCI content descriptor."""

    media_type: str = Field(alias="mediaType")
    digest: str = Field(pattern=DIGEST_PATTERN)
    size: int = Field(ge=0)
    annotations: dict[str, str] | None = None
    artifact_type: str | None = Field(None, alias="artifactType")


class ImageManifest(_Model):
    """An OCI image manifest (the subset artifactd reads and writes)."""

    schema_version: Literal[2] = Field(2, alias="schemaVersion")
    media_type: Literal["application/vnd.oci.image.manifest.v1+json"] = Field(
        "application/vnd.oci.image.manifest.v1+json", alias="mediaType"
    )
    artifact_type: str | None = Field(None, alias="artifactType")
    config: Descriptor
    layers: list[Descriptor]
    annotations: dict[str, str] | None = None

    def to_bytes(self) -> bytes:
        """Serialise canonically: the same manifest always has the same digest."""
        return canonical_json(self.model_dump(by_alias=True, exclude_none=True, mode="json"))

    @classmethod
    def from_bytes(cls, data: bytes, *, source: str = "manifest") -> ImageManifest:
        """Parse a manifest, raising :class:`IntegrityError` when it is not one we can read."""
        try:
            return cls.model_validate_json(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise SchemaError(
                f"{source} is not an OCI image manifest: {first['loc']}: {first['msg']}"
            ) from exc

    @property
    def is_artifactd(self) -> bool:
        """Whether artifactd wrote this manifest."""
        return self.artifact_type == ARTIFACT_TYPE


#: The deepest nesting of a JSON document read from a store that is parsed at
#: all. OCI manifests, indexes and image configs nest five levels or so; a
#: limit far above that keeps every reader (and writer: a document read may be
#: written back) clear of Python's recursion limit.
MAX_DOCUMENT_DEPTH = 32


def parse_document(
    data: bytes, *, source: str, max_bytes: int, max_depth: int = MAX_DOCUMENT_DEPTH
) -> dict[str, Any]:
    """Parse ``data``, read from a store, as one JSON object, or raise :class:`SchemaError`.

    Bounded before any work: at most ``max_bytes`` bytes, nesting at most
    ``max_depth`` levels (a document 100,000 levels deep is refused, not a
    ``RecursionError``). ``source`` names the document in the message.
    """
    if len(data) > max_bytes:
        raise SchemaError(f"{source} is {len(data)} bytes (at most {max_bytes} are read)")
    try:
        doc = json.loads(data)
    except RecursionError:
        raise SchemaError(f"{source} nests deeper than {max_depth} levels") from None
    except ValueError as exc:  # not JSON, or not UTF-8
        raise SchemaError(f"{source} is not JSON ({str(exc)[:80]})") from None
    if not isinstance(doc, dict):
        raise SchemaError(f"{source} is a JSON {json_type(doc)}, not an object")
    if _deeper_than(doc, max_depth):
        raise SchemaError(f"{source} nests deeper than {max_depth} levels")
    return doc


def _deeper_than(doc: Any, limit: int) -> bool:
    """Whether ``doc`` nests deeper than ``limit``; iterative, so any depth is safe to ask."""
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        value, level = stack.pop()
        if level > limit:
            return True
        children = value.values() if isinstance(value, dict) else value
        stack.extend((c, level + 1) for c in children if isinstance(c, dict | list))
    return False
