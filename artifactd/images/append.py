"""Append an artifact to a runtime image in the registry: no engine, no base layer moved.

``artifactd image append --base REF --artifact REF --to REF`` makes the derived
image a CI stage would otherwise build with ``docker build``:

* The artifact becomes one new layer: a tar of
  ``opt/prebuilt-cache/<fingerprint hash>/``, which holds the artifact as an OCI
  image layout tagged ``fp-<hash>`` (a store: ``artifactd restore --store
  oci:/opt/prebuilt-cache/<hash>`` restores from it, verified like any store).
  The tar is reproducible (sorted, owner 0, mtime 0, modes 0644/0755) and
  gzip-compressed by default, which every runtime reads; zstd on request (OCI
  bases only: Docker's manifest format has no zstd layer type).
* The base's config gets the layer's ``diff_id``, a history entry when it
  keeps a history, the labels ``io.artifactd.fingerprint``,
  ``io.artifactd.artifact`` and ``io.artifactd.families``, and
  ``ARTIFACTD_PREBUILT=/opt/prebuilt-cache`` in its environment. Nothing else
  of the base changes; the manifest keeps the base's format (OCI or Docker).
* The base's layers are never downloaded or uploaded: each is mounted from the
  base's repository into the target's (or found there already), so the base
  and the target must live in one registry.
* A base that is an index (several platforms) gets the layer on the
  platform(s) matching the artifact's architecture; the others are carried
  over unchanged, and a new index is written.
* The base is untrusted input (whoever can push to its repository chose it):
  every document read from it is checked before use (:func:`read_manifest`,
  :func:`read_index`, :func:`read_config`), and a malformed one is a
  :class:`~artifactd.errors.SchemaError` naming the document and the field,
  before anything is tagged.

Appending the same artifact to the same base again writes the same digests and
uploads nothing.
"""

from __future__ import annotations

import gzip
import json
import os
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Any, BinaryIO, Literal

from artifactd.constants import DEFAULT_PREBUILT, ENV_IMAGE_DIGEST, ENV_PREBUILT
from artifactd.errors import (
    ArtifactdError,
    IntegrityError,
    NotFoundError,
    SchemaError,
    UsageError,
)
from artifactd.events import EventSink, discard
from artifactd.format.imagemanifest import parse_document
from artifactd.format.oci import (
    INDEX_MEDIA_TYPE,
    MANIFEST_MEDIA_TYPE,
    family_tag,
    full_tag,
    is_digest,
)
from artifactd.format.zstd import ZstdCompressor
from artifactd.hashing import CHUNK, Hasher, HashingWriter, digest_of
from artifactd.jsontext import json_type
from artifactd.stores import open_store, parse_artifact_ref
from artifactd.stores.artifacts import Artifact, open_artifact, read_artifact
from artifactd.stores.base import progress_events
from artifactd.stores.credentials import check_unbound_pair
from artifactd.stores.registry import IMAGE_ACCEPT, RegistryStore, parse_registry_ref
from artifactd.trust.policy import Basis
from artifactd.trust.signatures import copy_attached

Compression = Literal["gzip", "zstd"]

DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_INDEX = "application/vnd.docker.distribution.manifest.list.v2+json"
_LAYER_TYPES = {
    (MANIFEST_MEDIA_TYPE, "gzip"): "application/vnd.oci.image.layer.v1.tar+gzip",
    (MANIFEST_MEDIA_TYPE, "zstd"): "application/vnd.oci.image.layer.v1.tar+zstd",
    (DOCKER_MANIFEST, "gzip"): "application/vnd.docker.image.rootfs.diff.tar.gzip",
}
#: An image config is read whole to be edited: refuse one claiming more than this.
MAX_CONFIG = 4 << 20
#: A base manifest or index is read whole: at most this many bytes (the
#: registry transport refuses a larger answer before it is parsed).
MAX_MANIFEST = 4 << 20
#: At most this many entries in a base index: real multi-platform images list
#: a few dozen (platforms, and an attestation per platform); each entry costs
#: requests, so 20,000 would run for many minutes.
MAX_INDEX_MANIFESTS = 256
#: At most this many layers in a base image (overlayfs stacks at most 128 or
#: so); each costs a request to reuse it in the target repository.
MAX_BASE_LAYERS = 512
#: At most this many blobs (configs and layers) of the base reused in the
#: target, over every platform of an index: a few hundred in real images;
#: it bounds the requests an append makes whatever the index holds.
MAX_BASE_BLOBS = 2048
#: Labels the appended image carries.
LABEL_FINGERPRINT = "io.artifactd.fingerprint"
LABEL_ARTIFACT = "io.artifactd.artifact"
LABEL_FAMILIES = "io.artifactd.families"


@dataclass(frozen=True)
class BakedLayer:
    """The artifact as an image layer: the compressed file, its digest, size and ``diff_id``."""

    path: Path
    digest: str
    size: int
    diff_id: str
    compression: Compression


@dataclass
class AppendResult:
    """What ``image append`` wrote: the target, its digest, and what moved."""

    target: str
    digest: str
    media_type: str
    fingerprint_hash: str
    artifact: str
    layer_digest: str
    layer_size: int
    platforms: list[str] = field(default_factory=list)
    #: Blob bytes sent to the registry: the new layer and config(s), once (manifests aside).
    bytes_uploaded: int = 0
    #: Bytes of base layers linked into the target's repository without a transfer.
    bytes_reused: int = 0


def append_image(
    base: str,
    artifact: str,
    to: str,
    *,
    trust: Basis,
    compression: Compression = "gzip",
    insecure: bool = False,
    on_event: EventSink = discard,
) -> AppendResult:
    """Write ``to``: the image ``base`` plus one layer holding ``artifact`` (see the module doc)."""
    base_ref, to_ref = parse_registry_ref(base), parse_registry_ref(to)
    if base_ref.reference is None or to_ref.reference is None:
        raise UsageError(
            "--base and --to need a tag or digest (HOST/REPO:TAG)",
            hint="e.g. --base registry:5000/vllm:0.8 --to registry:5000/vllm:0.8-warm",
        )
    if to_ref.reference.startswith("sha256:"):
        raise UsageError(f"--to {to!r} must end in a tag, not a digest")
    if base_ref.host != to_ref.host:
        raise UsageError(
            f"the base ({base_ref.host}) and the target ({to_ref.host}) are in different "
            "registries: append reuses the base's layers in place and never copies them",
            hint="copy the base into the target registry first (skopeo copy)",
        )
    check_unbound_pair([artifact, base, to])
    art = open_artifact(artifact, trust=trust, insecure=insecure)
    src, dst = _registry(base_ref.store, insecure), _registry(to_ref.store, insecure)
    try:
        with tempfile.TemporaryDirectory(prefix="artifactd-append-") as tmp:
            layer = bake_layer(artifact, art, Path(tmp), compression=compression, insecure=insecure)
            on_event({"stage": "append", "event": "baked", "bytes": layer.size})
            top = src.get_manifest(base_ref.reference, accept=IMAGE_ACCEPT)
            if top is None:
                raise NotFoundError(f"{src.ref} has no image {base_ref.reference}")
            job = _Append(
                src,
                dst,
                base_repo=base_ref.repo,
                art=art,
                layer=layer,
                work=Path(tmp),
                on_event=on_event,
            )
            where = f"the base {base}"
            media_type = top.media_type or _media_type(
                parse_document(top.data, source=where, max_bytes=MAX_MANIFEST), where
            )
            if media_type in _INDEX_TYPES:
                data = job.index(top.data, where)
            else:
                data, _ = job.manifest(top.data, media_type, where)
                job.platforms.append(art.config.architecture)
            digest = dst.put_manifest(data, media_type, [to_ref.reference])
    finally:
        src.close()
        dst.close()
    on_event({"stage": "append", "event": "done", "target": to, "digest": digest})
    return AppendResult(
        target=to,
        digest=digest,
        media_type=media_type,
        fingerprint_hash=art.config.fingerprint_hash,
        artifact=art.digest,
        layer_digest=layer.digest,
        layer_size=layer.size,
        platforms=job.platforms,
        bytes_uploaded=job.uploaded,
        bytes_reused=job.reused,
    )


def _registry(store_ref: str, insecure: bool) -> RegistryStore:
    store = open_store(store_ref, insecure=insecure)
    if not isinstance(store, RegistryStore):  # pragma: no cover - parse_registry_ref said so
        raise UsageError(f"{store_ref} is not a registry")
    return store


# --------------------------------------------------------------------------
# The layer
# --------------------------------------------------------------------------


def bake_layer(
    artifact_ref: str,
    art: Artifact,
    work: Path,
    *,
    compression: Compression = "gzip",
    insecure: bool = False,
) -> BakedLayer:
    """Write ``art`` as an OCI layout at ``opt/prebuilt-cache/<hash>/``; pack that as a layer."""
    fp_hash = art.config.fingerprint_hash
    root = work / "root"
    write_layout(artifact_ref, art, root / DEFAULT_PREBUILT.strip("/") / fp_hash, work, insecure)
    out = work / f"layer.tar.{'gz' if compression == 'gzip' else 'zst'}"
    with out.open("wb") as raw:
        compressed = HashingWriter(raw)
        with _Compressor(compressed, compression) as stream:  # type: ignore[arg-type]
            plain = HashingWriter(stream)
            with tarfile.open(fileobj=plain, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
                for rel in _tree(root):
                    _add(tar, root, rel)
    return BakedLayer(
        out, compressed.hasher.digest, compressed.hasher.size, plain.hasher.digest, compression
    )


def write_layout(
    artifact_ref: str, art: Artifact, layout: Path, work: Path, insecure: bool = False
) -> None:
    """Copy ``art`` (read from ``artifact_ref``'s store) into a new OCI layout at ``layout``.

    The layout holds the artifact's manifest, config and layers, tagged
    ``fp-<fingerprint hash>``, and each family's manifest under its scope tag
    where the source's scope tag names this very layer (a restore whose
    fingerprint differs, say in the model, still finds the families that do
    not depend on it): the store a runtime image carries under
    ``/opt/prebuilt-cache/<hash>/``, with each manifest's signatures and
    attestations, so ``restore --verify-key`` verifies the baked store as it
    would the registry. ``work`` holds the blobs in transit.
    """
    parsed = parse_artifact_ref(artifact_ref)
    with (
        open_store(parsed.store, insecure=insecure) as src,
        open_store(f"oci:{layout}", create=True) as dst,
    ):
        ref = src.get_manifest(art.digest)
        if ref is None:  # pragma: no cover - read a moment ago
            raise NotFoundError(f"{src.ref} has no manifest {art.digest}")
        for desc in [art.manifest.config, *art.manifest.layers]:
            src.copy_blob(dst, desc.digest, desc.size, work)
        dst.put_manifest(
            ref.data, ref.media_type or MANIFEST_MEDIA_TYPE, [full_tag(art.config.fingerprint_hash)]
        )
        copy_attached(src, dst, art.digest, work)
        for rec in art.config.layers:
            tag = family_tag(rec.family, rec.scope_key)
            try:
                fam = read_artifact(src, tag)
            except ArtifactdError:
                continue  # an unreadable family tag: the full artifact is still baked
            fam_ref = src.get_manifest(fam.digest) if fam is not None else None
            if fam is None or fam_ref is None:
                continue
            if [layer.digest for layer in fam.manifest.layers] != [rec.digest]:
                continue  # the tag names another build's layer now
            cfg = fam.manifest.config
            src.copy_blob(dst, cfg.digest, cfg.size, work)
            dst.put_manifest(fam_ref.data, fam_ref.media_type or MANIFEST_MEDIA_TYPE, [tag])
            copy_attached(src, dst, fam.digest, work)


def baked_env(art: Artifact) -> dict[str, str]:
    """Return the environment a derived image carries for ``art``.

    ``ARTIFACTD_PREBUILT`` (where its store is) and, when the artifact's
    fingerprint names the image it was built in, ``ARTIFACTD_IMAGE_DIGEST``:
    the derived image runs that image's software, so a restore in it computes
    the same fingerprint without being told (its own digest differs). The
    workload is the pod's to give: one image serves many models.
    """
    env = {ENV_PREBUILT: DEFAULT_PREBUILT}
    digest = art.config.fingerprint.image.digest
    if digest:
        env[ENV_IMAGE_DIGEST] = digest
    return env


class _Compressor:
    """A context manager around a compressing writer that leaves the sink open."""

    def __init__(self, sink: IO[bytes], compression: Compression) -> None:
        self._writer: Any
        if compression == "gzip":
            # mtime 0 and no file name: the same tar gives the same bytes.
            self._writer = gzip.GzipFile(fileobj=sink, mode="wb", mtime=0, compresslevel=6)
        else:
            self._writer = ZstdCompressor(level=6).stream_writer(sink, closefd=False)

    def __enter__(self) -> Any:
        return self._writer

    def __exit__(self, *exc: object) -> None:
        self._writer.close()


def _tree(root: Path) -> Iterator[PurePosixPath]:
    """Every directory and file under ``root``, relative, sorted, parents first."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        here = PurePosixPath(Path(dirpath).relative_to(root).as_posix())
        if str(here) != ".":
            yield here
        for name in sorted(filenames):
            yield here / name


def _add(tar: tarfile.TarFile, root: Path, rel: PurePosixPath) -> None:
    path = root / rel
    info = tarfile.TarInfo(str(rel))
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if path.is_dir():
        info.type = tarfile.DIRTYPE
        info.mode = 0o755
        tar.addfile(info)
        return
    info.size = path.stat().st_size
    info.mode = 0o644
    with path.open("rb") as f:
        tar.addfile(info, f)


# --------------------------------------------------------------------------
# Manifests and configs
# --------------------------------------------------------------------------


class _Append:
    """One append: the stores, the artifact, the baked layer, and what was moved."""

    def __init__(
        self,
        src: RegistryStore,
        dst: RegistryStore,
        *,
        base_repo: str,
        art: Artifact,
        layer: BakedLayer,
        work: Path,
        on_event: EventSink,
    ) -> None:
        self.src, self.dst, self.base_repo = src, dst, base_repo
        self.art, self.layer, self.work, self.on_event = art, layer, work, on_event
        self.uploaded = 0
        self.reused = 0
        self.blobs = 0
        #: Blobs known to be in the target repository: asked about once.
        self.present: set[str] = set()
        self.platforms: list[str] = []

    def index(self, data: bytes, where: str) -> bytes:
        """Rewrite an index: append to the matching platforms, carry the others over."""
        doc, entries_in = read_index(data, where)
        arch = self.art.config.architecture
        entries = []
        for i, entry in enumerate(entries_in):
            at = f"{where}: manifests[{i}] ({entry['digest'][:19]}...)"
            platform = entry.get("platform") or {}
            ref = self.src.get_manifest(entry["digest"], accept=IMAGE_ACCEPT)
            if ref is None:
                raise NotFoundError(f"{self.src.ref} has no manifest {entry['digest']}")
            media_type = entry.get("mediaType") or ref.media_type
            if media_type in _INDEX_TYPES:
                raise SchemaError(
                    f"{at} is an index inside the index: not an image",
                    hint="append to a single-level index, or to one platform's image",
                )
            if platform.get("os") == "linux" and platform.get("architecture") == arch:
                new, size = self.manifest(ref.data, media_type, at)
                digest = self.dst.put_manifest(new, media_type, [])
                entries.append({**entry, "digest": digest, "size": size})
                self.platforms.append(
                    arch + (f"/{platform['variant']}" if "variant" in platform else "")
                )
            else:
                self._carry(ref.data, media_type, at)
                entries.append(entry)
        if not self.platforms:
            raise UsageError(
                f"the base has no linux/{arch} image for this {arch} artifact",
                hint="append to an image of the architecture the caches were built on",
            )
        return json.dumps({**doc, "manifests": entries}, separators=(",", ":")).encode()

    def manifest(self, data: bytes, media_type: str, where: str) -> tuple[bytes, int]:
        """Return the base manifest ``data`` with the layer appended (and its size)."""
        layer_type = _LAYER_TYPES.get((media_type, self.layer.compression))
        if layer_type is None:
            raise UsageError(
                f"cannot append a {self.layer.compression} layer to a {media_type or '?'} image",
                hint="Docker's manifest format has no zstd layer type: use --compression gzip",
            )
        doc = read_manifest(data, where)
        config = self._config(doc["config"], len(doc.get("layers", [])), where)
        for desc in doc.get("layers", []):
            self._reuse(desc)
        config_digest = digest_of(config)
        path = self.work / "config.json"
        path.write_bytes(config)
        self.uploaded += self.dst.put_blob(path, config_digest, len(config))
        progress = progress_events(
            self.on_event, stage="append", family="layer", total=self.layer.size
        )
        self.uploaded += self.dst.put_blob(
            self.layer.path, self.layer.digest, self.layer.size, progress
        )
        doc["config"] = {**doc["config"], "digest": config_digest, "size": len(config)}
        doc["layers"] = [
            *doc.get("layers", []),
            {"mediaType": layer_type, "digest": self.layer.digest, "size": self.layer.size},
        ]
        new = json.dumps(doc, separators=(",", ":")).encode()
        return new, len(new)

    def _config(self, desc: dict[str, Any], layers: int, where: str) -> bytes:
        """Return the base config with the diff_id, a history entry, labels and env added."""
        if desc["size"] > MAX_CONFIG:
            raise IntegrityError(
                f"{self.src.ref}: config {desc['digest']} claims {desc['size']} bytes "
                f"(over {MAX_CONFIG >> 20} MiB): not an image config"
            )

        def consume(reader: BinaryIO) -> tuple[Hasher, list[bytes]]:
            hasher = Hasher()
            chunks = []
            while chunk := reader.read(CHUNK):
                hasher.update(chunk)
                chunks.append(chunk)
                if hasher.size > desc["size"]:
                    break
            return hasher, chunks

        hasher, chunks = self.src.consume_blob(desc["digest"], desc["size"], consume)
        if not hasher.matches(desc["digest"], desc["size"]):
            raise IntegrityError(f"{self.src.ref}: config {desc['digest']} does not match")
        cfg = read_config(b"".join(chunks), f"{where}: config {desc['digest'][:19]}...", layers)
        arch = self.art.config.architecture
        if cfg.get("architecture", arch) != arch:
            raise UsageError(
                f"the base is a {cfg['architecture']} image and the caches were built on {arch}",
                hint="append to an image of the architecture the caches were built on",
            )
        cfg.setdefault("rootfs", {"type": "layers", "diff_ids": []})["diff_ids"].append(
            self.layer.diff_id
        )
        fp_hash = self.art.config.fingerprint_hash
        if isinstance(cfg.get("history"), list):
            cfg["history"].append(
                {
                    "created_by": f"artifactd image append {self.art.digest}",
                    "comment": f"compile caches for fingerprint {fp_hash}",
                }
            )
        runtime = cfg["config"] = cfg.get("config") or {}
        labels = dict(runtime.get("Labels") or {})
        labels[LABEL_FINGERPRINT] = fp_hash
        labels[LABEL_ARTIFACT] = self.art.digest
        labels[LABEL_FAMILIES] = ",".join(sorted(r.family for r in self.art.config.layers))
        runtime["Labels"] = labels
        baked = baked_env(self.art)
        env = [e for e in runtime.get("Env") or [] if e.partition("=")[0] not in baked]
        runtime["Env"] = [*env, *(f"{k}={v}" for k, v in baked.items())]
        return json.dumps(cfg, separators=(",", ":")).encode()

    def _reuse(self, desc: dict[str, Any]) -> None:
        """Make a base blob present in the target repository without moving its bytes."""
        self.blobs += 1
        if self.blobs > MAX_BASE_BLOBS:
            raise SchemaError(
                f"the base references more than {MAX_BASE_BLOBS} blobs over its platforms",
                hint="append to one platform's image (--base REPO@sha256:...)",
            )
        digest = desc["digest"]
        if digest in self.present or (
            self.dst.has_blob(digest) or self.dst.mount_blob(digest, self.base_repo)
        ):
            self.present.add(digest)
            self.reused += int(desc.get("size", 0))
            return
        raise NotFoundError(
            f"{self.dst.ref}: cannot reuse base blob {digest} (mount from {self.base_repo} "
            "refused)",
            hint="the registry must allow cross-repository mounts, or hold the base in the "
            "target repository",
        )

    def _carry(self, data: bytes, media_type: str, where: str) -> None:
        """Copy another platform's manifest into the target repository, its blobs by mount."""
        doc = read_manifest(data, where)
        for desc in [doc["config"], *doc.get("layers", [])]:
            self._reuse(desc)
        self.dst.put_manifest(data, media_type, [])


# --------------------------------------------------------------------------
# Reading the base: every document is untrusted input
# --------------------------------------------------------------------------
#
# The base comes from a registry (and whoever can push to it): each document
# is checked for every field append reads, before it is used, so that a
# malformed one is a SchemaError (exit 5) naming the document and the field,
# never a crash, and an oversized one costs nothing.

_INDEX_TYPES = (INDEX_MEDIA_TYPE, DOCKER_INDEX)


def _media_type(doc: dict[str, Any], where: str) -> str:
    value = doc.get("mediaType", "")
    if not isinstance(value, str):
        raise SchemaError(f"{where}: mediaType is a JSON {json_type(value)}, not a string")
    return value


def _need(value: Any, kind: type, where: str, what: str) -> Any:
    """Return ``value`` if it has the JSON type ``what`` names (``kind`` in Python), else raise."""
    if not isinstance(value, kind):
        raise SchemaError(f"{where} is a JSON {json_type(value)}, not {what}")
    return value


def _descriptor(value: Any, where: str) -> dict[str, Any]:
    """Check an OCI descriptor: an object with a well-formed ``digest`` and a ``size``."""
    desc: dict[str, Any] = _need(value, dict, where, "a descriptor object")
    digest = desc.get("digest")
    if digest is None:
        raise SchemaError(f"{where} has no digest")
    if not isinstance(digest, str) or not is_digest(digest):
        raise SchemaError(f"{where}: digest {str(digest)[:80]!r} is not sha256:<64 hex>")
    size = desc.get("size")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise SchemaError(f"{where}: size {str(size)[:40]!r} is not a byte count")
    if "mediaType" in desc:
        _need(desc["mediaType"], str, f"{where}.mediaType", "a string")
    return desc


def read_manifest(data: bytes, where: str) -> dict[str, Any]:
    """Parse a base image manifest (OCI or Docker schema 2), checking what append reads.

    ``config`` must be a descriptor, ``layers`` (when present) a list of at
    most :data:`MAX_BASE_LAYERS` descriptors. Raises :class:`SchemaError`.
    """
    doc = parse_document(data, source=where, max_bytes=MAX_MANIFEST)
    if doc.get("schemaVersion", 2) != 2:
        raise SchemaError(f"{where}: schemaVersion {doc['schemaVersion']!r} is not 2")
    _media_type(doc, where)
    if "config" not in doc:
        raise SchemaError(f"{where} has no config: not an image manifest")
    _descriptor(doc["config"], f"{where}: config")
    layers = _need(doc.get("layers", []), list, f"{where}: layers", "an array")
    if len(layers) > MAX_BASE_LAYERS:
        raise SchemaError(f"{where} has {len(layers)} layers (at most {MAX_BASE_LAYERS})")
    for i, desc in enumerate(layers):
        _descriptor(desc, f"{where}: layers[{i}]")
    return doc


def read_index(data: bytes, where: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Parse a base index: at most :data:`MAX_INDEX_MANIFESTS` descriptors with platforms.

    Returns the document and its entries; raises :class:`SchemaError`.
    """
    doc = parse_document(data, source=where, max_bytes=MAX_MANIFEST)
    _media_type(doc, where)
    if "manifests" not in doc:
        raise SchemaError(f"{where} has no manifests: not an image index")
    entries = _need(doc["manifests"], list, f"{where}: manifests", "an array")
    if len(entries) > MAX_INDEX_MANIFESTS:
        raise SchemaError(
            f"{where} lists {len(entries)} manifests (at most {MAX_INDEX_MANIFESTS})",
            hint="append to one platform's image (--base REPO@sha256:...)",
        )
    for i, entry in enumerate(entries):
        at = f"{where}: manifests[{i}]"
        _descriptor(entry, at)
        platform = _need(entry.get("platform") or {}, dict, f"{at}.platform", "an object")
        for key in ("os", "architecture", "variant"):
            if key in platform:
                _need(platform[key], str, f"{at}.platform.{key}", "a string")
    return doc, entries


def read_config(data: bytes, where: str, layers: int) -> dict[str, Any]:
    """Parse a base image config, checking every field append edits.

    ``architecture`` a string; ``rootfs.diff_ids`` one digest per layer of the
    manifest (``layers``); ``config``, its ``Labels`` and ``Env`` of the types
    the image spec gives them. Raises :class:`SchemaError`.
    """
    cfg = parse_document(data, source=where, max_bytes=MAX_CONFIG)
    if "architecture" in cfg:
        _need(cfg["architecture"], str, f"{where}: architecture", "a string")
    rootfs = _need(cfg.setdefault("rootfs", {"type": "layers", "diff_ids": []}), dict,
                   f"{where}: rootfs", "an object")  # fmt: skip
    diff_ids = _need(rootfs.get("diff_ids"), list, f"{where}: rootfs.diff_ids", "an array")
    for i, diff_id in enumerate(diff_ids):
        if not isinstance(diff_id, str) or not is_digest(diff_id):
            raise SchemaError(f"{where}: rootfs.diff_ids[{i}] is not sha256:<64 hex>")
    if len(diff_ids) != layers:
        raise SchemaError(
            f"{where}: rootfs.diff_ids lists {len(diff_ids)} layer(s), the manifest {layers}"
        )
    runtime = _need(cfg.get("config") or {}, dict, f"{where}: config", "an object")
    labels = _need(runtime.get("Labels") or {}, dict, f"{where}: config.Labels", "an object")
    for key, value in labels.items():
        _need(value, str, f"{where}: config.Labels[{key[:40]!r}]", "a string")
    env = _need(runtime.get("Env") or [], list, f"{where}: config.Env", "an array")
    for i, entry in enumerate(env):
        _need(entry, str, f"{where}: config.Env[{i}]", "a string")
    return cfg
