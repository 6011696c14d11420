"""The artifact manifest: what an artifact holds, as the OCI config blob.

The document is a valid OCI image configuration (``architecture``, ``os``,
``rootfs``) so that standard clients (``skopeo inspect``) accept the artifact,
plus artifactd's own fields: the fingerprint, one record per family layer
(scope key, every file with size, sha256 and mode) and provenance. Its JSON
Schema is generated into ``registry-schema/`` from these models.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
)

from artifactd import bounds as B  # noqa: N812
from artifactd.errors import SchemaError
from artifactd.fingerprint.model import Fingerprint
from artifactd.format.canary import Canary
from artifactd.format.oci import DIGEST_PATTERN
from artifactd.format.views import without_empty_canaries

#: The format version artifactd writes. 1: layer members are ``<component>/<path>``.
#: 2: members are ``<family>/<component>/<path>`` and each layer carries its
#: :class:`FamilyTree` at ``<family>/`` :data:`TREE_DOC`, so that layers merged
#: as a container runtime merges them give one self-describing directory per
#: family (a Kubernetes image volume, a derived image's tree).
SCHEMA_VERSION: Literal[2] = 2
#: Every format version this reader restores.
READABLE_VERSIONS = (1, 2)
#: A tree document larger than this is refused before it is read. Sized from
#: what a real one needs: a harvest of a 100,000-file Triton cache in its real
#: layout writes 245 bytes per file entry (``python bench/doc_limits.py``), so
#: 48 MiB holds about 200,000 such files, more than any engine's cache. Parsing
#: a document of this size measured 1.5 s and 440 MiB (the 256 MiB limit before
#: it let a document cost 3.7 GiB).
MAX_TREE_DOC = 48 << 20

_GOARCH = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}


def goarch(machine: str) -> str:
    """Map ``platform.machine()`` to the OCI/Go architecture name."""
    return _GOARCH.get(machine.lower(), machine.lower())


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)


M = TypeVar("M", bound=BaseModel)


def _validated(cls: type[M], data: bytes | str, what: str) -> M:
    """Parse and validate ``data`` as ``cls``; a :class:`SchemaError` saying ``what`` if not."""
    try:
        return cls.model_validate_json(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise SchemaError(
            f"{what}: {first['loc']}: {first['msg']}",
            hint="was it written by a newer artifactd, or by another tool?",
        ) from exc


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

    def tree(self) -> FamilyTree:
        """Return the tree document a format-2 layer of this record carries."""
        return FamilyTree(
            family=self.family,
            scope_key=self.scope_key,
            scope=self.scope,
            components=self.components,
            files=self.files,
            unpacked_size=self.unpacked_size,
        )


class FamilyTree(_Model):
    """A format-2 family directory's description of itself (``<family>/.artifactd-layer.json``).

    Everything a restore from an unpacked tree needs to verify and relocate
    the family's files, and nothing about the compressed layer (whose digest
    cannot be inside itself): the family, its scope key and the fields it
    hashes, its components and every file with size, sha256 and mode. In a
    layer it must be byte for byte :meth:`canonical` of the config's record.
    """

    schema_version: Literal[2] = 2
    family: str
    scope_key: str = Field(pattern=r"^[0-9a-f]{64}$")
    scope: dict[str, Any]
    components: list[str]
    files: list[FileEntry]
    unpacked_size: int = Field(ge=0)

    def canonical(self) -> bytes:
        """Return the document's bytes: canonical JSON (sorted keys, no whitespace, UTF-8)."""
        return json.dumps(
            self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), ensure_ascii=False
        ).encode()

    def record(self, digest: str) -> LayerRecord:
        """Return a layer record for these files, named by ``digest`` (of the document itself)."""
        return layer_record(self, digest=digest, size=0, diff_id=digest)

    @classmethod
    def from_json(cls, data: bytes, *, source: str) -> FamilyTree:
        """Parse and validate; raise :class:`SchemaError` on anything unexpected."""
        return _validated(cls, data, f"{source} is not an artifactd family tree")


def layer_record(
    tree: FamilyTree,
    *,
    digest: str,
    size: int,
    diff_id: str,
    skipped: Sequence[SkippedEntry] = (),
    pinned: Sequence[str] = (),
    facts: Mapping[str, Any] | None = None,
) -> LayerRecord:
    """Return the :class:`LayerRecord` of a family's files: the one place a record is made.

    A record is the family's tree document (family, scope key and scope,
    components, files, unpacked size: what :meth:`LayerRecord.tree` gives
    back) plus the blob that carries it (``digest``, ``size``, ``diff_id``)
    and what packing left out and pinned, and the family's facts. A packed
    layer's record is :meth:`artifactd.format.archive.PackedLayer.record`; a
    mounted tree's, :meth:`FamilyTree.record`.
    """
    return LayerRecord(
        family=tree.family,
        scope_key=tree.scope_key,
        scope=tree.scope,
        components=tree.components,
        files=tree.files,
        skipped=list(skipped),
        pinned_paths=list(pinned),
        facts=dict(facts or {}),
        digest=digest,
        size=size,
        diff_id=diff_id,
        unpacked_size=tree.unpacked_size,
    )


class RootFS(_Model):
    """The OCI image-config ``rootfs`` member (diff_ids of the layers)."""

    type: Literal["layers"] = "layers"
    diff_ids: list[str]


class Provenance(_Model):
    """Where and how the artifact was made."""

    builder: str = Field(description="artifactd version that packed it.")
    source: Literal["harvest", "build", "merge", "delta", "absorb"] = "harvest"
    matrix: str | None = None
    base_image: str | None = None
    cells: list[str] = Field(default_factory=list)
    timings: dict[str, float] = Field(
        default_factory=dict, description="Seconds per stage; builds only."
    )
    run_id: str | None = Field(None, description="The fan-out run a cell or merge belongs to.")
    checks: dict[str, dict[str, float | int | str | bool]] = Field(
        default_factory=dict,
        description="Per cell id, the checks it printed ({'checks': {...}}): what verify compares.",
    )
    extends: str | None = Field(
        None,
        pattern=DIGEST_PATTERN,
        description="A delta or candidate: the manifest digest of the artifact it adds to.",
    )
    signer: str | None = Field(None, description="A delta: the key id that signed it, if any.")
    deltas: list[str] = Field(
        default_factory=list,
        description="A candidate: the manifest digests of the deltas absorbed.",
    )
    contributed: dict[str, list[str]] = Field(
        default_factory=dict,
        description="A candidate: per family, the file paths the absorbed deltas added.",
    )


class ArtifactConfig(_Model):
    """The config document of an artifactd artifact (also a valid OCI image config)."""

    # OCI image-config members: present so standard clients accept the artifact.
    architecture: str
    os: Literal["linux"] = "linux"
    rootfs: RootFS
    # artifactd's own members.
    schema_version: Literal[1, 2] = Field(
        SCHEMA_VERSION,
        description="Format: 1 names members '<component>/...', 2 '<family>/<component>/...'.",
    )
    kind: Literal["full", "family", "cell", "delta"] = Field(
        "full",
        description="'full': every family; 'family': one family, found by its scope tag; "
        "'cell': one cell's part of a fan-out build, for `merge` (never restored); "
        "'delta': what a pod compiled after its restore, for `absorb` (never restored).",
    )
    fingerprint: Fingerprint
    fingerprint_hash: str = Field(pattern=r"^[0-9a-f]{64}$")
    layers: list[LayerRecord]
    provenance: Provenance
    canaries: list[Canary] = Field(
        default_factory=list,
        max_length=B.MAX_CELLS,
        description="Per serve cell, the canary it recorded (matrix `serve.canary`); "
        "left out of the document when there is none.",
    )

    @model_serializer(mode="wrap")
    def _without_empty_canaries(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return without_empty_canaries(handler(self))

    def canary(self, cell: str | None = None) -> Canary | None:
        """Return the canary of ``cell`` (default: the only one), or None."""
        if cell is None:
            return self.canaries[0] if len(self.canaries) == 1 else None
        return next((c for c in self.canaries if c.cell == cell), None)

    def member_prefix(self, family: str) -> str | None:
        """Return the directory ``family``'s layer members sit under (format 2), or None."""
        return family if self.schema_version >= 2 else None

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
        return _validated(cls, data, f"{source} is not an artifactd manifest")
