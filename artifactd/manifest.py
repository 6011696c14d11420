"""The artifact manifest: what an artifact holds, as the OCI config blob.

The document is a valid OCI image configuration (``architecture``, ``os``,
``rootfs``) so that standard clients (``skopeo inspect``) accept the artifact,
plus artifactd's own fields: the fingerprint, one record per family layer
(scope key, every file with size, sha256 and mode) and provenance. Its JSON
Schema is generated into ``registry-schema/`` from these models.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from artifactd.errors import SchemaError
from artifactd.fingerprint import Fingerprint
from artifactd.oci import DIGEST_PATTERN

SCHEMA_VERSION: Literal[1] = 1

_GOARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


def goarch(machine: str) -> str:
    """Map ``platform.machine()`` to the OCI/Go architecture name."""
    return _GOARCH.get(machine.lower(), machine.lower())


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)


class FileEntry(_Model):
    """One file (or symlink) in a family layer, relative to its component root."""

    path: str = Field(description="'<component>/<relative path>', POSIX separators.")
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="Of the bytes as stored.")
    mode: int = Field(ge=0, le=0o777, description="Permission bits; never setuid/setgid.")
    mtime: int | None = Field(None, description="Kept only for families whose tools need it.")
    link: str | None = Field(None, description="Symlink target (relative, inside the root).")
    rewrite: bool = Field(False, description="Holds the root placeholder; rewritten on restore.")


class SkippedEntry(_Model):
    """A path left out at harvest, and why."""

    path: str
    reason: str


class LayerRecord(_Model):
    """One family's layer: scope, files, and the blob that carries them."""

    family: str
    scope_key: str = Field(pattern=r"^[0-9a-f]{64}$")
    scope: dict[str, Any] = Field(description="The fingerprint fields the scope key hashes.")
    components: list[str]
    files: list[FileEntry]
    skipped: list[SkippedEntry] = Field(default_factory=list)
    pinned_paths: list[str] = Field(
        default_factory=list,
        description="Absolute paths outside the cache that its files or keys embed.",
    )
    facts: dict[str, Any] = Field(
        default_factory=dict,
        description="Family-specific data for diff, per component (e.g. vLLM hash factors).",
    )
    digest: str = Field(pattern=DIGEST_PATTERN, description="Compressed layer.")
    size: int = Field(ge=0)
    diff_id: str = Field(pattern=DIGEST_PATTERN, description="Uncompressed tar.")
    unpacked_size: int = Field(ge=0, description="Sum of file sizes.")


class RootFS(_Model):
    """The OCI image-config ``rootfs`` member (diff_ids of the layers)."""

    type: Literal["layers"] = "layers"
    diff_ids: list[str]


class Provenance(_Model):
    """Where and how the artifact was made."""

    builder: str = Field(description="artifactd version that packed it.")
    source: Literal["harvest", "build"] = "harvest"
    matrix: str | None = None
    base_image: str | None = None
    cells: list[str] = Field(default_factory=list)
    timings: dict[str, float] = Field(
        default_factory=dict, description="Seconds per stage; builds only."
    )


class ArtifactConfig(_Model):
    """The config document of an artifactd artifact (also a valid OCI image config)."""

    # OCI image-config members: present so standard clients accept the artifact.
    architecture: str
    os: Literal["linux"] = "linux"
    rootfs: RootFS
    # artifactd's own members.
    schema_version: Literal[1] = SCHEMA_VERSION
    kind: Literal["full", "family"] = Field(
        "full", description="'full': every family; 'family': one family, found by its scope tag."
    )
    fingerprint: Fingerprint
    fingerprint_hash: str = Field(pattern=r"^[0-9a-f]{64}$")
    layers: list[LayerRecord]
    provenance: Provenance

    def layer(self, family: str) -> LayerRecord | None:
        """Return the record of one family, if the artifact carries it."""
        return next((rec for rec in self.layers if rec.family == family), None)

    def for_family(self, family: str) -> ArtifactConfig:
        """Return the single-family manifest that the family's scope tag points at."""
        rec = self.layer(family)
        if rec is None:
            raise KeyError(family)
        return self.model_copy(
            update={"kind": "family", "layers": [rec], "rootfs": RootFS(diff_ids=[rec.diff_id])}
        )

    @classmethod
    def from_json(cls, data: bytes | str, *, source: str = "artifact config") -> ArtifactConfig:
        """Parse and validate; raise :class:`IntegrityError` on anything unexpected."""
        try:
            return cls.model_validate_json(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise SchemaError(
                f"{source} is not an artifactd manifest: {first['loc']}: {first['msg']}",
                hint="was this artifact written by a newer artifactd, or by another tool?",
            ) from exc
