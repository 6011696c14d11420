"""An OCI registry repository as a store (``HOST[:PORT]/REPO``).

The distribution-API calls are ours, so blobs are streamed from and to disk
(never whole in RAM), manifests are pushed as our exact bytes (so digests are
reproducible), and every digest is verified. References are parsed in
:mod:`~artifactd.stores.reference`, credentials found in
:mod:`~artifactd.stores.credentials`, and the HTTP (auth, timeouts, retries)
done in :mod:`~artifactd.stores.transport`, the only module that talks to
oras-py.

Plain HTTP is used automatically for loopback registries (as Docker treats
127.0.0.0/8), and otherwise only with ``insecure=True``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, TypeVar
from urllib.parse import urljoin

from artifactd.errors import IntegrityError, NotFoundError, StoreError
from artifactd.format.oci import (
    DOCKER_LIST_MEDIA_TYPE,
    INDEX_MEDIA_TYPE,
    MANIFEST_MEDIA_TYPE,
    check_digest,
    check_tag,
    is_digest,
    superseded_tag,
)
from artifactd.hashing import digest_of
from artifactd.stores.base import ManifestRef, Progress, Store
from artifactd.stores.credentials import Credentials, find_credentials
from artifactd.stores.listing import PAGE_SIZE, Page, read_tag_pages
from artifactd.stores.mirrors import MirrorSettings, plan_mirrors
from artifactd.stores.pull import Puller
from artifactd.stores.reference import (
    RegistryRef,
    is_loopback,
    looks_like_registry,
    parse_registry_ref,
)
from artifactd.stores.transport import ATTEMPTS, Transport

# Re-exported: callers that open registries import these names from here.
__all__ = [
    "ATTEMPTS",
    "Credentials",
    "RegistryRef",
    "RegistryStore",
    "find_credentials",
    "is_loopback",
    "looks_like_registry",
    "parse_registry_ref",
]

T = TypeVar("T")

_ACCEPT = ", ".join([MANIFEST_MEDIA_TYPE, INDEX_MEDIA_TYPE])
#: What an image manifest lookup accepts: OCI and Docker schema 2 manifests and indexes.
IMAGE_ACCEPT = ", ".join(
    [
        MANIFEST_MEDIA_TYPE,
        INDEX_MEDIA_TYPE,
        "application/vnd.docker.distribution.manifest.v2+json",
        DOCKER_LIST_MEDIA_TYPE,
    ]
)


class RegistryStore(Store):
    """A repository in an OCI registry, spoken to over the distribution API."""

    def __init__(
        self,
        ref: RegistryRef,
        *,
        insecure: bool = False,
        environ: Mapping[str, str] | None = None,
        mirrors: MirrorSettings | None = None,
        pins: Mapping[str, str] | None = None,
    ) -> None:
        """Open ``ref``; ``mirrors`` and ``pins`` shape its pulls.

        ``mirrors`` says where mirror configuration comes from (default: the
        ``ARTIFACTD_*`` variables, else containerd's and the containers' files);
        ``pins`` maps tags to digests used when the origin cannot resolve them.
        """
        self.target = ref
        self.ref = ref.store
        self.plain_http = insecure or is_loopback(ref.host)
        self.base = f"{'http' if self.plain_http else 'https'}://{ref.host}/v2/{ref.repo}"
        self._transport = Transport(
            ref.host,
            plain_http=self.plain_http,
            credentials=find_credentials(ref.host, environ),
            name=self.ref,
        )
        settings = mirrors if mirrors is not None else MirrorSettings.from_environ(environ)
        self.puller = Puller(
            self._send,
            self.base,
            self.ref,
            lambda: plan_mirrors(ref.host, ref.repo, settings),
            pins,
        )

    def _send(self, method: str, url: str, **kwargs: Any) -> Any:
        """One request through the transport (auth, timeouts, bounded retries)."""
        return self._transport.send(method, url, **kwargs)

    # -- blobs --------------------------------------------------------------
    def has_blob(self, digest: str) -> bool:
        """HEAD the blob: 200 present, 404 absent."""
        check_digest(digest)
        resp = self._send("HEAD", f"{self.base}/blobs/{digest}", missing=(404,), what="blob lookup")
        resp.close()
        return bool(resp.status_code == 200)

    def put_blob(self, path: Path, digest: str, size: int, progress: Progress | None = None) -> int:
        """Upload a file unless the registry has it (monolithic POST + PUT, streamed)."""
        check_digest(digest)
        if self.has_blob(digest):
            return 0
        start = self._send(
            "POST",
            f"{self.base}/blobs/uploads/",
            ok=(202,),
            headers={"Content-Length": "0"},
            what="upload start",
        )
        location = start.headers.get("Location")
        start.close()
        if not location:
            raise StoreError(f"{self.ref}: upload start returned no Location")
        url = urljoin(f"{self.base}/", location)
        url += ("&" if "?" in url else "?") + f"digest={digest}"
        done = self._send(
            "PUT",
            url,
            body=path,
            progress=progress,
            ok=(201, 204),
            headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)},
            what="blob upload",
        )
        done.close()
        return size

    def mount_blob(self, digest: str, from_repo: str) -> bool:
        """Link a blob of repository ``from_repo`` (same registry) into this one, uploading nothing.

        True when the blob is here afterwards: mounted (201), or already
        present. A registry that declines the mount opens an upload session
        instead (202); it is cancelled and the blob is looked up.
        """
        check_digest(digest)
        resp = self._send(
            "POST",
            f"{self.base}/blobs/uploads/?mount={digest}&from={from_repo}",
            ok=(201, 202),
            headers={"Content-Length": "0"},
            what="blob mount",
        )
        location = resp.headers.get("Location")
        resp.close()
        if resp.status_code == 201:
            return True
        if location:
            self._send(
                "DELETE",
                urljoin(f"{self.base}/", location),
                ok=(204,),
                missing=(404,),
                what="upload cancel",
            ).close()
        return self.has_blob(digest)

    @contextmanager
    def open_blob(self, digest: str, size: int) -> Iterator[BinaryIO]:
        """Stream a blob through the mirrors, then the origin; its end is verified."""
        check_digest(digest)
        with self.puller.open_blob(digest, size) as reader:
            yield reader

    def consume_blob(self, digest: str, size: int, consume: Callable[[BinaryIO], T]) -> T:
        """Run ``consume`` on the blob, rerun from the next source when one fails."""
        check_digest(digest)
        return self.puller.consume_blob(digest, size, consume)

    # -- manifests ----------------------------------------------------------
    def put_manifest(self, data: bytes, media_type: str, tags: list[str]) -> str:
        """PUT our exact bytes under each tag (or by digest); return the digest.

        A tag that named another manifest leaves that manifest untagged, which
        no tag listing shows again (the distribution API lists tags, never
        manifests), so no prune could find it: its blobs would stay forever.
        Before re-pointing, the old manifest is tagged
        :func:`~artifactd.format.oci.superseded_tag` (see :meth:`_supersede`).
        """
        digest = digest_of(data)
        for ref in [check_tag(t) for t in tags] or [digest]:
            if ref != digest:
                old = self._origin_tag(ref)  # a push asks the registry itself
                if old is not None and old != digest:
                    self._supersede(old)
            resp = self._send(
                "PUT",
                f"{self.base}/manifests/{ref}",
                body=data,
                ok=(201, 200),
                headers={"Content-Type": media_type},
                what="manifest upload",
            )
            answered = resp.headers.get("Docker-Content-Digest")
            resp.close()
            if answered and answered != digest:
                raise IntegrityError(
                    f"{self.ref}: registry stored manifest as {answered}, expected {digest}"
                )
        return digest

    def _supersede(self, digest: str) -> None:
        """Tag manifest ``digest``, about to lose a tag, as superseded now.

        The tag goes on first: a publish killed in between leaves the old
        manifest with both tags, which a prune treats as still current. Its
        exact bytes are read back by digest and put again (a registry keeps
        one manifest per digest), so nothing new is stored. Gone meanwhile:
        nothing to record.
        """
        ref = self.get_manifest(digest)
        if ref is None:
            return
        tag = superseded_tag(digest, time.time())
        resp = self._send(
            "PUT",
            f"{self.base}/manifests/{tag}",
            body=ref.data,
            ok=(201, 200),
            headers={"Content-Type": ref.media_type or MANIFEST_MEDIA_TYPE},
            what="manifest upload",
        )
        resp.close()

    def get_manifest(self, reference: str, *, accept: str = _ACCEPT) -> ManifestRef | None:
        """GET a manifest by tag or digest; verify its digest.

        ``accept`` widens the media types asked for (:data:`IMAGE_ACCEPT`: any
        runnable image, Docker's formats included).
        """
        if is_digest(reference):
            return self.puller.manifest(reference, accept)
        check_tag(reference)
        if self.puller.has_mirrors():
            # The origin names the digest (a HEAD); its bytes come by digest, mirrors first.
            digest = self.tag_digest(reference)
            return None if digest is None else self.puller.manifest(digest, accept)
        try:
            return self._origin_manifest(reference, accept)
        except (NotFoundError, IntegrityError):
            raise
        except StoreError as exc:
            # The origin cannot answer: a resolving mirror or a pin may name the digest.
            self.puller.plan()  # a blocked registry is refused before anything else
            digest = self.puller.fallback_tag(reference, exc, accept)
            return None if digest is None else self.puller.manifest(digest, accept)

    def _origin_manifest(self, reference: str, accept: str) -> ManifestRef | None:
        resp = self._send(
            "GET",
            f"{self.base}/manifests/{reference}",
            missing=(404,),
            headers={"Accept": accept},
            what="manifest lookup",
        )
        if resp.status_code == 404:
            resp.close()
            return None
        data = resp.content
        media_type = resp.headers.get("Content-Type", "").split(";")[0].strip()
        resp.close()
        digest = digest_of(data)
        if is_digest(reference) and digest != reference:
            raise IntegrityError(f"{self.ref}: manifest {reference} hashes to {digest}")
        return ManifestRef(data=data, digest=digest, media_type=media_type)

    def tag_digest(self, tag: str) -> str | None:
        """Return the digest a tag points at: the origin's answer (see :meth:`Puller.resolve`)."""
        return self.puller.resolve(tag, lambda: self._origin_tag(tag), _ACCEPT)

    def _origin_tag(self, tag: str) -> str | None:
        """HEAD a tag at the origin and return the digest it points at (no body transferred)."""
        resp = self._send(
            "HEAD",
            f"{self.base}/manifests/{check_tag(tag)}",
            missing=(404,),
            headers={"Accept": _ACCEPT},
            what="tag lookup",
        )
        resp.close()
        if resp.status_code == 404:
            return None
        digest = resp.headers.get("Docker-Content-Digest")
        if digest and is_digest(digest):
            return str(digest)
        ref = self._origin_manifest(tag, _ACCEPT)
        return ref.digest if ref else None

    def delete_manifest(self, digest: str) -> bool:
        """DELETE the manifest ``digest`` (the registry drops every tag naming it).

        Returns False when it was already gone. Its blobs stay until the
        registry's own garbage collection. A registry that refuses deletes
        (405: distribution's default) raises :class:`StoreError` before
        anything was deleted, since the refusal is for every manifest alike.
        """
        check_digest(digest)
        resp = self._send(
            "DELETE",
            f"{self.base}/manifests/{digest}",
            ok=(202, 200, 204),
            missing=(404, 405),
            what="manifest delete",
        )
        resp.close()
        if resp.status_code == 405:
            raise StoreError(
                f"{self.ref}: the registry refuses to delete manifests (405)",
                hint="enable deletes in its config (storage: delete: enabled: true, or "
                "REGISTRY_STORAGE_DELETE_ENABLED=true) and restart it",
            )
        return bool(resp.status_code != 404)

    def list_tags(self) -> list[str]:
        """Every tag, read through the bounded reader (:mod:`~artifactd.stores.listing`)."""
        return read_tag_pages(self._tag_page, f"{self.base}/tags/list?n={PAGE_SIZE}", self.ref)

    def _tag_page(self, url: str) -> Page | None:
        """GET one page of the tag list (None: no such repository)."""
        resp = self._send("GET", url, missing=(404,), what="tag listing")
        try:
            if resp.status_code == 404:
                return None
            return Page(resp.content, resp.headers.get("Link"))
        finally:
            resp.close()

    def close(self) -> None:
        """Close the sessions of every thread that used this store."""
        self._transport.close()
        self.puller.close()
