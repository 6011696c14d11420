"""The one pull transport: trust the origin, fetch from anywhere.

Every read of a registry's content goes through :class:`Puller`, which a
:class:`~artifactd.stores.registry.RegistryStore` holds: restore, prefetch
and the node store's fill, ``--software-from``, ``copy``'s source and
``image append``'s base all read through a store, so none of them can skip it.
Its rules:

* a tag is resolved at the origin; only when the origin cannot answer (down,
  refusing) does a mirror whose configuration says it may resolve answer, and
  after it a digest pinned for the tag (in the reference, or the node store's
  last verified one). A mirror's 404 for a tag is never a miss;
* signatures are tags (``sha256-<hex>.sig``): they are resolved at the origin
  like any tag, and their content is fetched by digest like any content;
* a manifest by digest and every blob are fetched from each live mirror in
  order, then the origin, and hashed while they stream. A 404, a 5xx, a
  timeout, a stall, a short read or a digest mismatch moves on to the next
  source; a mirror that served bytes that do not match their digest is dropped
  for the rest of the run (:data:`HEALTH`), and every failure is counted by
  mirror and reason (``artifactd_mirror_failures_total{mirror,reason}``);
* a mirror gets the headers its configuration names and ``?ns=`` where
  containerd would send it, and never the origin's credentials: its transport
  is built with none (a Bearer challenge gets an anonymous token);
* a mirror is given :data:`MIRROR_TIMEOUT` (and one attempt): one that is down or
  drips bytes costs at most that before the next source serves.

:meth:`Puller.consume_blob` reruns its consumer from the next source when a
mirror fails mid-stream or at the end (a consumer that finds the bytes corrupt
before the end is told apart by reading the mirror's answer to its end and
hashing it), so a restore's unpack, a copy and a small read all fall back
without knowing mirrors exist.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, BinaryIO, TypeVar

from artifactd.errors import ArtifactdError, IntegrityError, NotFoundError, StoreError
from artifactd.format.oci import is_digest
from artifactd.hashing import BlobMismatchError, DigestReader, digest_of
from artifactd.stores.base import ManifestRef
from artifactd.stores.mirrors import Mirror, MirrorPlan
from artifactd.stores.transport import BlobReader, Transport

T = TypeVar("T")

#: (connect, read) seconds a mirror is given, and the grace after which a
#: mirror's body slower than ``transport.MIN_RATE`` is given up on. Read when used.
MIRROR_TIMEOUT = (2.0, 10.0)

#: Why a mirror was passed over (the ``reason`` label).
REASONS = ("not_found", "server_error", "unreachable", "timeout", "short_read", "digest")


class MirrorHealth:
    """The run's view of its mirrors: which are dropped, and each failure counted."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._dropped: set[str] = set()
        self._failures: Counter[tuple[str, str]] = Counter()

    def failed(self, mirror: str, reason: str, *, drop: bool = False) -> None:
        """Count one failure of ``mirror`` (its URL); ``drop`` it for the rest of the run."""
        with self._lock:
            self._failures[(mirror, reason)] += 1
            if drop:
                self._dropped.add(mirror)

    def live(self, mirror: str) -> bool:
        """Whether ``mirror`` may still be asked."""
        with self._lock:
            return mirror not in self._dropped

    def failures(self) -> dict[tuple[str, str], int]:
        """Every ``(mirror, reason)`` counted so far."""
        with self._lock:
            return dict(self._failures)

    def dropped(self) -> list[str]:
        """Return the mirrors dropped for the rest of the run."""
        with self._lock:
            return sorted(self._dropped)

    def reset(self) -> None:
        """Forget everything (a new run in the same process: tests, benches)."""
        with self._lock:
            self._dropped.clear()
            self._failures.clear()


#: The one per process: a mirror that lied is not asked again by any store of the run.
HEALTH = MirrorHealth()


class SourceFailure(StoreError):  # noqa: N818 - one source's failure, caught before a user sees it
    """One source could not serve what was asked; ``reason`` is one of :data:`REASONS`."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message, hint="the next mirror, or the registry, is asked")
        self.reason = reason


def _reason(exc: StoreError) -> str:
    """Return the ``reason`` label of a transport's error (its words are the transport's own)."""
    text = str(exc)
    if "stalled" in text or "Timeout" in text:
        return "timeout"
    if "transfer of" in text:
        return "short_read"
    if "HTTP 5" in text:
        return "server_error"
    return "unreachable"


def _unreached(exc: StoreError) -> bool:
    """Whether the origin gave no answer at all (the transport's words after its retries)."""
    text = str(exc)
    return "cannot reach registry" in text or "stalled" in text


class _Verified:
    """A blob body hashed while it streams; its end checked against digest and size.

    The hashing and the verdict are :class:`~artifactd.hashing.DigestReader`'s,
    here where the bytes arrive, and only here: it is this reader's
    ``verifier``, so the layer unpacker reading through it hashes nothing again.
    Its failures become :class:`SourceFailure` (blamed on the source).
    """

    def __init__(self, inner: BlobReader, digest: str, size: int, label: str) -> None:
        self._digest = digest
        self._size = size
        self._label = label
        self.verifier = DigestReader(inner, digest, size)
        self._inner = inner
        #: The failure this reader raised, if any (the consumer may wrap or swallow it).
        self.failure: SourceFailure | None = None

    @property
    def done(self) -> bool:
        """Whether the whole blob was read and matched its digest and size."""
        return self.verifier.verified

    def read(self, n: int = -1, /) -> bytes:
        if self.failure is not None:
            raise self.failure
        try:
            return self.verifier.read(n)
        except BlobMismatchError as exc:
            self.failure = self._mismatch(exc)
            raise self.failure from None
        except StoreError as exc:
            self.failure = SourceFailure(f"{self._label}: {exc}", reason=_reason(exc))
            raise self.failure from None

    def _mismatch(self, exc: BlobMismatchError) -> SourceFailure:
        blob = f"{self._label}: blob {self._digest}"
        if exc.reason == "long":
            return SourceFailure(f"{blob} is longer than {self._size} bytes", reason="digest")
        if exc.reason == "short":
            return SourceFailure(
                f"{blob} ended after {exc.got} of {self._size} bytes", reason="short_read"
            )
        return SourceFailure(f"{blob} does not match its digest", reason="digest")

    def drain(self) -> None:
        """Read to the end, for the verdict on the bytes (raises the failure, if any)."""
        while self.read(1 << 20):
            pass

    def close(self) -> None:
        self._inner.close()


class _Source:
    """One place content may come from: a mirror, or the origin (``mirror`` None)."""

    def __init__(
        self,
        send: Callable[..., Any],
        base: str,
        mirror: Mirror | None,
        transport: Transport | None = None,
    ) -> None:
        self._send = send
        self.transport = transport  # a mirror's own (the origin's belongs to its store)
        self.base = base
        self.mirror = mirror
        self.headers = dict(mirror.headers) if mirror else {}
        self.query = f"?ns={mirror.ns}" if mirror and mirror.ns else ""
        self.label = f"mirror {mirror.url}" if mirror else "the registry"

    def url(self, kind: str, reference: str) -> str:
        return f"{self.base}/{kind}/{reference}{self.query}"

    def send(self, method: str, url: str, **kwargs: Any) -> Any:
        headers = {**self.headers, **kwargs.pop("headers", {})}
        return self._send(method, url, headers=headers, **kwargs)


class Puller:
    """A registry repository's reads: the origin's transport plus its mirrors (see module doc)."""

    def __init__(
        self,
        origin: Callable[..., Any],
        origin_base: str,
        name: str,
        plan: Callable[[], MirrorPlan],
        pins: Mapping[str, str] | None = None,
    ) -> None:
        self._origin = _Source(origin, origin_base, None)  # the store's own send
        self._name = name
        self._plan_fn = plan
        self._plan: MirrorPlan | None = None
        self._mirrors: list[_Source] | None = None
        self._lock = threading.Lock()
        self.pins: Mapping[str, str] = pins if pins is not None else {}
        #: Why the origin could not resolve a tag, once it could not (see :meth:`fallback_tag`).
        self._origin_down: StoreError | None = None

    # -- the plan -----------------------------------------------------------
    def plan(self) -> MirrorPlan:
        """Return the mirror plan, read on first use (a push never reads mirror files)."""
        with self._lock:
            if self._plan is None:
                self._plan = self._plan_fn()
            return self._plan

    def _sources(self) -> list[_Source]:
        plan = self.plan()
        with self._lock:
            if self._mirrors is None:
                self._mirrors = []
                for m in plan.mirrors:
                    transport = Transport(
                        m.host,
                        plain_http=m.plain_http,
                        credentials=None,  # the origin's never go to a mirror
                        name=f"mirror {m.url}",
                        attempts=1,
                        timeout=MIRROR_TIMEOUT,  # read now: tests patch it
                        verify=False if m.skip_verify else (m.ca[0] if m.ca else True),
                        cert=m.client,
                    )
                    self._mirrors.append(_Source(transport.send, m.base, m, transport))
            return self._mirrors

    def has_mirrors(self) -> bool:
        """Whether a live mirror may serve content (reads the plan)."""
        return len(self._content_sources()) > 1

    def _check_blocked(self) -> None:
        if self.plan().blocked:
            raise StoreError(
                f"{self._name}: registries.conf blocks pulls from this registry",
                hint="unblock it in registries.conf, or pull from another registry",
            )

    def close(self) -> None:
        """Close the mirrors' sessions."""
        with self._lock:
            mirrors, self._mirrors = self._mirrors or [], None
        for src in mirrors:
            if src.transport is not None:
                src.transport.close()

    def _content_sources(self) -> list[_Source]:
        self._check_blocked()
        live = [
            s
            for s in self._sources()
            if s.mirror is not None and s.mirror.pull and HEALTH.live(s.mirror.url)
        ]
        return [*live, self._origin]

    # -- tags ---------------------------------------------------------------
    def resolve(self, tag: str, at_origin: Callable[[], str | None], accept: str) -> str | None:
        """Return the digest ``tag`` names at the origin (see :meth:`fallback_tag`)."""
        self._check_blocked()
        if self._origin_down is not None:  # asked once already: not each tag's retries again
            return self.fallback_tag(tag, self._origin_down, accept)
        try:
            return at_origin()
        except (NotFoundError, IntegrityError):
            raise
        except StoreError as exc:
            return self.fallback_tag(tag, exc, accept)

    def fallback_tag(self, tag: str, error: StoreError, accept: str) -> str | None:
        """Answer for ``tag`` when the origin could not: a resolving mirror, else a pin.

        With pins, they are all that is known while the origin is down: a tag
        without one is absent (None). Without pins (or a mirror's answer),
        ``error`` is raised, and so is any error that is an answer (an
        authentication refusal, a 4xx): only a registry that was not reached
        (down, refusing connections, timing out, 5xx after its retries) is
        stood in for. This store's later tag lookups come here at once: the
        origin was given its retries.
        """
        if not _unreached(error):
            raise error  # the registry answered (a refusal, a 4xx): its word stands
        self._origin_down = error
        for src in self._sources():
            if src.mirror is None or not src.mirror.resolve or not HEALTH.live(src.mirror.url):
                continue
            try:
                digest = self._mirror_tag(src, tag, accept)
            except StoreError as exc:
                HEALTH.failed(src.mirror.url, _reason(exc))
                continue
            if digest is not None:
                return digest
        if not self.pins:
            raise error
        return self.pins.get(tag)

    def _mirror_tag(self, src: _Source, tag: str, accept: str) -> str | None:
        resp = src.send(
            "HEAD",
            src.url("manifests", tag),
            missing=(404,),
            headers={"Accept": accept},
            what="tag lookup",
        )
        resp.close()
        digest = resp.headers.get("Docker-Content-Digest") if resp.status_code == 200 else None
        return str(digest) if digest and is_digest(digest) else None

    # -- content by digest ---------------------------------------------------
    def manifest(self, digest: str, accept: str) -> ManifestRef | None:
        """Return the manifest ``digest`` from the first source that serves exactly its bytes."""
        for src in self._content_sources():
            try:
                resp = src.send(
                    "GET",
                    src.url("manifests", digest),
                    missing=(404,),
                    headers={"Accept": accept},
                    what="manifest lookup",
                )
            except StoreError as exc:
                if src.mirror is None:
                    raise
                HEALTH.failed(src.mirror.url, _reason(exc))
                continue
            if resp.status_code == 404:
                resp.close()
                if src.mirror is None:
                    return None
                HEALTH.failed(src.mirror.url, "not_found")
                continue
            data = resp.content
            media_type = resp.headers.get("Content-Type", "").split(";")[0].strip()
            resp.close()
            got = digest_of(data)
            if got != digest:
                if src.mirror is None:
                    raise IntegrityError(f"{self._name}: manifest {digest} hashes to {got}")
                HEALTH.failed(src.mirror.url, "digest", drop=True)
                continue
            return ManifestRef(data=data, digest=got, media_type=media_type)
        return None  # pragma: no cover - the origin always answers or raises

    def _open(self, src: _Source, digest: str, size: int) -> _Verified | None:
        """Open the blob at one source (None: a mirror that cannot serve it; counted)."""
        try:
            resp = src.send(
                "GET", src.url("blobs", digest), stream=True, missing=(404,), what="blob download"
            )
        except StoreError as exc:
            if src.mirror is None:
                raise
            HEALTH.failed(src.mirror.url, _reason(exc))
            return None
        if resp.status_code == 404:
            resp.close()
            if src.mirror is None:
                raise NotFoundError(f"{self._name} has no blob {digest}")
            HEALTH.failed(src.mirror.url, "not_found")
            return None
        grace = MIRROR_TIMEOUT[1] if src.mirror is not None else None
        reader = BlobReader(resp, f"blob {digest[:19]}", grace=grace)
        return _Verified(reader, digest, size, f"{self._name} ({src.label})")

    def consume_blob(self, digest: str, size: int, consume: Callable[[BinaryIO], T]) -> T:
        """Run ``consume`` on the blob's stream, from the next source whenever one fails.

        ``consume`` must be rerunnable from scratch (it is, for a fresh buffer, a
        file opened for writing, a staging directory it empties). From the
        origin, a failure is raised: :class:`IntegrityError` for bytes that do
        not match, :class:`StoreError` for the rest.
        """
        for src in self._content_sources():
            reader = self._open(src, digest, size)
            if reader is None:
                continue
            try:
                return consume(reader)  # type: ignore[arg-type]
            except ArtifactdError as exc:
                failure = self._blame(reader, exc)
                if failure is None:
                    raise
                if src.mirror is None:
                    if failure.reason == "digest":
                        raise IntegrityError(str(failure)) from None
                    raise StoreError(str(failure), hint=exc.hint) from None
                HEALTH.failed(src.mirror.url, failure.reason, drop=failure.reason == "digest")
            finally:
                reader.close()
        raise NotFoundError(f"{self._name} has no blob {digest}")  # pragma: no cover

    @staticmethod
    def _blame(reader: _Verified, exc: ArtifactdError) -> SourceFailure | None:
        """Return the source's failure behind ``exc``; None when the bytes were right.

        A consumer may find the bytes corrupt before their end (a zstd frame
        that does not decode): the rest is read and hashed to tell a lying
        source from content that is bad everywhere.
        """
        if reader.failure is not None:
            return reader.failure
        if not isinstance(exc, IntegrityError) or reader.done:
            return None
        try:
            reader.drain()
        except SourceFailure as failure:
            return failure
        return None

    @contextmanager
    def open_blob(self, digest: str, size: int) -> Iterator[BinaryIO]:
        """Stream the blob from the first source that opens it; the end is verified.

        For a reader that cannot be rerun: a failure after the first byte is
        raised (counted, and a mirror that served a wrong digest is dropped);
        :meth:`consume_blob` is the form that falls back at any point.
        """
        for src in self._content_sources():
            reader = self._open(src, digest, size)
            if reader is None:
                continue
            try:
                yield reader  # type: ignore[misc]
            except SourceFailure as failure:
                if src.mirror is not None:
                    HEALTH.failed(src.mirror.url, failure.reason, drop=failure.reason == "digest")
                if failure.reason == "digest":
                    raise IntegrityError(str(failure)) from None
                raise
            finally:
                reader.close()
            return
        raise NotFoundError(f"{self._name} has no blob {digest}")  # pragma: no cover


__all__ = [
    "HEALTH",
    "MIRROR_TIMEOUT",
    "REASONS",
    "MirrorHealth",
    "Puller",
    "SourceFailure",
]
