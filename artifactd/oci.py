"""OCI media types, annotations, tags and the image-manifest model artifactd writes.

The format is documented for other clients in ``registry-schema/FORMAT.md``.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from artifactd.errors import IntegrityError, UsageError
from artifactd.hashing import canonical_json

ARTIFACT_TYPE = "application/vnd.artifactd.cache.v1"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_MEDIA_TYPE = "application/vnd.oci.image.index.v1+json"
# An image-config media type (not a custom one) so `skopeo inspect` accepts it.
CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar+zstd"

ANN_TITLE = "org.opencontainers.image.title"
ANN_CREATED = "org.opencontainers.image.created"
ANN_REF_NAME = "org.opencontainers.image.ref.name"
ANN_FAMILY = "io.artifactd.family"
ANN_SCOPE_KEY = "io.artifactd.scope-key"
ANN_FINGERPRINT = "io.artifactd.fingerprint"
ANN_KIND = "io.artifactd.kind"
ANN_FILES = "io.artifactd.files"

DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
FULL_TAG_PREFIX = "fp-"


def full_tag(fingerprint_hash: str) -> str:
    """Tag of the whole artifact built for a fingerprint."""
    return f"{FULL_TAG_PREFIX}{fingerprint_hash}"


def family_tag(family: str, scope_key: str) -> str:
    """Tag of the single-family artifact for one scope key."""
    return f"{family}-{scope_key}"


def check_digest(digest: str) -> str:
    """Return ``digest`` if it is a well-formed sha256 digest, else raise."""
    if not DIGEST_RE.match(digest):
        raise IntegrityError(f"malformed digest {digest!r}")
    return digest


def check_tag(tag: str) -> str:
    """Return ``tag`` if OCI allows it, else raise :class:`UsageError`."""
    if not TAG_RE.match(tag):
        raise UsageError(f"not a valid OCI tag: {tag!r}")
    return tag


class _Model(BaseModel):
    # Other tools may add fields we do not know: accept and ignore them when reading.
    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)


class Descriptor(_Model):
    """An OCI content descriptor."""

    media_type: str = Field(alias="mediaType")
    digest: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")
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
            raise IntegrityError(
                f"{source} is not an OCI image manifest: {first['loc']}: {first['msg']}"
            ) from exc

    @property
    def is_artifactd(self) -> bool:
        """Whether artifactd wrote this manifest."""
        return self.artifact_type == ARTIFACT_TYPE
