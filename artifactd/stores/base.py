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
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import BinaryIO, NamedTuple

from artifactd.events import EventSink

#: Called with the bytes transferred so far.
Progress = Callable[[int], None]
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


class ManifestRef(NamedTuple):
    """A manifest fetched from a store, with the digest of its exact bytes."""

    data: bytes
    digest: str
    media_type: str


class Store(abc.ABC):
    """Blobs by digest, manifests by tag or digest."""

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

    def close(self) -> None:  # noqa: B027 - optional hook, most stores hold nothing
        """Release connections or locks."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def iter_tags(self, prefix: str) -> Iterator[str]:
        """Yield tags starting with ``prefix``."""
        return (t for t in self.list_tags() if t.startswith(prefix))
