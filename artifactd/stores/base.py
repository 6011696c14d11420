"""The store interface: where artifacts live.

A store is content-addressed blobs plus manifests reachable by tag. Three
backends share this interface: a local OCI image layout directory (the
embedded default), an OCI registry, and (later) the read-only tree baked into
a derived image. Everything above this layer (push, resolve, restore) is
written once against :class:`Store`.
"""

from __future__ import annotations

import abc
import time

from artifactd.errors import IntegrityError, StoreError
from artifactd.hashing import Hasher, copy_hashed
from artifactd.records import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from contextlib import AbstractContextManager
    from pathlib import Path
    from typing import BinaryIO, TypeAlias, TypeVar

    from artifactd.events import EventSink

    T = TypeVar("T")
    #: Called with the bytes transferred so far.
    Progress: TypeAlias = Callable[[int], None]
else:
    Progress = object  # the name at run time, for modules that import it there (no code reads it)
#: Least time between two ``progress`` events of one transfer.
PROGRESS_INTERVAL_S = 0.25


def progress_events(on_event: EventSink, *, stage: str, family: str, total: int) -> Progress:
    """Return a :data:`Progress` that reports as ``progress`` events, throttled.

    An event goes out on the first call, then at most once per
    :data:`PROGRESS_INTERVAL_S`, and always when ``total`` bytes are done, so a
    display starts at once and ends at 100 %.
    """
    last: float | None = None

    def progress(done: int) -> None:
        nonlocal last
        now = time.monotonic()
        if last is None or now - last >= PROGRESS_INTERVAL_S or done >= total:
            last = now
            on_event(
                {
                    "stage": stage,
                    "event": "progress",
                    "family": family,
                    "bytes": done,
                    "total": total,
                }
            )

    return progress


class ManifestRef(Record):
    """A manifest fetched from a store, with the digest of its exact bytes."""

    data: bytes
    digest: str
    media_type: str


class Store(abc.ABC):
    """Blobs by digest, manifests by tag or digest.

    A store knows nothing of restores: a restore reads one through
    :class:`~artifactd.restore.source.StoreSource`, the adapter the restore stage owns.
    """

    #: The reference the user gave (``oci:DIR``, ``HOST/REPO``), for messages.
    ref: str

    @abc.abstractmethod
    def has_blob(self, digest: str) -> bool:
        """Whether the store holds the blob (cheap: no transfer)."""

    @abc.abstractmethod
    def put_blob(self, path: Path, digest: str, size: int, progress: Progress | None = None) -> int:
        """Store a blob from a local file; return the bytes transferred (0 if present).

        ``progress(sent)`` is called as bytes go out, for progress displays.
        """

    @abc.abstractmethod
    def open_blob(self, digest: str, size: int) -> AbstractContextManager[BinaryIO]:
        """Open a blob for streaming reads. Callers verify digest and size while reading."""

    def consume_blob(self, digest: str, size: int, consume: Callable[[BinaryIO], T]) -> T:
        """Run ``consume`` on the blob's stream and return what it returns.

        A registry reruns ``consume`` from its next source (a mirror, then the
        origin) when one fails (:mod:`artifactd.stores.pull`), so ``consume``
        must start from scratch each time it is called.
        """
        with self.open_blob(digest, size) as f:
            return consume(f)

    @abc.abstractmethod
    def put_manifest(self, data: bytes, media_type: str, tags: list[str]) -> str:
        """Store a manifest and point each tag at it; return its digest."""

    @abc.abstractmethod
    def get_manifest(self, reference: str) -> ManifestRef | None:
        """Fetch a manifest by tag or digest; ``None`` when the store has no such reference."""

    def tag_digest(self, tag: str) -> str | None:
        """Return the digest a tag points at, or None (stores override this cheaply)."""
        ref = self.get_manifest(tag)
        return ref.digest if ref else None

    @abc.abstractmethod
    def list_tags(self) -> list[str]:
        """Return every tag (used for listing and explaining misses, never to resolve)."""

    def tag_digests(self) -> dict[str, str]:
        """Every tag and the digest it names now (a tag gone since the listing is left out).

        One tag lookup per tag here; a layout answers from one read of its index.
        """
        return {t: d for t in self.list_tags() if (d := self.tag_digest(t)) is not None}

    def delete_manifest(self, digest: str) -> bool:
        """Delete the manifest ``digest`` and every tag naming it; False when it was not there.

        Stores that cannot delete (a tree baked into an image) raise :class:`StoreError`.
        """
        raise StoreError(f"{self.ref} cannot delete manifests", hint="prune a registry or oci:DIR")

    def close(self) -> None:  # noqa: B027 - optional hook, most stores hold nothing
        """Release connections or locks."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def iter_tags(self, prefix: str) -> Iterator[str]:
        """Yield tags starting with ``prefix``."""
        return (t for t in self.list_tags() if t.startswith(prefix))

    # Blobs checked against their digests, for every stage that reads or copies
    # one (configs, signature layers, image layers): methods, so the trust stage
    # uses them on the store it is given without importing this one.

    def read_blob(self, digest: str, size: int, *, max_size: int, what: str) -> bytes:
        """Fetch a small blob whole and verify it against its digest and size."""
        if size > max_size:
            raise IntegrityError(f"{what} {digest} is implausibly large ({size} B)")

        def consume(f: BinaryIO) -> tuple[_Chunks, Hasher]:
            buf = _Chunks()
            return buf, copy_hashed(f, buf, limit=size)

        buf, read = self.consume_blob(digest, size, consume)
        if read.size > size:
            raise IntegrityError(f"{what} {digest} is longer than its descriptor")
        if not read.matches(digest, size):
            raise IntegrityError(f"{what} {digest} does not match its digest")
        return b"".join(buf)

    def copy_blob(self, dst: Store, digest: str, size: int, tmp_dir: Path) -> int:
        """Stream one blob to ``dst`` through a temp file, verifying it; return bytes uploaded."""
        path = tmp_dir / digest.replace(":", "-")

        def consume(reader: BinaryIO) -> Hasher:
            with path.open("wb") as out:
                return copy_hashed(reader, out)

        copied = self.consume_blob(digest, size, consume)
        if not copied.matches(digest, size):
            path.unlink(missing_ok=True)
            raise IntegrityError(f"{self.ref}: blob {digest} does not match its digest or size")
        try:
            return dst.put_blob(path, digest, size)
        finally:
            path.unlink(missing_ok=True)


class _Chunks(list[bytes]):
    """A blob read whole, chunk by chunk (no ``io``: the store interface is on the fast path)."""

    def write(self, data: bytes, /) -> int:
        self.append(data)
        return len(data)
