"""Publish and read artifacts over any :class:`~artifactd.stores.Store`.

One artifact per fingerprint: an OCI image manifest with ``artifactType``
:data:`~artifactd.format.oci.ARTIFACT_TYPE`, the :class:`ArtifactConfig` as config
blob, and one tar.zst layer per family. It is tagged ``fp-<fingerprint hash>``.
Each family layer is also published as a one-layer manifest tagged
``<family>-<scope key>``, so a restore whose whole fingerprint differs (another
model, another TP) still finds the families whose scope matches. Layers are
shared by digest: the store keeps each one once.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from artifactd.constants import SOURCE_DATE_EPOCH, current_environ
from artifactd.errors import BuildError, IntegrityError, NotFoundError, UsageError
from artifactd.events import EventSink, discard
from artifactd.fingerprint.key import adopt_software
from artifactd.format.config import ArtifactConfig
from artifactd.format.imagemanifest import Descriptor, ImageManifest
from artifactd.format.oci import (
    ANN_CREATED,
    ANN_FAMILY,
    ANN_FILES,
    ANN_FINGERPRINT,
    ANN_KIND,
    ANN_SCOPE_KEY,
    ANN_TITLE,
    ARTIFACT_TYPE,
    CONFIG_MEDIA_TYPE,
    FULL_TAG_PREFIX,
    LAYER_MEDIA_TYPE,
    MANIFEST_MEDIA_TYPE,
    family_tag,
    full_tag,
    is_tag,
    parse_superseded_tag,
)
from artifactd.hashing import canonical_json, digest_of
from artifactd.stores import Store, open_store, parse_manifest_ref, reading
from artifactd.stores.base import ManifestRef, progress_events
from artifactd.stores.reading import MAX_CONFIG_BYTES, models, read_documents
from artifactd.trust.inspection import TrustReport, examine
from artifactd.trust.policy import (
    UNSAFE_NO_VERIFICATION,
    Basis,
    TrustPolicy,
    checked_basis,
    verification,
    vouch,
)

if TYPE_CHECKING:
    from artifactd.format.archive import PackedLayer
    from artifactd.stores.mirrors import MirrorSettings
    from artifactd.trust.keys import PrivateKey, PublicKey
    from artifactd.trust.signatures import SignResult


@dataclass
class PublishResult:
    """What :func:`publish` did."""

    digest: str
    tags: list[str]
    family_digests: dict[str, str]
    bytes_uploaded: int = 0
    bytes_skipped: int = 0
    blobs_uploaded: list[str] = field(default_factory=list)


def _descriptor(data: bytes, media_type: str) -> Descriptor:
    return Descriptor(media_type=media_type, digest=digest_of(data), size=len(data))


def _put_small(store: Store, data: bytes, result: PublishResult, tmp_dir: Path) -> Descriptor:
    desc = _descriptor(data, CONFIG_MEDIA_TYPE)
    if store.has_blob(desc.digest):
        result.bytes_skipped += desc.size
        return desc
    path = tmp_dir / desc.digest.replace(":", "-")
    path.write_bytes(data)
    result.bytes_uploaded += store.put_blob(path, desc.digest, desc.size)
    result.blobs_uploaded.append(desc.digest)
    return desc


def build_image_manifest(
    config: Descriptor, art: ArtifactConfig, *, created: str | None = None
) -> ImageManifest:
    """Return the OCI image manifest for an artifact config and its layers.

    ``created`` (RFC 3339, UTC) becomes the manifest's
    ``org.opencontainers.image.created`` annotation: the artifact's age for
    ``artifactd prune``.
    """
    layers = [
        Descriptor(
            media_type=LAYER_MEDIA_TYPE,
            digest=rec.digest,
            size=rec.size,
            annotations={
                ANN_TITLE: f"{rec.family}.tar.zst",
                ANN_FAMILY: rec.family,
                ANN_SCOPE_KEY: rec.scope_key,
                ANN_FILES: str(len(rec.files)),
            },
        )
        for rec in art.layers
    ]
    return ImageManifest(
        artifact_type=ARTIFACT_TYPE,
        config=config,
        layers=layers,
        annotations={
            ANN_FINGERPRINT: art.fingerprint_hash,
            ANN_KIND: art.kind,
            **({ANN_CREATED: created} if created else {}),
        },
    )


def creation_time(store: Store, tag: str, config_digest: str) -> str:
    """Return the creation time to stamp on an artifact about to be published under ``tag``.

    Publishing again what ``tag`` already holds (the same config: a merge run
    twice) keeps that manifest's time, so the digest stays the same and the
    push stays idempotent. Otherwise ``$SOURCE_DATE_EPOCH`` when set (the
    reproducible-builds convention), else now. Never the registry's mtime: the
    distribution API does not expose one.
    """
    try:
        ref = store.get_manifest(tag)
        old = None if ref is None else ImageManifest.from_bytes(ref.data)
    except (IntegrityError, NotFoundError):
        old = None  # a damaged tag: publishing over it repairs it, as before
    if old is not None:
        stamp = (old.annotations or {}).get(ANN_CREATED)
        if old.config.digest == config_digest and stamp:
            return stamp
    raw = current_environ().get(SOURCE_DATE_EPOCH)
    try:
        when = time.time() if raw is None else int(raw)
    except ValueError:
        raise UsageError(
            f"{SOURCE_DATE_EPOCH}={raw!r} is not a whole number of seconds",
            hint="set it to a Unix time (date +%s) or unset it",
        ) from None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(when))


def publish(
    store: Store,
    art: ArtifactConfig,
    packed: dict[str, PackedLayer],
    tmp_dir: Path,
    *,
    on_event: EventSink = discard,
    tags: Sequence[str] | None = None,
) -> PublishResult:
    """Upload layers the store lacks, then the configs and manifests, then the tags.

    A family missing from ``packed`` reuses a layer the store already holds
    (a merge of cells' artifacts). The tags are ``fp-<hash>`` and each
    family's scope tag; with ``tags``, only
    the whole artifact is written, under those (a cell's part of a fan-out
    build, which no restore may find). Order matters: a tag only ever points
    at a manifest whose blobs are all present.
    """
    result = PublishResult(digest="", tags=[], family_digests={})
    config = canonical_json(art.model_dump(mode="json"))
    if len(config) > reading.MAX_CONFIG_BYTES:  # before any upload: no restore would read it
        files = sum(len(rec.files) for rec in art.layers)
        raise BuildError(
            f"the artifact config would take {len(config)} bytes ({files} files), over the "
            f"{reading.MAX_CONFIG_BYTES >> 20} MiB a restore reads",
            hint="harvest fewer families at once (--family), or clear stale cache entries",
        )
    # Before any upload: a bad $SOURCE_DATE_EPOCH fails with nothing written.
    names = [full_tag(art.fingerprint_hash)] if tags is None else list(tags)
    created = creation_time(store, names[0], digest_of(config)) if names else None
    for rec in art.layers:
        layer = packed.get(rec.family)
        if layer is None:  # a layer reused from another artifact: it must be there already
            if not store.has_blob(rec.digest):
                raise NotFoundError(f"{store.ref} lacks layer {rec.digest} of {rec.family}")
            result.bytes_skipped += rec.size
            continue
        if store.has_blob(layer.digest):
            result.bytes_skipped += layer.size
            continue
        result.bytes_uploaded += store.put_blob(
            layer.path,
            layer.digest,
            layer.size,
            progress=progress_events(on_event, stage="push", family=rec.family, total=layer.size),
        )
        result.blobs_uploaded.append(layer.digest)
        on_event({"stage": "push", "event": "done", "family": rec.family, "bytes": layer.size})

    for rec in art.layers if tags is None else []:
        fam_art = art.for_family(rec.family)
        cfg = _put_small(store, canonical_json(fam_art.model_dump(mode="json")), result, tmp_dir)
        fam_manifest = build_image_manifest(cfg, fam_art, created=created)
        tag = family_tag(rec.family, rec.scope_key)
        result.family_digests[rec.family] = store.put_manifest(
            fam_manifest.to_bytes(), MANIFEST_MEDIA_TYPE, [tag]
        )
        result.tags.append(tag)

    cfg = _put_small(store, config, result, tmp_dir)
    manifest = build_image_manifest(cfg, art, created=created)
    result.digest = store.put_manifest(manifest.to_bytes(), MANIFEST_MEDIA_TYPE, names)
    result.tags[:0] = names
    return result


@dataclass(frozen=True)
class Artifact:
    """An artifact read from a store: its manifest, digest and config."""

    digest: str
    manifest: ImageManifest
    config: ArtifactConfig
    #: The key that signed it, when it was read under a :class:`TrustPolicy`.
    signed_by: str | None = None


def read_config(
    store: Store, manifest: ImageManifest, *, max_size: int = MAX_CONFIG_BYTES
) -> bytes:
    """Fetch and verify the config blob of a manifest."""
    desc = manifest.config
    return store.read_blob(desc.digest, desc.size, max_size=max_size, what="config blob")


def read_artifact(store: Store, reference: str, *, trust: Basis | None = None) -> Artifact | None:
    """Read the artifact a tag or digest names; ``None`` when the store has no such reference.

    :func:`artifactd.stores.reading.read_documents` (the one reader: the
    signature under a policy first, every document verified against its
    digest, the config consistent with the manifest), as the pydantic models.
    """
    docs = read_documents(store, reference, trust=trust)
    if docs is None:
        return None
    manifest, config = models(docs)
    return Artifact(docs.digest, manifest, config, docs.signed_by)


@dataclass
class CopyResult:
    """What :func:`copy_artifacts` did."""

    source: str
    destination: str
    tags: list[str]
    manifests: int = 0
    bytes_uploaded: int = 0
    bytes_skipped: int = 0
    #: Signature and attestation tags carried along (``sha256-<hex>.sig|.att``).
    attached: list[str] = field(default_factory=list)
    #: The manifest digest each copied tag names.
    digests: dict[str, str] = field(default_factory=dict)
    #: With a policy: each copied manifest digest and the key id that verified it.
    verified: dict[str, str] = field(default_factory=dict)
    #: What ``--sign-key`` signed in the destination.
    signing: SignResult | None = None


def copy_artifacts(
    src: Store,
    dst: Store,
    tags: list[str] | None,
    tmp_dir: Path,
    *,
    trust: Basis,
) -> CopyResult:
    """Copy tagged artifacts (default: every artifactd tag) and their blobs to ``dst``.

    Blobs ``dst`` already has are not transferred; each blob is verified on the
    way; a tag is written only after every blob of its manifest is in place.
    Each manifest's signatures and attestations (``sha256-<hex>.sig|.att``)
    travel with it, so what verified in ``src`` verifies in ``dst``. Under a
    :class:`~artifactd.trust.policy.TrustPolicy` as ``trust``, every manifest to
    copy is verified in ``src`` before the first byte is written to ``dst``
    (:func:`choose_artifacts`); :data:`~artifactd.trust.policy.UNSAFE_NO_VERIFICATION`
    copies what the tags name, unverified.
    """
    chosen = choose_artifacts(src, tags, trust=trust)
    return _copy_chosen(src, dst, chosen, tmp_dir)


@dataclass
class Chosen:
    """The manifests a copy will write, read once from the source (and verified, with a policy)."""

    refs: list[tuple[str, ManifestRef, ImageManifest]]
    #: With a policy: each manifest digest and the key id that verified it.
    verified: dict[str, str] = field(default_factory=dict)


def choose_artifacts(src: Store, tags: list[str] | None, *, trust: Basis) -> Chosen:
    """Read the manifests a copy of ``tags`` (None: every artifactd tag) writes; verify them.

    Each tag is read once: the bytes that verified are the bytes copied, so a
    tag moved in the source meanwhile changes nothing. Under a
    :class:`~artifactd.trust.policy.TrustPolicy` as ``trust``, every one must
    verify (:func:`artifactd.trust.policy.vouch`) or
    :class:`~artifactd.errors.TrustError` is raised before the copy begins.
    """
    # lazy: copying is this module's other half; reading an artifact (a restore) never loads it
    from artifactd.trust.signatures import parse_attached_tag  # noqa: PLC0415

    trust = checked_basis(trust, "choose_artifacts")
    wanted = tags if tags else [t for t in src.list_tags() if is_tag(t)]
    # A full copy leaves signatures to copy_attached and superseded manifests behind.
    wanted = [
        t
        for t in wanted
        if tags or (parse_attached_tag(t) is None and parse_superseded_tag(t) is None)
    ]
    chosen = Chosen(refs=[])
    for tag in wanted:
        ref = src.get_manifest(tag)
        if ref is None:
            raise NotFoundError(f"{src.ref} has no tag {tag}")
        manifest = ImageManifest.from_bytes(ref.data, source=f"{src.ref}:{tag}")
        if not manifest.is_artifactd and not tags:
            continue  # a full copy moves artifactd's artifacts, not unrelated images
        chosen.refs.append((tag, ref, manifest))
    if isinstance(trust, TrustPolicy):
        found = vouch(src, [ref.digest for _, ref, _ in chosen.refs], trust)
        chosen.verified = {digest: str(key_id) for digest, key_id in found.items()}
    return chosen


def _copy_chosen(src: Store, dst: Store, chosen: Chosen, tmp_dir: Path) -> CopyResult:
    # lazy: copying is this module's other half; reading an artifact (a restore) never loads it
    from artifactd.trust.signatures import copy_attached  # noqa: PLC0415

    result = CopyResult(source=src.ref, destination=dst.ref, tags=[], verified=chosen.verified)
    done: set[str] = set()
    carried: set[str] = set()
    for tag, ref, manifest in chosen.refs:
        for desc in [manifest.config, *manifest.layers]:
            if desc.digest in done:
                continue  # counted once, as uploaded or skipped, by the first manifest
            if dst.has_blob(desc.digest):
                result.bytes_skipped += desc.size
            else:
                result.bytes_uploaded += src.copy_blob(dst, desc.digest, desc.size, tmp_dir)
            done.add(desc.digest)
        dst.put_manifest(ref.data, ref.media_type or MANIFEST_MEDIA_TYPE, [tag])
        result.manifests += 1
        result.tags.append(tag)
        result.digests[tag] = ref.digest
        if ref.digest not in carried:
            carried.add(ref.digest)
            result.attached.extend(copy_attached(src, dst, ref.digest, tmp_dir))
    result.tags.sort(key=lambda t: (not t.startswith(FULL_TAG_PREFIX), t))
    return result


def open_artifact(
    ref: str,
    *,
    trust: Basis,
    insecure: bool = False,
    mirrors: MirrorSettings | None = None,
) -> Artifact:
    """Read the artifact ``ref`` names (``STORE:TAG`` or ``STORE@sha256:...``).

    Under a :class:`~artifactd.trust.policy.TrustPolicy` as ``trust``, its
    signature is checked first (:func:`read_artifact`).

    Raises :class:`UsageError` when ``ref`` names a store but no artifact, and
    :class:`NotFoundError` when the store has no such artifact.
    """
    trust = checked_basis(trust, "open_artifact")
    store, reference = parse_manifest_ref(ref)
    with open_store(store, insecure=insecure, mirrors=mirrors) as st:
        art = read_artifact(st, reference, trust=trust)
    if art is None:
        raise NotFoundError(f"{store} has no artifact {reference}")
    return art


def adopt_software_from(
    raw: Mapping[str, Any],
    ref: str,
    *,
    store: str | None = None,
    verify_keys: Sequence[str] = (),
    insecure: bool = False,
    mirrors: MirrorSettings | None = None,
) -> dict[str, Any]:
    """Return ``raw`` with the software fields of the artifact ``ref`` names (``--software-from``).

    The artifact decides which artifact the pod then resolves, so under a
    policy (``verify_keys``: key specs, as ``--verify-key`` takes them) it is
    verified like one it would install: :class:`~artifactd.errors.TrustError`
    when no key signed it. The one owner of ``--software-from`` for every
    command that takes it (``restore``, ``prefetch``). ``store`` is the store
    the command resolves against afterwards: with ``ref`` in another registry,
    an environment credential pair must say which of the two it belongs to
    (:func:`~artifactd.stores.credentials.check_unbound_pair`).
    """
    # lazy: credentials matter to a second registry; a restore from one store never loads them
    from artifactd.stores.credentials import check_unbound_pair  # noqa: PLC0415

    check_unbound_pair([ref, store])
    art = open_artifact(ref, insecure=insecure, trust=verification(verify_keys), mirrors=mirrors)
    return adopt_software(raw, json.loads(art.config.fingerprint.model_dump_json()))


def copy_between(
    source: str,
    destination: str,
    tags: list[str] | None,
    *,
    insecure: bool = False,
    trust: Basis | None = None,
    sign_key: PrivateKey | None = None,
) -> CopyResult:
    """Open both stores (creating the destination) and copy ``tags`` (None: every artifact).

    With a :class:`~artifactd.trust.policy.TrustPolicy` as ``trust``, every manifest
    to copy must verify in the source before anything is written to the
    destination (:class:`~artifactd.errors.TrustError` otherwise). With
    ``sign_key``, every copied manifest is also signed in the destination (a
    promotion signing with the production key), next to the signatures
    carried from the source; that takes a ``trust`` basis, the policy or
    :data:`~artifactd.trust.policy.UNSAFE_NO_VERIFICATION` (see
    :class:`~artifactd.trust.policy.UnsafeNoVerification`): without one it is a
    :class:`~artifactd.errors.UsageError`, before any store is opened.
    """
    # lazy: copying is this module's other half; reading an artifact (a restore) never loads it
    from artifactd.stores.credentials import check_unbound_pair  # noqa: PLC0415
    from artifactd.trust.signatures import sign_all  # noqa: PLC0415

    check_unbound_pair([source, destination])
    if sign_key is not None and trust is None:
        raise UsageError(
            "signing a copy needs a basis: what is copied must verify under a policy first",
            hint="pass --verify-key with the key that signed the source (CI's public key); "
            "to sign unverified content anyway, pass --sign-unverified",
        )
    with open_store(source, insecure=insecure) as src:
        # Verified before the destination is touched; no basis offered: copied unverified.
        chosen = choose_artifacts(src, tags, trust=trust or UNSAFE_NO_VERIFICATION)
        with (
            open_store(destination, create=True, insecure=insecure) as dst,
            tempfile.TemporaryDirectory(prefix="artifactd-copy-") as tmp,
        ):
            result = _copy_chosen(src, dst, chosen, Path(tmp))
            if sign_key is not None:
                result.signing = sign_all(dst, result.digests.values(), sign_key)
            return result


def inspect_ref(
    ref: str, *, keys: Sequence[PublicKey] = (), insecure: bool = False
) -> tuple[Artifact, TrustReport]:
    """Open the artifact ``ref`` names; return it with its :class:`TrustReport`."""
    store, reference = parse_manifest_ref(ref)
    with open_store(store, insecure=insecure) as st:
        art = read_artifact(st, reference)
        if art is None:
            raise NotFoundError(f"{store} has no artifact {reference}")
        return art, examine(st, art.digest, keys)


def sign_ref(ref: str, key: PrivateKey, *, basis: Basis, insecure: bool = False) -> SignResult:
    """Sign the manifest ``ref`` names (``STORE:TAG`` or ``STORE@DIGEST``) in its store.

    The manifest must verify under ``basis`` first (:func:`vouch`), unless
    it is :data:`UNSAFE_NO_VERIFICATION`: re-signing what a store holds is
    vouching for whoever put it there.
    """
    # lazy: signing is this module's other half; reading an artifact (a restore) never loads it
    from artifactd.trust.signatures import sign_all  # noqa: PLC0415

    store, reference = parse_manifest_ref(ref)
    with open_store(store, insecure=insecure) as st:
        found = st.get_manifest(reference)
        if found is None:
            raise NotFoundError(f"{store} has no manifest {reference}")
        return sign_all(st, vouch(st, [found.digest], basis), key)
