"""Canonical JSON and content digests: the pure core every key is built from.

One spelling of a content digest (``sha256:<hex>``, :func:`digest_of`), one
running hash (:class:`Hasher`), and one way to hash bytes while they are copied
(:func:`copy_hashed`, and :class:`HashingReader` / :class:`HashingWriter` for
streams that a library pulls or pushes itself), so no module re-reads what it
has just written to learn its digest. :class:`DigestReader` is the one verdict
on a blob stream (its digest and size, checked where its bytes arrive); a
reader stacked on one names it as ``verifier`` (:func:`verifier_of`), so a
consumer further down (the layer unpacker) hashes nothing a second time.
"""

from __future__ import annotations

import sys

from artifactd.errors import IntegrityError
from artifactd.jsontext import dumps

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import IO, Any, Protocol

    class Readable(Protocol):
        """Anything with ``read(n)``: a file, an HTTP body, a progress wrapper."""

        def read(self, n: int = -1, /) -> bytes:
            """Return up to ``n`` bytes; b"" at the end."""
            ...

    class HashObject(Protocol):
        """A sha256 in progress: CPython's own or OpenSSL's."""

        def update(self, data: bytes | memoryview, /) -> None:
            """Add ``data``."""

        def hexdigest(self) -> str:
            """Return the lowercase hex digest so far."""
            ...

    class Writable(Protocol):
        """Anything with ``write(data)``: a file, a buffer."""

        def write(self, data: bytes, /) -> int:
            """Write ``data``; return the bytes written."""
            ...


# CPython's own SHA-256, for small documents (a fingerprint): loading OpenSSL
# through hashlib costs about 3 to 4 ms of every pod start (python -X importtime,
# 3.10 to 3.13), the built-in module under 1 ms. Bulk data goes through hashlib,
# whose OpenSSL code is several times faster. The module is private and 3.12
# renamed it, so each name is imported on its own Python; tests/test_hashing.py
# checks on every Python the suite runs that the module named here is the one used.
#: The standard library module :func:`sha256_hex` hashes small data with.
SMALL_SHA256_MODULE = "_sha2" if sys.version_info >= (3, 12) else "_sha256"
try:
    if sys.version_info >= (3, 12):
        from _sha2 import sha256 as _small_sha256  # type: ignore[import-not-found,unused-ignore]
    else:
        from _sha256 import sha256 as _small_sha256  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # pragma: no cover - a Python built without it (FIPS builds): OpenSSL's
    _small_sha256 = None

#: The algorithm prefix of every content digest we write or accept.
DIGEST_PREFIX = "sha256:"
CHUNK = 1 << 20
#: Up to this many bytes, :func:`sha256_hex` hashes without loading OpenSSL.
SMALL = 64 << 10
#: Up to this many bytes in all, a restore's layer is hashed with CPython's own SHA-256
#: (:func:`sha256_for`): OpenSSL's is about 1.7 GB/s here, CPython's 0.3 GB/s (Python
#: 3.11), and loading OpenSSL costs about 3 ms, which hashing 1 MiB faster saves back.
BULK = 1 << 20


def canonical_json(value: Any) -> bytes:
    """Serialise ``value`` so that equal data always gives equal bytes.

    Keys are sorted, separators carry no whitespace and text is UTF-8, so dict
    insertion order and formatting never change a hash.
    """
    return dumps(value, sort_keys=True, compact=True, ensure_ascii=False, allow_nan=False).encode()


def sha256_hex(data: bytes) -> str:
    """Return the lowercase hex sha256 of ``data``."""
    if len(data) <= SMALL and _small_sha256 is not None:
        small: str = _small_sha256(data).hexdigest()
        return small
    # lazy: bulk data only: a fingerprint hashes with CPython's own SHA-256, without OpenSSL
    # (tests/test_startup.py)
    import hashlib  # noqa: PLC0415

    return hashlib.sha256(data).hexdigest()


def digest_of(data: bytes) -> str:
    """Return the content digest of ``data``: ``sha256:<hex>``, as OCI spells it."""
    return DIGEST_PREFIX + sha256_hex(data)


def canonical_hash(value: Any) -> str:
    """Return the sha256 hex digest of ``canonical_json(value)``."""
    return sha256_hex(canonical_json(value))


def is_bulk(total: int) -> bool:
    """Whether ``total`` bytes are hashed by OpenSSL's sha256 (:data:`BULK`, :func:`sha256_for`)."""
    return total > BULK or _small_sha256 is None


def sha256_for(total: int) -> Callable[..., HashObject]:
    """Return the sha256 constructor to hash ``total`` bytes with, in however many pieces.

    CPython's own up to :data:`BULK` (a small layer, a document: OpenSSL is not
    loaded for it), OpenSSL's (``hashlib``) past it. Both give the same digests.
    """
    if not is_bulk(total):
        small: Callable[..., HashObject] = _small_sha256
        return small
    import hashlib  # noqa: PLC0415  # lazy: bulk data only (see BULK)

    return hashlib.sha256


class Hasher:
    """A running sha256 and byte count of data seen chunk by chunk.

    ``size``: the bytes it will see, when known (:func:`sha256_for` picks the
    sha256); a stream of unknown size is bulk data, hashed by OpenSSL.
    """

    def __init__(self, size: int | None = None) -> None:
        self._sha = sha256_for(BULK + 1 if size is None else size)()
        self.size = 0

    def update(self, data: bytes | memoryview) -> None:
        """Add ``data`` to the hash and the count."""
        self._sha.update(data)
        self.size += len(data)

    @property
    def hex(self) -> str:
        """The lowercase hex sha256 so far."""
        return self._sha.hexdigest()

    @property
    def digest(self) -> str:
        """The content digest so far (``sha256:<hex>``)."""
        return DIGEST_PREFIX + self._sha.hexdigest()

    def matches(self, digest: str, size: int) -> bool:
        """Whether what was seen is exactly ``size`` bytes with content digest ``digest``."""
        return self.size == size and self.digest == digest


def copy_hashed(
    src: Readable,
    dst: Writable | None = None,
    *,
    limit: int | None = None,
    progress: Callable[[int], None] | None = None,
) -> Hasher:
    """Copy ``src`` to ``dst`` (or just read it) to the end, hashing and counting the bytes.

    With ``limit``, copying stops as soon as more than ``limit`` bytes were
    read, so a source longer than it claims costs at most one chunk more; the
    caller sees ``size > limit``, and the limit picks the sha256 (:func:`sha256_for`).
    ``progress(done)`` is called after each chunk.
    """
    hasher = Hasher(limit)
    while chunk := src.read(CHUNK):
        hasher.update(chunk)
        if dst is not None:
            dst.write(chunk)
        if progress is not None:
            progress(hasher.size)
        if limit is not None and hasher.size > limit:
            break
    return hasher


class HashingWriter:
    """A write-only file object that hashes and counts what passes through to ``sink``."""

    def __init__(self, sink: IO[bytes]) -> None:
        self._sink = sink
        self.hasher = Hasher()

    def write(self, data: bytes) -> int:
        """Hash, count and pass on ``data``."""
        self.hasher.update(data)
        return self._sink.write(data)

    def flush(self) -> None:
        """Flush the sink."""
        self._sink.flush()


class HashingReader:
    """A read-only file object that hashes and counts what is read from ``source``."""

    def __init__(self, source: Readable) -> None:
        self._source = source
        self.hasher = Hasher()

    def read(self, n: int = -1) -> bytes:
        """Read up to ``n`` bytes, hashing and counting them."""
        data = self._source.read(n)
        self.hasher.update(data)
        return data

    def readinto(self, buf: bytearray | memoryview) -> int:
        """Read into ``buf``; return the bytes read."""
        data = self.read(len(buf))
        buf[: len(data)] = data
        return len(data)

    def drain(self) -> None:
        """Read (and hash) whatever is left."""
        while self.read(CHUNK):
            pass


class BlobMismatchError(IntegrityError):
    """A blob stream is not the blob its descriptor names.

    ``reason``: ``"long"`` (more bytes than the size), ``"short"`` (it ended
    early; ``got`` bytes) or ``"digest"`` (the size matches, the hash does not).
    """

    def __init__(self, message: str, *, reason: str, got: int) -> None:
        super().__init__(
            message, hint="the blob is corrupt where it was read; nothing is installed"
        )
        self.reason = reason
        self.got = got


class DigestReader:
    """Read a blob stream through, hashed once as its bytes arrive; its end checked.

    The one owner of a blob stream's verdict: a read that takes the stream
    past ``size`` bytes raises :class:`BlobMismatchError` at once (``long``); the
    read that finds the end raises it when fewer bytes came (``short``) or
    they do not hash to ``digest``, and otherwise sets :attr:`verified`. So
    whoever reads the stream to its end has checked it, and whoever did not
    can tell (``verified`` stays False). ``what`` names the stream in messages.
    """

    def __init__(self, source: Readable, digest: str, size: int, *, what: str = "blob") -> None:
        self._source = source
        self.digest = digest
        self.size = size
        self._what = what
        self._hasher = Hasher(size)
        #: Whether the whole stream was read and matched ``digest`` and ``size``.
        self.verified = False

    @property
    def verifier(self) -> DigestReader:
        """Return this reader itself (see :func:`verifier_of`)."""
        return self

    @property
    def read_bytes(self) -> int:
        """The bytes read (and hashed) so far."""
        return self._hasher.size

    def checks(self, digest: str, size: int) -> bool:
        """Whether this reader's verdict is on ``digest`` of ``size`` bytes."""
        return self.digest == digest and self.size == size

    def read(self, n: int = -1, /) -> bytes:
        """Read up to ``n`` bytes, hashing them; the read that finds the end checks the blob."""
        data = self._source.read(n)
        hasher = self._hasher
        hasher.update(data)
        if hasher.size > self.size:
            raise BlobMismatchError(
                f"{self._what} {self.digest}: more than the {self.size} bytes its descriptor says",
                reason="long",
                got=hasher.size,
            )
        if not data and not self.verified:
            if hasher.size < self.size:
                raise BlobMismatchError(
                    f"{self._what} {self.digest}: expected {self.size} bytes, got {hasher.size}",
                    reason="short",
                    got=hasher.size,
                )
            actual = hasher.digest
            if actual != self.digest:
                raise BlobMismatchError(
                    f"{self._what} digest mismatch: expected {self.digest}, got {actual}",
                    reason="digest",
                    got=hasher.size,
                )
            self.verified = True
        return data

    def drain(self) -> None:
        """Read (and hash) whatever is left: the verdict on the whole blob, raised if it fails."""
        while self.read(CHUNK):
            pass


def verifier_of(stream: object) -> DigestReader | None:
    """Return the :class:`DigestReader` that checks ``stream``'s bytes, if it names one.

    A reader stacked on a :class:`DigestReader` (a source's own, a progress
    counter) names it as its ``verifier`` attribute; None: nothing checks it.
    """
    verifier = getattr(stream, "verifier", None)
    return verifier if isinstance(verifier, DigestReader) else None
