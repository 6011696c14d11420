"""Read an artifact's two documents from a store: its manifest and its config, verified.

The one reader behind :func:`artifactd.stores.artifacts.read_artifact` (every
command) and a restore's :meth:`StoreSource.find
<artifactd.restore.source.StoreSource.find>`: the signature first under a
:class:`~artifactd.trust.policy.TrustPolicy`, then the manifest, then the
config blob (verified against its digest, bounded by :data:`MAX_CONFIG_BYTES`),
and the rule that the config and the manifest list the same layers.

With ``light=True`` (a restore) the documents are read by
:mod:`artifactd.format.light` and pydantic is imported only for a document it
leaves to pydantic; the result then holds light documents, typed by
:mod:`artifactd.format.views`. Otherwise they are the pydantic models.
"""

from __future__ import annotations

from artifactd.errors import IntegrityError, NotFoundError
from artifactd.format import light
from artifactd.format.oci import ARTIFACT_TYPE
from artifactd.records import Record
from artifactd.stores.base import Store

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from artifactd.format.config import ArtifactConfig
    from artifactd.format.imagemanifest import ImageManifest
    from artifactd.format.views import ConfigView, ManifestView
    from artifactd.trust.policy import Basis

#: An artifact config larger than this is refused before it is read: every
#: family's file entries (the tree documents' limit, :data:`artifactd.format.config.MAX_TREE_DOC`,
#: about 200,000 files at the 245 bytes an entry a measured harvest writes) plus
#: room for the fingerprint, the skipped paths and the provenance. Parsing a
#: config of this size measured 1.7 s and 510 MiB (``python bench/doc_limits.py``).
MAX_CONFIG_BYTES = 56 << 20


class Documents(Record):
    """An artifact's documents, read and verified: the manifest digest, both documents, signer.

    A :class:`~artifactd.records.Record` (a restore imports this module): not a
    tuple, so its fields are read by name.
    """

    digest: str
    manifest: ManifestView
    config: ConfigView
    #: The key that signed it, when it was read under a :class:`TrustPolicy`.
    signed_by: str | None = None


def read_documents(
    store: Store, reference: str, *, trust: Basis | None = None, light_read: bool = False
) -> Documents | None:
    """Read the artifact a tag or digest names; ``None`` when the store has no such reference.

    Everything is verified against its digest, and the config must be
    consistent with the manifest (same layers, same digests) or
    :class:`IntegrityError` is raised. Under a
    :class:`~artifactd.trust.policy.TrustPolicy` as ``trust``, the manifest's
    signature is checked first, before its config is read:
    :class:`~artifactd.errors.TrustError` when no key of the policy signed
    exactly this digest. A restore passes its basis (``UNSAFE_NO_VERIFICATION``
    when no key is configured); None is for reading what this process wrote.
    ``light_read``: read the documents with :mod:`artifactd.format.light`
    first (see the module's docstring).
    """
    ref = store.get_manifest(reference)
    if ref is None:
        return None
    signed_by = None
    if trust is not None:
        signed_by = trust.check(store, ref.digest, what=f"{store.ref}:{reference}")
    where = f"{store.ref} {reference}"
    manifest = _manifest(ref.data, where, light_read)
    if manifest.artifact_type != ARTIFACT_TYPE:
        raise NotFoundError(
            f"{where} is not an artifactd artifact (artifactType {manifest.artifact_type!r})"
        )
    desc = manifest.config
    data = store.read_blob(desc.digest, desc.size, max_size=MAX_CONFIG_BYTES, what="config blob")
    config = _config(data, f"config of {where}", light_read)
    by_digest = {layer.digest: layer for layer in manifest.layers}
    for rec in config.layers:
        found = by_digest.get(rec.digest)
        if found is None or found.size != rec.size:
            raise IntegrityError(
                f"{where}: config lists layer {rec.digest} for {rec.family} "
                "that the manifest does not carry"
            )
    listed = {rec.digest for rec in config.layers}
    extra = [d.digest for d in manifest.layers if d.digest not in listed]
    if extra:
        raise IntegrityError(
            f"{where}: the manifest carries layer {extra[0]} that the config does not list"
        )
    return Documents(ref.digest, manifest, config, signed_by)


def _manifest(data: bytes, source: str, light_read: bool) -> ManifestView:
    if light_read and (doc := light.read("ImageManifest", data)) is not None:
        return doc  # type: ignore[return-value]  # a light Doc has the view's fields
    return _model_manifest(data, source)


def _config(data: bytes, source: str, light_read: bool) -> ConfigView:
    if light_read and (doc := light.read("ArtifactConfig", data)) is not None:
        return doc  # type: ignore[return-value]  # a light Doc has the view's fields
    return _model_config(data, source)


def _model_manifest(data: bytes, source: str) -> ImageManifest:
    # lazy: pydantic loads only for what the light reader leaves to it, or a read not light
    from artifactd.format.imagemanifest import ImageManifest  # noqa: PLC0415

    return ImageManifest.from_bytes(data, source=source)


def _model_config(data: bytes, source: str) -> ArtifactConfig:
    # lazy: as above
    from artifactd.format.config import ArtifactConfig  # noqa: PLC0415

    return ArtifactConfig.from_json(data, source=source)


def models(docs: Documents) -> tuple[ImageManifest, ArtifactConfig]:
    """Return ``docs``' documents as the pydantic models (read with ``light_read=False``)."""
    # lazy: as above
    from artifactd.format.config import ArtifactConfig  # noqa: PLC0415
    from artifactd.format.imagemanifest import ImageManifest  # noqa: PLC0415

    manifest: Any = docs.manifest
    config: Any = docs.config
    if not isinstance(manifest, ImageManifest) or not isinstance(config, ArtifactConfig):
        raise TypeError("documents read light have no models: read them with light_read=False")
    return manifest, config
