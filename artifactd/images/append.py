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
from typing import IO, Any, Literal

from artifactd.artifacts import Artifact, copy_blob, open_artifact, read_artifact
from artifactd.constants import DEFAULT_PREBUILT, ENV_IMAGE_DIGEST, ENV_PREBUILT
from artifactd.errors import ArtifactdError, IntegrityError, NotFoundError, UsageError
from artifactd.events import EventSink, discard
from artifactd.hashing import CHUNK, Hasher, HashingWriter, digest_of
from artifactd.oci import INDEX_MEDIA_TYPE, MANIFEST_MEDIA_TYPE, family_tag, full_tag
from artifactd.stores import open_store, parse_artifact_ref
from artifactd.stores.base import progress_events
from artifactd.stores.credentials import check_unbound_pair
from artifactd.stores.registry import IMAGE_ACCEPT, RegistryStore, parse_registry_ref
from artifactd.trust import copy_attached

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
    art = open_artifact(artifact, insecure=insecure)
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
            media_type = top.media_type or json.loads(top.data).get("mediaType", "")
            if media_type in (INDEX_MEDIA_TYPE, DOCKER_INDEX):
                data = job.index(top.data)
            else:
                data, _ = job.manifest(top.data, media_type)
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
            copy_blob(src, dst, desc.digest, desc.size, work)
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
            copy_blob(src, dst, cfg.digest, cfg.size, work)
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
            import zstandard

            self._writer = zstandard.ZstdCompressor(level=6).stream_writer(sink, closefd=False)

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
        self.platforms: list[str] = []

    def index(self, data: bytes) -> bytes:
        """Rewrite an index: append to the matching platforms, carry the others over."""
        doc = json.loads(data)
        arch = self.art.config.architecture
        entries = []
        for entry in doc.get("manifests", []):
            platform = entry.get("platform") or {}
            ref = self.src.get_manifest(entry["digest"], accept=IMAGE_ACCEPT)
            if ref is None:
                raise NotFoundError(f"{self.src.ref} has no manifest {entry['digest']}")
            media_type = entry.get("mediaType") or ref.media_type
            if platform.get("os") == "linux" and platform.get("architecture") == arch:
                new, size = self.manifest(ref.data, media_type)
                digest = self.dst.put_manifest(new, media_type, [])
                entries.append({**entry, "digest": digest, "size": size})
                self.platforms.append(
                    arch + (f"/{platform['variant']}" if "variant" in platform else "")
                )
            else:
                self._carry(ref.data, media_type)
                entries.append(entry)
        if not self.platforms:
            raise UsageError(
                f"the base has no linux/{arch} image for this {arch} artifact",
                hint="append to an image of the architecture the caches were built on",
            )
        return json.dumps({**doc, "manifests": entries}, separators=(",", ":")).encode()

    def manifest(self, data: bytes, media_type: str) -> tuple[bytes, int]:
        """Return the base manifest ``data`` with the layer appended (and its size)."""
        layer_type = _LAYER_TYPES.get((media_type, self.layer.compression))
        if layer_type is None:
            raise UsageError(
                f"cannot append a {self.layer.compression} layer to a {media_type or '?'} image",
                hint="Docker's manifest format has no zstd layer type: use --compression gzip",
            )
        doc = json.loads(data)
        for desc in doc.get("layers", []):
            self._reuse(desc)
        config = self._config(doc["config"])
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

    def _config(self, desc: dict[str, Any]) -> bytes:
        """Return the base config with the diff_id, a history entry, labels and env added."""
        if desc["size"] > MAX_CONFIG:
            raise IntegrityError(
                f"{self.src.ref}: config {desc['digest']} claims {desc['size']} bytes "
                f"(over {MAX_CONFIG >> 20} MiB): not an image config"
            )
        hasher = Hasher()
        chunks = []
        with self.src.open_blob(desc["digest"], desc["size"]) as reader:
            while chunk := reader.read(CHUNK):
                hasher.update(chunk)
                chunks.append(chunk)
                if hasher.size > desc["size"]:
                    break
        if not hasher.matches(desc["digest"], desc["size"]):
            raise IntegrityError(f"{self.src.ref}: config {desc['digest']} does not match")
        cfg = json.loads(b"".join(chunks))
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
        runtime = cfg.setdefault("config", {})
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
        digest = desc["digest"]
        if self.dst.has_blob(digest) or self.dst.mount_blob(digest, self.base_repo):
            self.reused += int(desc.get("size", 0))
            return
        raise NotFoundError(
            f"{self.dst.ref}: cannot reuse base blob {digest} (mount from {self.base_repo} "
            "refused)",
            hint="the registry must allow cross-repository mounts, or hold the base in the "
            "target repository",
        )

    def _carry(self, data: bytes, media_type: str) -> None:
        """Copy another platform's manifest into the target repository, its blobs by mount."""
        doc = json.loads(data)
        for desc in [doc["config"], *doc.get("layers", [])]:
            self._reuse(desc)
        self.dst.put_manifest(data, media_type, [])
