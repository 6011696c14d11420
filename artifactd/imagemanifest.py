"""The OCI image manifest and descriptor models artifactd reads and writes."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from artifactd.errors import SchemaError
from artifactd.hashing import canonical_json
from artifactd.oci import ARTIFACT_TYPE, DIGEST_PATTERN


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
