"""A local OCI image layout directory: the embedded default store.

``DIR/oci-layout``, ``DIR/index.json`` and ``DIR/blobs/sha256/<hex>``, as the
OCI image-layout spec lays them out, so ``skopeo`` and ``oras`` read it
(``skopeo inspect oci:DIR:TAG``). Tags are ``org.opencontainers.image.ref.name``
annotations on the index's manifest descriptors.

Blobs are written to a temp file in the same directory and renamed into place;
``index.json`` is rewritten atomically under an exclusive ``flock`` so
concurrent harvests into one directory never lose a tag. Only writing needs
``fcntl`` and ``tempfile``, so they are imported where a write happens: a no-op
restore reads a layout and loads neither.
"""

from __future__ import annotations

import errno
import os
import stat

from artifactd.errors import IntegrityError, NoSpaceError, NotFoundError, StoreError
from artifactd.format.oci import ANN_REF_NAME, INDEX_MEDIA_TYPE, check_digest, check_tag, is_digest
from artifactd.fsutil import InputFileError, as_path, atomic_write, open_regular, read_regular
from artifactd.hashing import copy_hashed, digest_of
from artifactd.jsontext import dumps, loads
from artifactd.stores.base import ManifestRef, Store

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path
    from types import TracebackType
    from typing import IO, Any, BinaryIO

    from artifactd.stores.base import Progress

_LAYOUT = {"imageLayoutVersion": "1.0.0"}
#: Registries refuse manifests over 4 MiB; so do we, before reading one whole.
MAX_MANIFEST_BYTES = 4 << 20
#: An index.json larger than this is refused: about 200,000 tags (a descriptor
#: takes under 300 bytes), far more than a node's or an image's store holds.
MAX_INDEX_BYTES = 64 << 20


class LayoutStore(Store):
    """A store backed by an OCI image layout directory."""

    def __init__(
        self, root: str | os.PathLike[str], *, ref: str | None = None, create: bool = False
    ) -> None:
        #: The layout's directory, as given (text: a no-op restore loads no pathlib).
        self.root_dir = os.fspath(root)
        self.ref = ref or f"oci:{self.root_dir}"
        #: The last index.json read: its file's identity and its checked entries.
        self._seen: tuple[tuple[int, ...], list[dict[str, Any]]] | None = None
        if create:
            self._init()
        elif not self._is_layout():
            raise NotFoundError(
                f"{self.ref} is not an OCI image layout (no oci-layout file)",
                hint="build or harvest into it first, or check the path",
            )

    @property
    def root(self) -> Path:
        """The layout's directory."""
        return as_path(self.root_dir)

    def _path(self, *parts: str) -> str:
        return os.path.join(self.root_dir, *parts)

    def _is_layout(self) -> bool:
        """Whether ``root/oci-layout`` is a file; a root that cannot be looked into raises."""
        try:
            return stat.S_ISREG(os.stat(self._path("oci-layout")).st_mode)
        except (FileNotFoundError, NotADirectoryError):
            return False
        except OSError as exc:  # no permission, a name too long, an I/O error
            raise StoreError(
                f"cannot read {self.ref}: {exc.strerror or exc}",
                hint="check the path, and that this user may read the directory",
            ) from None

    def _init(self) -> None:
        try:
            os.makedirs(self._path("blobs", "sha256"), exist_ok=True)
            if not os.path.exists(self._path("oci-layout")):
                atomic_write(self._path("oci-layout"), dumps(_LAYOUT).encode())
            if not os.path.exists(self._path("index.json")):
                with self._locked_index():
                    pass  # creates index.json under the lock, never over another's
        except OSError as exc:
            raise StoreError(f"cannot create OCI layout at {self.root_dir}: {exc}") from exc

    def _writing(self, what: str) -> _Writing:
        """Turn a failure to write ``what`` into this layout into the error a user can act on.

        A full disk is :class:`NoSpaceError` (exit 9); anything else (no
        permission, a read-only mount, a name too long) :class:`StoreError`.
        """
        return _Writing(self.ref, what)

    # -- blobs -------------------------------------------------------------
    def _blob_path(self, digest: str) -> str:
        return self._path("blobs", "sha256", check_digest(digest).split(":", 1)[1])

    def has_blob(self, digest: str) -> bool:
        """Whether the blob file exists."""
        return os.path.isfile(self._blob_path(digest))

    def put_blob(self, path: Path, digest: str, size: int, progress: Progress | None = None) -> int:
        """Copy a local file in as a blob, verifying its digest; return bytes written."""
        dest = self._blob_path(digest)
        if os.path.isfile(dest) and os.stat(dest).st_size == size:
            return 0
        # lazy: fast path: LATER in artifactd/cli/fast.py, never loaded by a no-op restore
        import tempfile  # noqa: PLC0415

        with self._writing(f"blob {digest}"):
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(dest), prefix=".tmp-")
            try:
                with os.fdopen(fd, "wb") as out, open(path, "rb") as src:
                    copied = copy_hashed(src, out, progress=progress)
                if not copied.matches(digest, size):
                    raise IntegrityError(f"{path} does not match {digest} ({size} bytes)")
                os.chmod(tmp, 0o644)
                os.replace(tmp, dest)
            except BaseException:
                try:  # noqa: SIM105 - as in remove_blob
                    os.unlink(tmp)
                except FileNotFoundError:
                    pass
                raise
        return size

    def put_blob_bytes(self, data: bytes) -> str:
        """Store small in-memory content (configs, manifests); return its digest."""
        digest = digest_of(data)
        dest = self._blob_path(digest)
        if not os.path.isfile(dest):
            with self._writing(f"blob {digest}"):
                atomic_write(dest, data)
        return digest

    def open_blob(self, digest: str, size: int) -> _StoreReader:
        """Open the blob file for reading (a ``with`` block closes it); read errors: StoreError."""
        try:
            f = open_regular(self._blob_path(digest))
        except InputFileError as exc:
            raise self._input_error(exc, f"blob {digest}") from None
        return _StoreReader(f, f"{self.ref} blob {digest[:19]}")

    # -- manifests ---------------------------------------------------------
    def put_manifest(self, data: bytes, media_type: str, tags: list[str]) -> str:
        """Store the manifest blob, then point tags at it in index.json."""
        for tag in tags:
            check_tag(tag)
        digest = self.put_blob_bytes(data)
        with self._locked_index() as index:
            manifests: list[dict[str, Any]] = index.setdefault("manifests", [])
            wanted = set(tags)
            kept = [
                m for m in manifests if (m.get("annotations") or {}).get(ANN_REF_NAME) not in wanted
            ]
            for tag in sorted(tags):
                kept.append(
                    {
                        "mediaType": media_type,
                        "digest": digest,
                        "size": len(data),
                        "annotations": {ANN_REF_NAME: tag},
                    }
                )
            if not tags and not any(m.get("digest") == digest for m in kept):
                kept.append({"mediaType": media_type, "digest": digest, "size": len(data)})
            index["manifests"] = kept
        return digest

    def get_manifest(self, reference: str) -> ManifestRef | None:
        """Find a manifest by tag (index annotation) or by digest."""
        if is_digest(reference):
            path = self._blob_path(reference)
            if not os.path.isfile(path):
                return None
            data = self._read_manifest(path, reference)
            _verify(data, reference)
            try:
                media_type = str(loads(data).get("mediaType", ""))
            except (ValueError, AttributeError):
                raise IntegrityError(f"{self.ref}: {reference} is not a JSON manifest") from None
            return ManifestRef(data=data, digest=reference, media_type=media_type)
        for desc in self._entries():
            if (desc.get("annotations") or {}).get(ANN_REF_NAME) == reference:
                digest = desc["digest"]
                data = self._read_manifest(self._blob_path(digest), reference)
                _verify(data, digest)
                return ManifestRef(data=data, digest=digest, media_type=desc.get("mediaType", ""))
        return None

    def _read_manifest(self, path: str, reference: str) -> bytes:
        """Read a manifest blob, refusing one too large to be a manifest."""
        try:
            return read_regular(path, MAX_MANIFEST_BYTES)
        except InputFileError as exc:
            if exc.reason == "missing":
                raise IntegrityError(
                    f"{self.ref}: {reference} points at missing blob {os.path.basename(path)}"
                ) from None
            raise self._input_error(exc, f"manifest {reference}") from None

    def _input_error(self, exc: InputFileError, what: str) -> StoreError | IntegrityError:
        """Return the error for a file of this layout that :func:`open_regular` refused."""
        if exc.reason == "missing":
            return NotFoundError(f"{self.ref} has no {what}")
        if exc.reason == "unreadable":
            return StoreError(f"cannot read {what} in {self.ref}: {exc.problem}")
        # A FIFO, device or link where a blob belongs, or a file past its limit.
        return IntegrityError(
            f"{self.ref}: {what} {exc.problem}",
            hint="the layout was damaged or written by another tool; re-copy the store",
        )

    def tag_digest(self, tag: str) -> str | None:
        """Read the tag's digest from index.json alone."""
        for desc in self._entries():
            if (desc.get("annotations") or {}).get(ANN_REF_NAME) == tag:
                return str(desc["digest"])
        return None

    def list_tags(self) -> list[str]:
        """Every ref.name annotation in index.json, sorted (at most :data:`MAX_TAGS`)."""
        return sorted(self.tag_digests())

    def tag_digests(self) -> dict[str, str]:
        """Every tag and the digest it names, from one read of index.json.

        The first entry naming a tag wins, as in :meth:`tag_digest`. More than
        :data:`~artifactd.stores.listing.MAX_TAGS` tags is a :class:`StoreError`.
        """
        # Imported here: the pod-start fast path opens layouts but never lists them.
        # lazy: fast path: LATER in artifactd/cli/fast.py, never loaded by a no-op restore
        from artifactd.stores.listing import check_tag_count  # noqa: PLC0415

        out: dict[str, str] = {}
        for desc in self._entries():
            tag = (desc.get("annotations") or {}).get(ANN_REF_NAME)
            if tag:
                out.setdefault(tag, str(desc["digest"]))
        check_tag_count(len(out), self.ref)
        return out

    def remove_tags(self, tags: list[str]) -> list[str]:
        """Drop ``tags`` from index.json (their blobs stay: see :meth:`blob_digests`)."""
        drop = set(tags)
        removed: list[str] = []
        with self._locked_index() as index:
            kept = []
            for desc in index["manifests"]:
                tag = (desc.get("annotations") or {}).get(ANN_REF_NAME)
                if tag in drop:
                    removed.append(tag)
                else:
                    kept.append(desc)
            index["manifests"] = kept
        return sorted(removed)

    def delete_manifest(self, digest: str) -> bool:
        """Drop every index.json entry naming ``digest`` in one atomic rewrite.

        The manifest's blobs stay: :meth:`sweep_blobs` removes those nothing references.
        """
        check_digest(digest)
        with self._locked_index() as index:
            before = len(index["manifests"])
            index["manifests"] = [d for d in index["manifests"] if d.get("digest") != digest]
            return len(index["manifests"]) != before

    def sweep_blobs(self, *, min_age_s: float, now: float) -> dict[str, int]:
        """Remove blobs no manifest in index.json references; return them with their sizes.

        Under the index lock, so no tag is added meanwhile. The references are
        read afresh (a manifest written since the caller planned counts), and a
        blob modified less than ``min_age_s`` before ``now`` stays: a publish
        writes its blobs before its tag, so a blob that nothing names yet may be
        one it is about to name.
        """
        removed: dict[str, int] = {}
        with self._locked_index() as index:
            live = self.referenced([str(d["digest"]) for d in index["manifests"]])
            with os.scandir(self._path("blobs", "sha256")) as it:
                entries = [e for e in it if e.is_file(follow_symlinks=False)]
            for entry in entries:
                digest = f"sha256:{entry.name}"
                if len(entry.name) != 64 or digest in live:
                    continue
                st = entry.stat(follow_symlinks=False)
                if now - st.st_mtime < min_age_s:
                    continue
                os.unlink(entry.path)
                removed[digest] = st.st_size
        return removed

    def referenced(self, manifests: list[str]) -> set[str]:
        """Return the manifests ``manifests`` and every blob they reference (config, layers).

        A manifest that cannot be read raises (:class:`IntegrityError`,
        :class:`NotFoundError`): a sweep that does not know what it names could
        remove a live blob.
        """
        out: set[str] = set()
        for digest in manifests:
            out.add(digest)
            data = self._read_manifest(self._blob_path(digest), digest)
            try:
                doc = loads(data)
            except ValueError:
                raise IntegrityError(
                    f"{self.ref}: manifest {digest} is not JSON",
                    hint="nothing was removed; repair or remove that tag first",
                ) from None
            for desc in [doc.get("config") or {}, *(doc.get("layers") or [])]:
                if isinstance(desc, dict) and isinstance(desc.get("digest"), str):
                    out.add(desc["digest"])
            for desc in doc.get("manifests") or []:  # an index: its children live too
                if isinstance(desc, dict) and isinstance(desc.get("digest"), str):
                    out |= self.referenced([desc["digest"]])
        return out

    def blob_digests(self) -> dict[str, int]:
        """Every blob in the layout: digest -> size on disk."""
        out: dict[str, int] = {}
        with os.scandir(self._path("blobs", "sha256")) as it:
            for entry in it:
                if entry.is_file(follow_symlinks=False) and len(entry.name) == 64:
                    out[f"sha256:{entry.name}"] = entry.stat(follow_symlinks=False).st_size
        return out

    def remove_blob(self, digest: str) -> None:
        """Delete one blob (a garbage collector's job: the caller checked nothing uses it)."""
        with self._writing(f"blob {digest}"):
            try:  # noqa: SIM105 - contextlib is off a pod start's modules (cli/fast.py FLOOR)
                os.unlink(self._blob_path(digest))
            except FileNotFoundError:  # gone already (another gc): what was asked holds
                pass

    # -- index.json --------------------------------------------------------
    def _read_index(self) -> dict[str, Any]:
        """Read and parse index.json (a missing one is an empty index)."""
        return self._read_index_file()[0]

    def _read_index_file(self) -> tuple[dict[str, Any], tuple[int, ...] | None]:
        """Return index.json parsed, and the identity of the file read (None if missing)."""
        where = self._path("index.json")
        try:
            with open_regular(where, max_bytes=MAX_INDEX_BYTES) as f:
                read = _identity(os.fstat(f.fileno()))
                data = f.read(MAX_INDEX_BYTES + 1)
            if len(data) > MAX_INDEX_BYTES:
                raise InputFileError(
                    where, f"is larger than {MAX_INDEX_BYTES} bytes", reason="too_large"
                )
            doc = loads(data)
        except InputFileError as exc:
            if exc.reason == "missing":
                return {"manifests": []}, None
            raise StoreError(f"{self.ref}: {exc}") from None
        except OSError as exc:
            raise StoreError(f"cannot read {where}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise StoreError(f"cannot read {where}: {exc}") from exc
        if not isinstance(doc, dict):
            raise StoreError(f"{where} is not a JSON object")
        return doc, read

    def _entries(self) -> list[dict[str, Any]]:
        """Return the index's manifest descriptors, each checked for the members we read.

        Read once per version of the file: while ``index.json`` is the file
        read last (the same device, inode, size, and change and modify times),
        its entries are returned again. Every writer of a layout
        replaces the file by rename (a new inode), so a pod start that looks up
        several tags parses the index once. Callers must not change what this
        returns.
        """
        where = self._path("index.json")
        if self._seen is not None:
            try:
                if _identity(os.lstat(where)) == self._seen[0]:
                    return self._seen[1]
            except OSError:
                pass  # gone or unreadable now: the read below says which
        index, read = self._read_index_file()
        entries = index.get("manifests", [])
        if not isinstance(entries, list):
            raise IntegrityError(f"{where}: 'manifests' is not a list")
        for i, desc in enumerate(entries):
            ok = (
                isinstance(desc, dict)
                and isinstance(desc.get("digest"), str)
                and is_digest(desc["digest"])
                and isinstance(desc.get("annotations") or {}, dict)
                and isinstance((desc.get("annotations") or {}).get(ANN_REF_NAME, ""), str)
            )
            if not ok:
                raise IntegrityError(
                    f"{where}: manifest entry {i} is malformed "
                    "(no valid digest, annotations or ref name)",
                    hint="the layout was damaged or written by another tool; re-copy the store",
                )
        self._seen = (read, entries) if read is not None else None
        return entries

    def _write_index(self, index: dict[str, Any]) -> None:
        import json  # noqa: PLC0415  # lazy: indented, as written since the first layout; a no-op only reads

        self._seen = None
        atomic_write(self._path("index.json"), json.dumps(index, indent=2).encode())

    def _locked_index(self) -> _LockedIndex:
        """Read index.json for changes in a ``with`` block, then write it, all under one flock."""
        return _LockedIndex(self)


class _Writing:
    """The block of :meth:`LayoutStore._writing` (a class: ``contextlib`` is off a no-op's path)."""

    def __init__(self, ref: str, what: str) -> None:
        self._ref = ref
        self._what = what

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if not isinstance(exc, OSError):
            return
        detail = f"{self._ref}: cannot write {self._what} ({exc.strerror or exc})"
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise NoSpaceError(
                f"{detail}: out of space", hint="free space on its disk, or prune the store"
            ) from None
        raise StoreError(
            detail, hint="check that this user may write the directory, and that it is a layout"
        ) from None


class _LockedIndex:
    """The block of :meth:`LayoutStore._locked_index`: the index under the layout's flock."""

    def __init__(self, layout: LayoutStore) -> None:
        self._layout = layout
        self._writing = layout._writing("index.json")
        self._lock: IO[str] | None = None
        self._index: dict[str, Any] = {}

    def __enter__(self) -> dict[str, Any]:
        # lazy: a write takes the lock; a no-op restore only reads and never loads fcntl
        import fcntl  # noqa: PLC0415

        self._writing.__enter__()
        try:
            self._lock = open(self._layout._path(".index.lock"), "a")
            fcntl.flock(self._lock.fileno(), fcntl.LOCK_EX)
            index = self._layout._read_index()
        except BaseException as exc:
            self._close()
            self._writing.__exit__(type(exc), exc, exc.__traceback__)
            raise
        index.setdefault("manifests", [])
        index.setdefault("schemaVersion", 2)
        index.setdefault("mediaType", INDEX_MEDIA_TYPE)
        self._index = index
        return index

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        try:
            if exc is None:
                self._layout._write_index(self._index)
        except OSError as failed:
            self._writing.__exit__(type(failed), failed, failed.__traceback__)  # raises its own
            raise
        finally:
            self._close()  # whatever the block or the write raised: the flock goes with it
        self._writing.__exit__(kind, exc, trace)

    def _close(self) -> None:
        if self._lock is not None:
            self._lock.close()  # closing the file releases the flock
            self._lock = None


class _StoreReader:
    """A blob file whose read errors (EIO, a vanished mount) are store errors (``with``: closed)."""

    def __init__(self, handle: BinaryIO, what: str) -> None:
        self._handle = handle
        self._what = what

    def __enter__(self) -> BinaryIO:
        return self  # type: ignore[return-value]  # read() is all a blob's reader uses

    def __exit__(self, *exc: object) -> None:
        self._handle.close()

    def read(self, n: int = -1, /) -> bytes:
        """Read up to ``n`` bytes."""
        try:
            return self._handle.read(n)
        except OSError as exc:
            raise StoreError(f"reading {self._what} failed: {exc.strerror}") from None


def _verify(data: bytes, digest: str) -> None:
    actual = digest_of(data)
    if actual != digest:
        raise IntegrityError(f"manifest {digest} is corrupt (content hashes to {actual})")


def _identity(st: os.stat_result) -> tuple[int, ...]:
    """Return what tells one version of a file from another without reading it."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
