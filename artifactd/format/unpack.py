"""Unpack a family layer safely: check the record, then stream the blob into staging.

This is the dangerous half of the layer format, and it fails closed.

:func:`check_layer` runs before a byte is downloaded. It holds the layer's
record (from the artifact config) to the format's rules, so an artifact that
is consistent but hostile is refused up front: every component is one the
family knows; every path is relative, has no ``.`` or ``..``, is at most
:data:`MAX_PATH_BYTES` long with no part over :data:`MAX_NAME_BYTES`, and is
not the component root itself; no path is listed twice or lies under another
file or a symlink; files have mode 0644 or 0755, symlinks stay inside their
component; files marked for path rewriting are at most
:data:`MAX_REWRITE_BYTES`; ``unpacked_size`` is the sum of the file sizes and
the compressed size is plausible for it. It returns the most bytes the tar
stream may decompress to.

:func:`unpack_layer` then streams the blob: every member is checked before
anything is written (the same rules, plus no devices, fifos, hard links or
setuid/setgid/sticky bits, directories mode 0755, nothing the record does not
list), files are created with ``O_EXCL | O_NOFOLLOW`` under the staging root,
directories are made one level at a time (never through anything but a real
directory), symlinks are created last so no member writes through one, and
the layer digest, its size and every file's sha256 are verified. The
decompressed stream may not exceed the bound :func:`check_layer` computed (plus a
tree document's share, from the document) and
zstd's window is capped, so a compression bomb costs neither disk nor memory.
The tar's ``diff_id`` is not checked: the compressed digest and every file's
sha256 already pin every byte that is installed. A format-2 layer (members
under ``<family>/``) must also carry its tree document, equal to the record.
:func:`stage_tree` holds a family directory that a container runtime unpacked
(an image volume) to the same rules. Callers install from staging only after
:func:`unpack_layer` returns; on error they discard staging, the only place
anything was written.

Why one module of over 700 lines: :func:`unpack_layer` and :func:`stage_tree`
write through one :class:`_Extractor`, the single writer that enforces the
format's rules (claiming each listed entry once, creating files exclusively,
symlinks last, sizes and sha256s verified). Splitting the tree staging out
would make that writer a public interface between two modules, and a second
module could then write into staging without the rules.
"""

from __future__ import annotations

import _thread
import itertools
import operator
import os
import stat
import zlib

from artifactd.errors import ArtifactdError, IntegrityError, StoreError, UnsafeArtifactError
from artifactd.format.oci import TREE_DOC
from artifactd.format.views import tree_document
from artifactd.format.zstd import ZstdDecompressor, ZstdError
from artifactd.fsutil import (
    InputFileError,
    file_kind,
    link_inside,
    open_regular,
    start_writeback,
)
from artifactd.hashing import DigestReader, Hasher, is_bulk, sha256_for, verifier_of
from artifactd.records import Record
from artifactd.workers import Condition, Job, Pool, Semaphore, Thread

TYPE_CHECKING = False
if TYPE_CHECKING:
    import tarfile
    from collections import deque
    from collections.abc import Callable, Sequence, Set
    from pathlib import Path, PurePosixPath
    from typing import IO

    # A restore reads records with the light reader or pydantic (artifactd.format.light):
    # the extractor uses only the fields both give.
    from artifactd.format.views import FileView as FileEntry
    from artifactd.format.views import LayerView as LayerRecord
    from artifactd.fsutil import StrPath
    from artifactd.hashing import Readable
else:
    from _collections import deque  # collections' own: importing that package loads more

#: Longest member path (``component/relative/path``), in UTF-8 bytes.
MAX_PATH_BYTES = 1024
#: Longest single path part, in UTF-8 bytes (Linux NAME_MAX).
MAX_NAME_BYTES = 255
#: Largest file marked for path rewriting; it is rewritten in memory.
MAX_REWRITE_BYTES = 16 << 20
#: Modes a regular file may have; symlinks are 0777, directories 0755.
FILE_MODES = frozenset({0o644, 0o755})
#: Directories the record does not imply that a layer may still carry (empty dirs).
EXTRA_DIRS = 4096
#: zstd window cap: the packer's level 6 uses a few MiB; a bomb may not ask for GiBs.
MAX_ZSTD_WINDOW = 128 << 20
_CHUNK = 1 << 20
_AHEAD_CHUNK = 4 << 20
#: Bytes of a new piece joined with the end of the last one, for the member between them.
_JOIN = 64 << 10
_BLOCK = 512


def _round(n: int) -> int:
    return -(-n // _BLOCK) * _BLOCK


def _header_bound(name: str, link: str | None = None) -> int:
    """Most tar bytes one member's headers take: a ustar header plus a PAX header."""
    size = len(name) if name.isascii() else len(name.encode())
    if link:
        size += len(link) if link.isascii() else len(link.encode())
    return 3 * _BLOCK + 2 * -(-(size + 256) // _BLOCK) * _BLOCK  # 2 x _round(size + 256)


def _name_problem(name: str, components: frozenset[str]) -> str | None:
    """Why ``name`` is not a safe member path (None: it is), with plain string checks.

    The one owner of the member-name rules: no path objects, so the record's
    tens of thousands of names are checked in microseconds each.
    """
    if not name or "\x00" in name or "\\" in name:
        return f"member name {name!r} is empty or has forbidden characters"
    if name[0] == "/":
        return f"member {name!r} has an absolute path"
    parts = name.split("/")
    # An empty part is a doubled or trailing slash: only a normal form is accepted.
    if "" in parts or "." in parts or ".." in parts:
        return f"member {name!r} has a '.' or '..' component or is not normal"
    if parts[0] not in components:
        return f"member {name!r} is outside the layer's components"
    # UTF-8 takes at most 4 bytes a character: short names need no encoding, and
    # an ASCII name's bytes are its characters (most names: no encoding either).
    if len(name) * 4 <= MAX_NAME_BYTES or (
        name.isascii() and len(name) <= MAX_PATH_BYTES and max(map(len, parts)) <= MAX_NAME_BYTES
    ):
        return None
    return _length_problem(name, parts)


def _length_problem(name: str, parts: list[str]) -> str | None:
    encoded = name.encode("utf-8", "surrogateescape")
    if len(encoded) > MAX_PATH_BYTES:
        return f"member {name[:60]!r}... is {len(encoded)} bytes long (limit {MAX_PATH_BYTES})"
    if any(len(part.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES for part in parts):
        return f"member {name[:60]!r}... has a path part over {MAX_NAME_BYTES} bytes"
    return None


def check_name(name: str, components: frozenset[str]) -> None:
    """Raise :class:`UnsafeArtifactError` unless ``name`` is a safe member path."""
    problem = _name_problem(name, components)
    if problem is not None:
        raise UnsafeArtifactError(problem)


def _parents(name: str) -> list[str]:
    """Return the directories above ``name`` (a checked member path), nearest first."""
    out = []
    i = name.rfind("/")
    while i > 0:
        name = name[:i]
        out.append(name)
        i = name.rfind("/")
    return out


def _add_parents(name: str, dirs: set[str]) -> None:
    """Add the directories above ``name`` (a checked member path) to ``dirs``.

    ``dirs`` holds every directory above each directory it holds, so the walk
    stops at the first one already there: a directory is reached once per
    record, not once per file under it (18,000 files, 4,500 directories).
    """
    i = name.rfind("/")
    while i > 0:
        name = name[:i]
        if name in dirs:
            return
        dirs.add(name)
        i = name.rfind("/")


def check_member(member: tarfile.TarInfo, components: frozenset[str]) -> str:
    """Validate one tar member fully (name, type, mode, link target); return its checked name."""
    path = member.name.rstrip("/")
    check_name(path, components)
    if member.isdev() or member.isfifo():
        raise UnsafeArtifactError(f"member {member.name!r} is a device or fifo")
    if member.islnk():
        raise UnsafeArtifactError(f"member {member.name!r} is a hard link")
    if not (member.isreg() or member.isdir() or member.issym()):
        raise UnsafeArtifactError(f"member {member.name!r} has unsupported type {member.type!r}")
    if member.mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX):
        raise UnsafeArtifactError(f"member {member.name!r} has setuid/setgid/sticky bits")
    if member.isdir():
        if member.mode & 0o7777 != 0o755:
            raise UnsafeArtifactError(
                f"directory {member.name!r} has mode {member.mode & 0o7777:04o}; only 0755"
            )
        return path
    if "/" not in path:
        raise UnsafeArtifactError(
            f"member {member.name!r} replaces its component directory with a non-directory"
        )
    if member.issym() and not _link_inside(path, member.linkname):
        raise UnsafeArtifactError(f"symlink {member.name!r} -> {member.linkname!r} leaves its root")
    return path


def _link_inside(path: str, target: str) -> bool:
    """:func:`~artifactd.fsutil.link_inside` of a symlink at ``path`` (a checked member path)."""
    from pathlib import PurePosixPath  # noqa: PLC0415  # lazy: only a record with links

    return link_inside(PurePosixPath(path.partition("/")[2]), target)


def _doc_limit(canonical: bytes) -> int:
    return 2 * len(canonical) + (64 << 10)


def check_layer(
    record: LayerRecord, known_components: frozenset[str], *, prefix: str | None = None
) -> int:
    """Hold a layer record to the format's rules; return the most tar bytes its files may take.

    ``prefix`` is the family directory of a format-2 layer (its members are
    ``<prefix>/<component>/...``, plus the tree document, whose share of the
    bound :func:`unpack_layer` adds from the document). Runs before anything
    is downloaded. Raises :class:`UnsafeArtifactError` for
    anything the format forbids and :class:`IntegrityError` when the record
    contradicts itself.
    """
    comps = record.components
    unknown = sorted(set(comps) - known_components)
    if unknown:
        raise UnsafeArtifactError(
            f"layer {record.family} declares component(s) {unknown} the family does not have"
            f" (it has {sorted(known_components)})"
        )
    if len(set(comps)) != len(comps) or not comps:
        raise IntegrityError(f"layer {record.family}: component list {comps} is empty or repeats")
    components = frozenset(comps)
    checked = _plain_entries(record.files, components)
    if checked is None:
        files, dirs, total = _checked_entries(record.files, components)
    else:
        files, dirs, total = checked
    clash = next((d for d in dirs if d in files), None)
    if clash is not None:
        raise UnsafeArtifactError(f"{clash} is listed as a file and holds other members")
    bound = _tar_bytes(record.files, dirs | components, prefix)
    if total != record.unpacked_size:
        raise IntegrityError(
            f"layer {record.family}: unpacked_size {record.unpacked_size} is not the sum of its "
            f"file sizes ({total})"
        )
    # zstd never grows incompressible data by more than a small fraction.
    most = bound + (_tree_doc_estimate(record) if prefix is not None else 0)
    if record.size > most + most // 64 + (1 << 20):
        raise IntegrityError(
            f"layer {record.family}: {record.size} compressed bytes for at most {most} of tar"
        )
    return bound


#: A record's file paths, the directories they imply, and the sum of their sizes.
_Plain = tuple[frozenset[str], frozenset[str], int]


def _checked_entries(entries: Sequence[FileEntry], components: frozenset[str]) -> _Plain:
    """Hold each entry to the format's rules; return the paths, the directories, the bytes."""
    files: set[str] = set()
    dirs: set[str] = set()
    total = 0
    for entry in entries:
        path = entry.path
        _check_entry(entry, components)
        if path in files:
            raise UnsafeArtifactError(f"{path!r} is listed twice")
        files.add(path)
        _add_parents(path, dirs)
        total += entry.size
    return frozenset(files), frozenset(dirs), total


_FIRST_PART = operator.methodcaller("partition", "/")
_SIZE = operator.attrgetter("size")
_PARENT = operator.methodcaller("rpartition", "/")


#: The last few records :func:`_plain_entries` checked (by the id of their list of
#: entries, which each result keeps alive), so the extractor does not check again
#: what :func:`check_layer` just checked. Records are read-only.
_PLAIN_RECENT: dict[int, tuple[Sequence[FileEntry], frozenset[str], _Plain | None]] = {}
_PLAIN_RECENT_MAX = 4
_PLAIN_RECENT_LOCK = _thread.allocate_lock()


def _plain_entries(entries: Sequence[FileEntry], components: frozenset[str]) -> _Plain | None:
    """:func:`_checked_entries` of a record of plain files, in the interpreter's own loops.

    A record as artifactd writes it (ASCII paths of plain parts under its
    components, no symlink, modes 0644 or 0755, no file marked for rewriting
    over :data:`MAX_REWRITE_BYTES`, no path twice) is checked a
    field at a time: 18,000 entries in a third of the time. Anything else
    returns None, and each entry is checked, which names what is wrong.
    The same list of entries with the same components is answered from
    :data:`_PLAIN_RECENT`.
    """
    with _PLAIN_RECENT_LOCK:
        hit = _PLAIN_RECENT.get(id(entries))
    if hit is not None and hit[0] is entries and hit[1] == components:
        return hit[2]
    found = _plain_check(entries, components)
    with _PLAIN_RECENT_LOCK:
        while len(_PLAIN_RECENT) >= _PLAIN_RECENT_MAX:
            del _PLAIN_RECENT[next(iter(_PLAIN_RECENT))]
        _PLAIN_RECENT[id(entries)] = (entries, components, found)
    return found


def _plain_check(entries: Sequence[FileEntry], components: frozenset[str]) -> _Plain | None:
    paths = list(map(operator.attrgetter("path"), entries))
    links = list(map(operator.attrgetter("link"), entries))
    sizes = list(map(operator.attrgetter("size"), entries))
    rewritten = itertools.compress(sizes, map(operator.attrgetter("rewrite"), entries))
    if (
        not paths
        or links.count(None) != len(links)
        or not set(map(operator.attrgetter("mode"), entries)) <= FILE_MODES
        or max(rewritten, default=0) > MAX_REWRITE_BYTES
        or max(map(len, paths)) > MAX_PATH_BYTES
        or not _plain_names(paths)
        or not set(map(operator.itemgetter(0), map(_FIRST_PART, paths))) <= components
    ):
        return None
    files = frozenset(paths)
    if len(files) != len(paths):
        return None
    dirs: set[str] = set()
    for parent in set(map(operator.itemgetter(0), map(_PARENT, paths))):
        if parent not in dirs:
            dirs.add(parent)
            _add_parents(parent, dirs)
    return files, frozenset(dirs), sum(sizes)


def _plain_names(paths: list[str]) -> bool:
    """Whether every path is one :func:`_name_problem` accepts on sight: two plain parts or more.

    A plain part is 1 to 255 characters of printable ASCII but ``/`` and
    ``\\``, and neither ``.`` nor ``..``. Checked on the whole list at once, in
    the interpreter's own string loops: 18,000 paths in about 4 ms, as long as
    the regular expression it replaced took.
    """
    flat = "".join(paths)
    if not (flat.isascii() and flat.isprintable()) or "\\" in flat:
        return False
    if not all(map(operator.contains, paths, itertools.repeat("/"))):
        return False  # a path of one part
    # Joined by slashes, every part of every path lies between two slashes.
    text = f"/{'/'.join(paths)}/"
    if "//" in text or "/./" in text or "/../" in text:
        return False
    longest = max(map(len, paths))  # no part is longer than its path
    return longest <= MAX_NAME_BYTES or max(map(len, text.split("/"))) <= MAX_NAME_BYTES


def _tree_doc_estimate(record: LayerRecord) -> int:
    """More tar bytes than a format-2 layer's tree document can take, without making it.

    For the compressed-size check only: :func:`unpack_layer` bounds the member
    by the document itself, which only an extraction needs (a layer the node
    store already holds unpacked is served without one; an 18,000-file
    document takes about 70 ms to make). Each entry's JSON is its path and
    link at most 6 bytes a character (``\\u`` escapes), plus its digest and
    numbers in far less than 256 bytes.
    """
    canonical = (
        sum(6 * (len(e.path) + len(e.link or "")) + 256 for e in record.files)
        + 6 * len(str(record.scope))
        + 4096
    )
    return _round(2 * canonical + (64 << 10)) + 2 * _header_bound("x" * MAX_PATH_BYTES)


def tar_bound(
    entries: Sequence[FileEntry], components: frozenset[str], *, prefix: str | None = None
) -> int:
    """Return the most bytes an honest tar of these entries can take.

    File data rounded to tar blocks, a ustar and a PAX header per file and per
    directory the paths imply (named under ``prefix/`` when given, plus the
    prefix directory itself), :data:`EXTRA_DIRS` more (empty) directories, and
    the end-of-archive padding. A format-2 layer's tree document is not
    included (:func:`check_layer` adds it).
    """
    dirs = set(components)
    for entry in entries:
        _add_parents(entry.path, dirs)
    return _tar_bytes(entries, dirs, prefix)


def _tar_bytes(entries: Sequence[FileEntry], dirs: Set[str], prefix: str | None) -> int:
    """:func:`tar_bound` of ``entries``, given every directory they imply (and the components)."""
    lead = f"{prefix}/" if prefix else ""
    bound = 2 * 10240 + EXTRA_DIRS * _header_bound("x" * (MAX_PATH_BYTES + len(lead)))
    if prefix:
        bound += _header_bound(prefix)
    for entry in entries:
        bound += -(-entry.size // _BLOCK) * _BLOCK + _header_bound(lead + entry.path, entry.link)
    return bound + sum(_header_bound(lead + d) for d in dirs)


def _check_entry(entry: FileEntry, components: frozenset[str]) -> None:
    """Hold one file entry of a record to the format's rules."""
    problem = _name_problem(entry.path, components)
    if problem is not None:
        raise UnsafeArtifactError(problem)
    if "/" not in entry.path:
        raise UnsafeArtifactError(f"{entry.path!r} would replace its component directory")
    if entry.link is not None:
        if entry.mode != 0o777 or entry.size != 0:
            raise UnsafeArtifactError(f"symlink {entry.path!r} has mode or size set")
        if not _link_inside(entry.path, entry.link):
            raise UnsafeArtifactError(f"symlink {entry.path!r} -> {entry.link!r} leaves root")
    elif entry.mode not in FILE_MODES:
        raise UnsafeArtifactError(
            f"{entry.path!r} has mode {entry.mode:04o}; only 0644 and 0755 are allowed"
        )
    if entry.rewrite and entry.size > MAX_REWRITE_BYTES:
        raise UnsafeArtifactError(
            f"{entry.path!r} is marked for path rewriting and is {entry.size} bytes "
            f"(limit {MAX_REWRITE_BYTES})"
        )


class UnpackResult(Record):
    """What :func:`unpack_layer` wrote under the staging root."""

    files: int
    bytes: int


#: Files up to this size are read whole and written by the writer threads;
#: larger ones stream to disk in :data:`_STREAM_CHUNK` pieces (see :func:`_stream_member`).
_BUFFERED_FILE = 1 << 20
#: Piece size of a streamed file: small enough to stay in the CPU cache from
#: decompression through hashing to the write (1 MiB pieces measured 1.7x slower).
_STREAM_CHUNK = 128 << 10
#: Piece size of a streamed file read in place from the tar stream (:class:`_Span`):
#: no copy to keep in the cache, so larger pieces cost fewer hand-overs. Per GiB,
#: 128 KiB pieces cost 3.6 CPU seconds in all, 1 MiB 2.8, 4 MiB (a whole zstd
#: output) 3.9: the helper's hash and write then miss the cache.
_SPAN_PIECE = 1 << 20
#: Pieces of a streamed file decompressed ahead of its hashing and writing, at most.
_STREAM_AHEAD = 8
#: A streamed file asks the kernel to start writing each run of this many bytes
#: to disk as soon as it is written (see :func:`_stream_member`).
_WRITEBACK = 8 << 20
#: Bytes read ahead of the writer threads, at most: the files' bytes, or the
#: decompressed buffers their views keep alive, whichever is more (see ``_accept``).
_IN_FLIGHT = 256 << 20
#: Two writers overlap file creation with parsing; more contend on this disk (measured).
_WRITERS = 2
#: Batches queued ahead of the writer threads, at most.
_MAX_QUEUED = 1024
#: Small files are handed to the writers in batches of at most this many files
#: or :data:`_BATCH_BYTES` bytes: one hand-over per file cost more than the write.
_BATCH_FILES = 32
_BATCH_BYTES = 1 << 20

#: Compressed bytes read ahead of the extractor, at most, so the download
#: keeps going while the extractor parses, hashes and creates files.
_READ_AHEAD = 32 << 20

#: A batch's files as the batch writer takes them: path, bytes, mode, the sha256 to check
#: (None: already checked), and the mtime to set (None: leave it).
_NativeItem = tuple[str, "bytes | memoryview", int, "str | None", "int | None"]


def _load_batch_writer() -> Callable[[list[_NativeItem], int], int] | None:
    """Return the C batch writer's ``write_batch``, or None where it was not built.

    ``artifactd/format/_batchwrite.c`` (an optional extension: see setup.py)
    creates a batch of files with the GIL released once instead of four times
    per file, and stops before the first file that does not go well;
    :meth:`_Extractor._write_batch` then does that file and the rest itself,
    so every error is the Python loop's. It finds SHA-256 in the libcrypto
    that ``hashlib`` loaded, when a batch first asks it to check one (a
    layer's worth of bulk data: see :data:`~artifactd.hashing.BULK`); where it
    cannot, it stops before such a file. A build for another Python or libc
    fails to import.
    """
    try:
        # Optional: a pure wheel has no such module.
        from artifactd.format._batchwrite import write_batch  # noqa: PLC0415
    except ImportError:
        return None
    return write_batch


#: The batch writer, or None (the pure Python path). Tests set it to None to run that path.
_write_natively = _load_batch_writer()


class _TruncatedError(Exception):
    """The tar stream ends inside a member's data: tarfile's ``ReadError``, for the tight path."""


class _ByteBudget:
    """Bounds the bytes handed to writer threads and not yet written."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._used = 0
        self._cond = Condition()

    def acquire(self, n: int) -> None:
        with self._cond:
            # A file bigger than the whole budget waits until nothing else is in flight.
            self._cond.wait_for(lambda: self._used == 0 or self._used + n <= self._limit)
            self._used += n

    def release(self, n: int) -> None:
        with self._cond:
            self._used -= n
            self._cond.notify_all()


class _Bounded:
    """Reads from a decompressed stream, refusing to go past ``limit`` bytes.

    The source is read in :data:`_CHUNK` pieces and served from a buffer:
    each call into zstd gives up and retakes the GIL, which the writer threads
    then hold. It is the tar reader's file: :meth:`read` returns exactly ``n``
    bytes unless the stream ends, :meth:`tell` counts what was consumed and
    :meth:`seek` only skips forward, so tarfile reads it directly (no second
    buffer of its own) and :meth:`_Extractor.scan` can look at the next header
    block (:meth:`peek`) before tarfile does.

    A member that straddles two pieces is served from a joined buffer: what
    was left of the old piece and the first :data:`_JOIN` bytes of the new one
    (or more, if a read asks for more). Once only the new piece's bytes are
    left unread, the buffer is that piece itself again, so the piece's
    megabytes are never copied (a copy per piece was a tenth of the reading
    thread's time).
    """

    def __init__(self, source: Readable, limit: int, digest: str) -> None:
        self._source = source
        self._left = limit
        self._digest = digest
        self._buf = b""
        self._view = memoryview(self._buf)
        #: Consumed bytes of ``_buf``, and the stream offset of ``_buf[0]``.
        self._pos = 0
        self._base = 0
        self._eof = False
        #: While ``_buf`` is a joined buffer: the piece whose head it copied,
        #: ``_buf[_joined:]`` being ``_piece[_piece_from:_piece_to]``.
        self._piece: bytes | None = None
        self._piece_from = 0
        self._piece_to = 0
        self._joined = 0

    def _fill(self, want: int) -> bool:
        """Make more unread bytes available (``want`` if it can); False at the stream's end."""
        if self._eof:  # the source said so once: no piece is pending after it
            return False
        piece = self._piece
        if piece is not None:
            if self._pos >= self._joined:  # only the piece's bytes are left: serve it in place
                self._piece = None
                self._use(piece, self._piece_from + self._pos - self._joined)
                if self._piece_to < len(piece):
                    return True
                # All of the piece was in the joined buffer: nothing more here, read on.
            elif self._piece_to < len(piece):  # a long member: join more of the piece
                more = max(want, _JOIN)
                head = piece[self._piece_to : self._piece_to + more]
                self._joined -= self._pos
                self._piece_to += len(head)
                self._use(self._buf[self._pos :] + head, 0)
                return True
            else:
                self._piece = None  # the piece is all in the joined buffer: read the next one
        data = self._source.read(min(max(want, _AHEAD_CHUNK), self._left + 1))
        self._left -= len(data)
        if self._left < 0:
            raise IntegrityError(
                f"layer {self._digest} decompresses to more than its record allows"
                " (a compression bomb, or sizes that lie)"
            )
        if not data:
            self._eof = True
            return False
        if self._pos >= len(self._buf):
            self._use(data, 0)
            return True
        # What was not consumed yet (a member's head, at most) is joined with the
        # new piece's first bytes only; the piece itself is served from where they end.
        head = data[: max(want, _JOIN)]
        self._piece, self._piece_from, self._piece_to = data, 0, len(head)
        self._joined = len(self._buf) - self._pos
        self._use(self._buf[self._pos :] + head, 0)
        return True

    def _use(self, buf: bytes, at: int) -> None:
        """Serve from ``buf``, its unconsumed bytes starting at ``at``; the stream offset stays."""
        self._base += self._pos - at
        self._buf = buf
        self._view = memoryview(buf)
        self._pos = at

    def peek(self, n: int) -> bytes:
        """Return the next ``n`` bytes (fewer at the end) without consuming them."""
        while len(self._buf) - self._pos < n and self._fill(n - (len(self._buf) - self._pos)):
            pass
        return self._buf[self._pos : self._pos + n]

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            parts = [self._buf[self._pos :]]
            self._pos = len(self._buf)
            while data := self.read(_CHUNK):
                parts.append(data)
            return b"".join(parts)
        out = self.peek(n)
        self._pos += len(out)
        return out

    def take(self, n: int) -> memoryview:
        """Consume up to ``n`` bytes (empty only at the end), as a view of the buffer: no copy.

        At most what one buffer holds: a file's bytes come out in the pieces
        zstd gave, never joined. The view keeps its buffer alive.
        """
        if self._pos >= len(self._buf) and not self._fill(1):
            return memoryview(b"")
        start = self._pos
        self._pos = min(start + n, len(self._buf))
        return memoryview(self._buf)[start : self._pos]

    def member(self, size: int, padded: int, head: int = _BLOCK) -> bytes | memoryview:
        """Consume a member's ``head`` bytes of headers, ``size`` bytes of data and its padding.

        Returns the data: a view of the buffer (no copy) when the member lies in
        it whole, as it mostly does, else bytes. Raises tarfile's error when
        the stream ends inside the data or its padding (to ``padded``).
        """
        start = self._pos + head
        if start + padded <= len(self._buf):
            self._pos = start + padded
            return self._view[start : start + size]
        self.skip(head)
        data = self.read(size)
        if len(data) != size:
            raise _TruncatedError("unexpected end of data")
        self.pad(padded - size)
        return data

    def pad(self, n: int) -> None:
        """Consume a member's ``n`` bytes of padding; raise tarfile's error if the stream ends."""
        end = self.tell() + n
        self.skip(n)
        if self.tell() != end:
            raise _TruncatedError("unexpected end of data")

    def tell(self) -> int:
        return self._base + self._pos

    def skip(self, n: int) -> None:
        """Consume ``n`` more bytes (fewer at the end of the stream)."""
        if len(self._buf) - self._pos >= n:
            self._pos += n
        else:
            self.seek(self.tell() + n)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        """Skip forward to ``offset`` (or the end of the stream, if it comes first)."""
        if whence != os.SEEK_SET or offset < self.tell():
            import tarfile  # noqa: PLC0415  # only tarfile seeks: it is loaded

            raise tarfile.StreamError("seeking backwards is not allowed")
        while (gap := offset - self.tell()) > 0:
            if len(self._buf) - self._pos >= gap:
                self._pos += gap
            else:
                self._pos = len(self._buf)
                if not self._fill(min(gap, _CHUNK)):
                    break
        return self.tell()


class _Span:
    """A member's data read in place from the tar stream: views of its buffer, then b"".

    For a large regular file: tarfile's file object would copy every byte
    twice (its reader's slice, then ``readinto``); these views are hashed and
    written as they are. A stream that ends early is tarfile's own error.
    """

    def __init__(self, plain: _Bounded, size: int) -> None:
        self._plain = plain
        self._left = size

    def read(self, n: int = -1, /) -> bytes | memoryview:
        if self._left <= 0:
            return b""
        view = self._plain.take(self._left if n < 0 else min(n, self._left))
        if not view:
            raise _TruncatedError("unexpected end of data")
        self._left -= len(view)
        return view


class _ReadAhead:
    """Reads a blob on its own thread, at most :data:`_READ_AHEAD` bytes ahead of its reader.

    A registry's bytes then keep arriving while the extractor works, so the
    link and the disk are busy at the same time. The source's error (a
    stalled or short download, a digest mismatch) is raised to the reader at
    the point of the stream where it happened, as if the reader had read it.
    :meth:`close` stops the thread and waits for it, so nothing reads the
    source once the extractor has returned.
    """

    def __init__(
        self, source: Readable, *, tail: Callable[[Callable[[], bool]], None] | None = None
    ) -> None:
        self._source = source
        self._tail = tail
        self._chunks: deque[bytes] = deque()
        self._held = 0
        self._eof = False
        self._stop = False
        self._error: BaseException | None = None
        self._cond = Condition()
        self._thread = Thread(self._run, "read-ahead")
        self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    self._cond.wait_for(lambda: self._stop or self._held < _READ_AHEAD)
                    if self._stop:
                        return
                data = self._source.read(_AHEAD_CHUNK)
                if not data and self._tail is not None:
                    self._tail(lambda: self._stop)  # its error reaches the reader as the source's
                with self._cond:
                    if data:
                        self._chunks.append(data)
                        self._held += len(data)
                    else:
                        self._eof = True
                    self._cond.notify_all()
                if not data:
                    return
        except BaseException as exc:  # handed to the reader, raised on its thread
            with self._cond:
                self._error = exc
                self._cond.notify_all()

    def read(self, n: int = -1, /) -> bytes:
        with self._cond:
            self._cond.wait_for(lambda: self._chunks or self._eof or self._error is not None)
            if not self._chunks:
                if self._error is not None:
                    raise self._error
                return b""
            data = self._chunks.popleft()
            if 0 <= n < len(data):
                self._chunks.appendleft(data[n:])
                data = data[:n]
            self._held -= len(data)
            self._cond.notify_all()
            return data

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join()


#: Octal digits: deleted from a header's number fields, they leave only what ends each.
_OCTAL = b"01234567"
#: Bytes 100-154 of a header as tarfile itself writes them: six number fields of octal
#: digits (mode, uid, gid, size, mtime, checksum), each ended by a NUL (at 107, 115, 123,
#: 135, 147 and 154).
_FIELD_NULS = bytes(6)
#: A plain member's type byte: a regular file ("0" or NUL) or a directory ("5").
_PLAIN_TYPES = frozenset(b"05\0")
#: tarfile's type bytes for the members the tight path takes.
_DIRTYPE = b"5"
_REGTYPES = (b"0", b"\0")
#: What ends a tar archive for tarfile (and for :meth:`_Extractor.scan`): a block of zeros.
_END_BLOCK = bytes(_BLOCK)
#: A PAX extended header's type (its records apply to the member after it), and the most
#: bytes of records :func:`_long_named` reads (a name is at most MAX_PATH_BYTES and a prefix).
_PAX_TYPES = frozenset(b"x")
_PAX_MAX = 4096
#: A device number field that is absent: eight NULs (tarfile reads it as 0).
_NO_DEVICE = bytes(8)


def _block_sum(block: bytes) -> int:
    """``sum(block)`` of a 512-byte header block, computed in C.

    Adler-32's low half is 1 plus the bytes' sum modulo 65,521: exact for 256
    bytes, whose sum is at most 65,280, so two halves give the block's sum
    (a tenth of the time of ``sum``, once per member of the tar stream).
    """
    view = memoryview(block)
    return (zlib.adler32(view[:256]) & 0xFFFF) + (zlib.adler32(view[256:]) & 0xFFFF) - 2


def _plain_fields(block: bytes, types: frozenset[int] = _PLAIN_TYPES) -> bool:
    """Whether a 512-byte header block's fields are in the plain form tarfile itself writes.

    Mode, uid, gid, size, mtime and checksum: octal digits, each field ended by
    a NUL (deleting the digits leaves six NULs, at those ends), the checksum's
    space after its NUL; a regular file's or a directory's type; devmajor and
    devminor each seven digits and a NUL, or eight NULs; no ustar name prefix;
    a checksum that matches (unsigned, the checksum field counted as spaces;
    tarfile also takes a signed one).
    """
    if (
        block[100:155].translate(None, _OCTAL) != _FIELD_NULS
        or block[107] | block[115] | block[123] | block[135] | block[147] | block[154]
        or block[155] != 32
        or block[156] not in types
        or block[345]
    ):
        return False
    for device in (block[329:337], block[337:345]):
        if device != _NO_DEVICE and (device[7] or device[:7].translate(None, _OCTAL)):
            return False
    digits = block[148:154]  # then a NUL (0) and a space (32)
    return int(digits, 8) == _block_sum(block) - sum(digits) - 32 + 256


def _plain_header(block: bytes) -> tuple[str, bytes, int, int] | None:
    """(name, type, mode, size) of a plain ustar file or directory header; None for anything else.

    Answers only where ``tarfile.TarInfo.frombuf`` reads the same member from
    the 512-byte block: every number field in the plain form (octal digits and
    a NUL, which tarfile reads as the same numbers: :func:`_plain_fields`), a
    checksum that matches, no ustar name prefix, an ASCII name, a regular file
    (type ``0`` or NUL, no trailing slash) or a directory. None sends the
    member to tarfile, which reads it (or refuses it) as it always did.
    """
    if not _plain_fields(block):
        return None
    try:
        name = block[:100].split(b"\0", 1)[0].decode("ascii")
    except UnicodeDecodeError:
        return None
    kind = block[156:157]
    mode, size = int(block[100:107], 8), int(block[124:135], 8)
    if kind == _DIRTYPE:
        return name.rstrip("/"), kind, mode, size
    if name.endswith("/"):  # tarfile reads a NUL-type member named so as a directory
        return None
    return name, kind, mode, size


def _long_named(plain: _Bounded, block: bytes) -> tuple[str, bytes, int, int, int] | None:
    """(name, type, mode, size, header bytes) of a member whose name took a PAX header.

    tarfile writes a name longer than the ustar field (100 bytes) as a PAX
    extended header (type ``x``) holding one record, ``<length> path=<name>``
    and a newline, before the member's own header (whose name field it cuts).
    That form, with a plain header after it (:func:`_plain_header`), is read
    here as tarfile reads it: the record's name, the rest from the header.
    Anything else (another record, a global header, a name ending in ``/``
    for a file, which tarfile would change) is None: tarfile reads it.
    """
    if not _plain_fields(block, _PAX_TYPES):
        return None
    size = int(block[124:135], 8)
    padded = -(-size // _BLOCK) * _BLOCK
    both = plain.peek(_BLOCK + padded + _BLOCK) if size <= _PAX_MAX else b""
    header = _plain_header(both[_BLOCK + padded :]) if len(both) == 2 * _BLOCK + padded else None
    name = _pax_path(both[_BLOCK : _BLOCK + size]) if header is not None else None
    if header is None or name is None:
        return None
    kind, mode, member_size = header[1:]
    if kind == _DIRTYPE:
        name = name.rstrip("/")
    elif name.endswith("/"):
        return None
    return name, kind, mode, member_size, 2 * _BLOCK + padded


def _pax_path(record: bytes) -> str | None:
    """Return the name in a PAX header's records if they are one ``path`` record (UTF-8)."""
    space = record.find(b" ")
    digits, value = record[:space], record[space + 1 : -1]
    if not (digits.isdigit() and int(digits) == len(record) and record.endswith(b"\n")):
        return None
    if not value.startswith(b"path=") or b"\n" in value:
        return None
    try:
        return value[5:].decode("utf-8")
    except UnicodeDecodeError:
        return None


#: One small file ready to write: its path under staging, its bytes, its entry, and whether
#: the writer still has to check the bytes' sha256 (it does so before creating the file).
_Write = tuple[str, "bytes | memoryview", "FileEntry", bool]


class _Extractor:
    """Per-layer extraction state: what the record expects, what was written.

    The record is known before the first byte, so its names are checked once
    up front (the member-name rules, with string operations) and every
    directory its files need is made while the first bytes arrive. A member
    that the record lists as a regular file of at most :data:`_BUFFERED_FILE`
    bytes with the same size and mode then takes the tight path: its plain
    ustar header read without tarfile (:meth:`scan`; :meth:`fast` when
    tarfile read the header), one dict lookup, the bytes read straight from
    the tar stream and handed in batches to a few writer threads, which check
    each file's sha256 and then create it, because creating files is what
    restore time is made of on real disks (hashing, open + write + close
    overlap well, and release the GIL; the C batch writer, where built, does
    a whole batch in one release: :func:`_load_batch_writer`). A file marked
    for rewriting is hashed and rewritten on this thread first. Anything else (directories the
    record does not imply, symlinks, large files, and every member that
    differs from its record) takes the full check (:func:`check_member`) and
    so fails with the same message it always did. Large files stream straight
    to disk. Every write goes under ``staging`` only; any error discards it.
    """

    def __init__(
        self,
        staging: StrPath,
        entries: Sequence[FileEntry],
        relocate: Callable[[str, bytes], bytes] | None,
        keep_mtimes: bool,
        *,
        components: frozenset[str],
        tree: str | None = None,
        tree_limit: int = 0,
        tree_doc: bytes = b"",
    ) -> None:
        self.staging = staging
        self.root = os.fspath(staging)
        #: Format 2: the family whose tree document the layer must carry, the
        #: document (canonical bytes) and its size limit.
        self.tree = tree
        self.tree_limit = tree_limit
        self.tree_doc = tree_doc
        self.tree_seen = False
        #: Whether :meth:`scan` read the end of the archive (tarfile then has nothing to read).
        self.ended = False
        self.expected = {e.path: e for e in entries}
        #: Entries whose name passed the member-name rules: regular files by
        #: name (the tight path), and every directory above any of them.
        self.fast_files: dict[str, FileEntry] = {}
        self.record_dirs: set[str] = set()
        plain = _plain_entries(entries, components) if entries else None
        if plain is not None:
            # A record as artifactd writes it: every name passed, no link, a field
            # at a time (a third of the time of the loop below, 18,000 entries).
            self.record_dirs = set(plain[1])
            big = _BUFFERED_FILE
            self.fast_files = {p: e for p, e in self.expected.items() if e.size <= big}
            entries = ()
        for e in entries:
            if "/" in e.path and _name_problem(e.path, components) is None:
                if e.link is None and e.size <= _BUFFERED_FILE:
                    self.fast_files[e.path] = e
                for d in _parents(e.path):
                    if d in self.record_dirs:
                        break
                    self.record_dirs.add(d)
        #: A layer of more than BULK bytes (hashing.py): OpenSSL's sha256 checks its files,
        #: in the C batch writer where it was built; a smaller one, CPython's own.
        total = sum(map(_SIZE, self.expected.values()))
        self.bulk = is_bulk(total)
        self.sha256 = sha256_for(total)
        self.seen: set[str] = set()
        self.dirs: set[str] = set()
        self._dirs_lock = _thread.allocate_lock()
        #: Symlinks to create last: (member path, target).
        self.links: list[tuple[str, str]] = []
        self.total = 0
        self.relocate = relocate
        self.keep_mtimes = keep_mtimes
        # Read once per extraction (never set: os.umask would race other threads).
        self.umask = current_umask()
        self._pool = Pool(_WRITERS, "extract")
        self._budget = _ByteBudget(_IN_FLIGHT)
        self._slots = Semaphore(_MAX_QUEUED)
        self._error: BaseException | None = None
        self._batch: list[_Write] = []
        self._batch_bytes = 0
        #: The buffers this batch's views keep alive: the last one, and their bytes.
        self._pinned: object = None
        self._pinned_bytes = 0

    def prepare(self) -> None:
        """Make every directory the record implies, parents first, before any member."""
        os.makedirs(self.root, exist_ok=True)
        for d in sorted(self.record_dirs):  # a parent sorts before its children
            _mkdir_checked(f"{self.root}/{d}", self.umask)
            self.dirs.add(d)

    def abort(self) -> None:
        """Stop the writers: drop queued writes, wait for running ones."""
        self._batch = []
        self._pool.shutdown(wait=True, cancel_pending=True)

    def close(self) -> None:
        """Hand over the last batch, wait for the writers; raise the first error any hit."""
        self._flush()
        self._pool.shutdown(wait=True)
        if self._error is not None:
            raise self._error

    def mkdirs(self, name: str) -> None:
        """Create ``name`` and its parents under staging, one level at a time (any thread)."""
        if not name:
            return
        missing = []
        with self._dirs_lock:
            for d in (name, *_parents(name)):
                if d in self.dirs:
                    break
                missing.append(d)
        for d in reversed(missing):  # parents first; no recursion, whatever the depth
            _mkdir_checked(f"{self.root}/{d}", self.umask)
            with self._dirs_lock:
                self.dirs.add(d)

    def _submit(self, size: int, fn: Callable[..., None], *args: object) -> None:
        """Queue a write; raise a writer's earlier error here, on the reading thread."""
        if self._error is not None:
            raise self._error
        self._slots.acquire()
        self._budget.acquire(size)

        def task() -> None:
            try:
                fn(*args)
            except BaseException as exc:
                if self._error is None:
                    self._error = exc
            finally:
                self._budget.release(size)
                self._slots.release()

        self._pool.submit(task)

    def _flush(self) -> None:
        if self._batch:
            batch, size = self._batch, max(self._batch_bytes, self._pinned_bytes)
            self._batch, self._batch_bytes = [], 0
            self._pinned, self._pinned_bytes = None, 0
            self._submit(size, self._write_batch, batch)

    def _write_batch(self, batch: list[_Write]) -> None:
        """Writer-thread task: create the files of one batch (their dirs exist).

        The batch writer (:func:`_load_batch_writer`), where it was built, creates
        the files it can with the GIL released once and stops before the first
        one that fails; the loop below, the reference, does that one and the
        rest, and raises what it always raised.
        """
        done = 0
        native = _write_natively
        sha256 = self.sha256
        if native is not None:
            keep = self.keep_mtimes
            if self.bulk:  # the C writer checks each sha256 too (OpenSSL's, as hashlib's)
                items = [
                    (dest, data, e.mode, e.sha256 if check else None, e.mtime if keep else None)
                    for dest, data, e, check in batch
                ]
            else:  # a small layer: CPython's own sha256 checks here, the C writer only writes
                items = []
                for dest, data, e, check in batch:
                    if check and sha256(data).hexdigest() != e.sha256:
                        break  # the loop below meets it, and raises
                    items.append((dest, data, e.mode, None, e.mtime if keep else None))
            done = native(items, self.umask)
        for dest, data, entry, unchecked in itertools.islice(batch, done, None):
            # OpenSSL's sha256 releases the GIL: the reading thread parses on meanwhile.
            if unchecked and sha256(data).hexdigest() != entry.sha256:
                raise IntegrityError(f"{entry.path}: content does not match its sha256")
            _write_small(dest, data, entry, self.keep_mtimes, self.umask)

    def scan(self, plain: _Bounded, lead: str, tar: tarfile.TarFile | None = None) -> bool:
        """Take the next members while their headers are plain and the record vouches for them.

        The tightest path: each header block is read here (:func:`_plain_header`),
        and a member the record vouches for is consumed with its data: a regular
        file it lists (unseen, same size and mode; one over
        :data:`_BUFFERED_FILE` streams to disk), a directory it implies, and a
        format-2 layer's family directory and tree document (the record's own
        bytes). A block of zeros ends the archive, as it ends tarfile's reading
        (:attr:`ended`). It stops at the first other member and leaves the
        stream at its header for tarfile, which reads it (extended and GNU
        headers, a global header's effect on every member after it, links,
        anything malformed) as it always did. True when it took at least one
        member. ``tar``: tarfile's reader, once one was needed: its offset
        follows the members taken here.
        """
        if tar is not None and (
            # A global header applies to every member after it; tarfile may have read
            # past its offset (an empty archive) or the data may end before it.
            tar.pax_headers or plain.tell() > tar.offset or plain.seek(tar.offset) != tar.offset
        ):
            return False
        took = self._scan(plain, lead)
        if tar is not None:
            tar.offset = plain.tell()
        return took

    def _scan(self, plain: _Bounded, lead: str) -> bool:
        cut = len(lead)
        files, dirs, seen = self.fast_files, self.record_dirs, self.seen
        took = False
        while True:
            block = plain.peek(_BLOCK)
            header = _plain_header(block) if len(block) == _BLOCK else None
            if header is not None:
                name, kind, mode, size = header
                head = _BLOCK
            elif block == _END_BLOCK:
                plain.skip(_BLOCK)
                self.ended = True
                return took
            else:
                long = _long_named(plain, block)  # a name too long for the ustar field
                if long is None:
                    return took
                name, kind, mode, size, head = long
            if not name.startswith(lead):
                if not lead or name != lead[:-1] or kind != _DIRTYPE or mode != 0o755:
                    return took
                plain.skip(head)  # a format-2 layer's family directory
                took = True
                continue
            name = name[cut:]
            if kind == _DIRTYPE:
                if mode != 0o755 or name not in dirs:
                    return took
                plain.skip(head)  # tarfile reads no data after a directory, whatever its size
                took = True
                continue
            padded = -(-size // _BLOCK) * _BLOCK  # _round, inline: this loop runs per file
            entry = files.get(name)
            if entry is None or size != entry.size or mode != entry.mode or name in seen:
                if not self._scan_other(plain, name, mode, size, padded, head):
                    return took
                took = True
                continue
            seen.add(name)
            data = plain.member(size, padded, head)
            took = True
            self._accept(name, entry, data)

    def _scan_other(  # noqa: PLR0917 - the member _scan read, passed on as it read it
        self, plain: _Bounded, name: str, mode: int, size: int, padded: int, head: int
    ) -> bool:
        """Take a regular file :meth:`_scan` did not: a large listed one, or the tree document.

        False (nothing consumed) for anything else.
        """
        if name == TREE_DOC and self.tree is not None:
            if self.tree_seen or mode != 0o644 or size != len(self.tree_doc):
                return False
            if plain.peek(head + size)[head:] != self.tree_doc:
                return False  # tarfile's path parses it, and explains how it differs
            plain.member(size, padded, head)
            self.tree_seen = True
            return True
        entry = self.expected.get(name)
        if (
            entry is None
            or entry.size <= _BUFFERED_FILE
            or entry.rewrite
            or entry.link is not None
            or size != entry.size
            or mode != entry.mode
            or name in self.seen
        ):
            return False
        self.seen.add(name)
        plain.skip(head)
        self.file(name, entry, _Span(plain, size))  # its data lies next in the stream
        plain.pad(padded - size)
        return True

    def fast(self, tar: tarfile.TarFile, member: tarfile.TarInfo, lead: str) -> bool:
        """Take ``member`` on the tight path if the record already vouches for it.

        True when it was handled: a regular file the record lists (unseen, same
        size and mode), or a directory the record implies (already made). False
        sends it through the full check.
        """
        name = member.name
        if lead:
            if not name.startswith(lead):
                return False
            name = name[len(lead) :]
        kind = member.type
        if kind == _DIRTYPE:
            return member.mode == 0o755 and name.rstrip("/") in self.record_dirs
        if kind not in _REGTYPES:
            return False
        entry = self.fast_files.get(name)
        if (
            entry is None
            or member.size != entry.size
            or member.mode != entry.mode
            or member.sparse is not None
            or name in self.seen
        ):
            return False
        self.seen.add(name)
        # Straight from the tar stream: tarfile skips to the next header itself.
        stream = tar.fileobj
        data = stream.read(entry.size) if entry.size and stream is not None else b""
        if len(data) != entry.size:
            raise _TruncatedError("unexpected end of data")
        self._accept(name, entry, data)
        return True

    def _accept(self, name: str, entry: FileEntry, data: bytes | memoryview) -> None:
        """Verify a small file's bytes, rewrite them if marked, and batch its write.

        A file that is rewritten is hashed here (the rewrite reads verified
        bytes only); any other is hashed by the writer thread, before it
        creates the file, and a mismatch fails the extraction at the next
        hand-over or at the end.
        """
        self.total += entry.size
        if len(data) != entry.size:
            raise IntegrityError(f"{entry.path}: content does not match its sha256")
        relocate = self.relocate if entry.rewrite else None
        if relocate is not None:
            if self.sha256(data).hexdigest() != entry.sha256:
                raise IntegrityError(f"{entry.path}: content does not match its sha256")
            try:
                data = relocate(entry.path, bytes(data))
            except (ValueError, UnicodeError) as exc:  # JSONDecodeError is a ValueError
                raise IntegrityError(
                    f"{entry.path}: marked for path rewriting but cannot be rewritten "
                    f"({type(exc).__name__}: {str(exc)[:80]})"
                ) from None
        self._batch.append((f"{self.root}/{name}", data, entry, relocate is None))
        self._batch_bytes += len(data)
        if type(data) is memoryview and data.obj is not self._pinned:
            # A view keeps its whole buffer (up to 4 MiB) alive until written: the
            # budget counts the buffer, so small files between large ones cannot
            # hold more memory than it allows.
            self._pinned = data.obj
            self._pinned_bytes += memoryview(data.obj).nbytes
        if len(self._batch) >= _BATCH_FILES or self._batch_bytes >= _BATCH_BYTES:
            self._flush()

    def unprefixed(
        self, tar: tarfile.TarFile, member: tarfile.TarInfo, prefix: str
    ) -> tarfile.TarInfo | None:
        """Format 2: strip ``prefix/`` from a member's name; None for the prefix dir and the doc.

        Anything outside the family directory is refused; the tree document is
        read (at most its limit), parsed and compared with the record.
        """
        name = member.name.rstrip("/")
        if name == prefix:
            if not member.isdir() or member.mode & 0o7777 != 0o755:
                raise UnsafeArtifactError(
                    f"member {name!r} (the family directory) is not a directory of mode 0755"
                )
            return None
        if name == f"{prefix}/{TREE_DOC}":
            self._tree_member(tar, member, name)
            return None
        if not name.startswith(prefix + "/"):
            raise UnsafeArtifactError(
                f"member {name!r} is outside the layer's family directory {prefix}/"
            )
        member.name = name[len(prefix) + 1 :]
        return member

    def _tree_member(self, tar: tarfile.TarFile, member: tarfile.TarInfo, name: str) -> None:
        if self.tree is None or self.tree_seen:
            raise UnsafeArtifactError(f"member {name!r} appears twice or is not expected")
        if not member.isreg() or member.mode & 0o7777 != 0o644:
            raise UnsafeArtifactError(f"member {name!r} is not a regular file of mode 0644")
        if member.size > self.tree_limit:
            raise IntegrityError(f"{name}: {member.size} bytes, more than its record allows")
        src = tar.extractfile(member)
        if src is None:  # pragma: no cover - a regular member always has a data stream
            raise IntegrityError(f"member {name!r} has no data")
        data = src.read()
        # The packer writes the canonical form: equal bytes need no parse (a
        # tenth of a second per 10,000 files); any other bytes are parsed and compared.
        if data == self.tree_doc:
            self.tree_seen = True
            return
        # lazy: only a document written otherwise than canonically is parsed, by the model
        from artifactd.format.config import FamilyTree  # noqa: PLC0415

        found = FamilyTree.from_json(data, source=name)
        if found.canonical() != self.tree_doc:
            raise IntegrityError(
                f"{name} differs from the artifact config's record of the layer",
                hint="the layer and its config were not written together",
            )
        self.tree_seen = True

    def member(self, tar: tarfile.TarFile, member: tarfile.TarInfo, name: str) -> None:
        """Check one member (``name``: :func:`check_member`'s) against the record; write it."""
        if member.isdir():
            self.mkdirs(name)
            return
        entry = self.claim(name)
        if member.issym():
            self.link(name, entry, member.linkname)
            return
        _match_file(member, entry)
        plain = tar.fileobj
        if (
            entry.size > _BUFFERED_FILE
            and not entry.rewrite
            and member.sparse is None
            and isinstance(plain, _Bounded)
            and plain.tell() == member.offset_data
        ):
            # Its data lies next in the stream: read in place (tarfile skips the padding).
            self.file(name, entry, _Span(plain, entry.size))
            return
        src = tar.extractfile(member)
        if src is None:  # pragma: no cover - a regular member always has a data stream
            raise IntegrityError(f"member {entry.path!r} has no data")
        self.file(name, entry, src)

    def claim(self, name: str) -> FileEntry:
        """Return the record's entry for ``name``; refuse unlisted and repeated paths."""
        entry = self.expected.get(name)
        if entry is None:
            raise UnsafeArtifactError(f"member {name!r} is not in the manifest")
        if name in self.seen:
            raise UnsafeArtifactError(f"member {name!r} appears twice")
        self.seen.add(name)
        return entry

    def link(self, name: str, entry: FileEntry, target: str) -> None:
        """Record a symlink to create once every file is written."""
        if entry.link != target:
            raise IntegrityError(f"symlink {entry.path!r} differs from the manifest")
        # Created after every file: no later member can write through a link.
        self.links.append((name, target))

    def file(self, name: str, entry: FileEntry, src: Readable | _Span) -> None:
        """Verify a file's bytes (of the size its entry says) and queue or stream its write."""
        parent = name.rpartition("/")[0]
        if parent not in self.dirs:
            self.mkdirs(parent)
        if entry.size > _BUFFERED_FILE and not entry.rewrite:
            self.total += entry.size
            _stream_member(
                src,
                f"{self.root}/{name}",
                entry,
                self.keep_mtimes,
                self.umask,
                piece=_SPAN_PIECE if isinstance(src, _Span) else _STREAM_CHUNK,
            )
            return
        self._accept(name, entry, bytes(src.read(entry.size + 1)))

    def finish(self, digest: str, components: frozenset[str]) -> UnpackResult:
        """Wait for the writers, create the symlinks, and check the staged tree is complete."""
        self.close()
        if self.tree is not None and not self.tree_seen:
            raise IntegrityError(f"layer {digest} lacks its tree document ({self.tree}/{TREE_DOC})")
        missing = sorted(set(self.expected) - self.seen)
        if missing:
            raise IntegrityError(
                f"layer {digest} lacks {len(missing)} listed file(s), e.g. {missing[0]}"
            )
        for name, target in self.links:
            self.mkdirs(name.rpartition("/")[0])
            try:
                os.symlink(target, f"{self.root}/{name}")
            except FileExistsError as exc:
                raise UnsafeArtifactError(
                    f"symlink {name.rpartition('/')[2]}: collides with a member"
                ) from exc
        # The lexical check cannot see through links to links (cache/y -> ., then
        # cache/b -> y/y/../..): resolve every link now that all exist. Nothing was
        # written through any of them, so refusing here still loses nothing.
        for name, target in self.links:
            root = os.path.realpath(f"{self.root}/{name.partition('/')[0]}")
            real = os.path.realpath(f"{self.root}/{name}")
            if real != root and not real.startswith(root + os.sep):
                raise UnsafeArtifactError(
                    f"symlink {name.rpartition('/')[2]} -> {target} resolves outside root"
                )
        for comp in sorted(components):
            try:
                is_dir = stat.S_ISDIR(os.lstat(f"{self.root}/{comp}").st_mode)
            except FileNotFoundError:
                is_dir = False
            if not is_dir:
                raise IntegrityError(
                    f"layer {digest} declares component {comp!r} but carries no directory for it",
                    hint="every packed component has a directory member, even when empty",
                )
        return UnpackResult(files=len(self.seen), bytes=self.total)


def _match_file(member: tarfile.TarInfo, entry: FileEntry) -> None:
    """Check a regular-file member's header against its record entry."""
    if entry.link is not None:
        raise IntegrityError(f"{entry.path!r} is a symlink in the manifest, a file in the layer")
    if member.size != entry.size:
        raise IntegrityError(f"{entry.path}: size {member.size} differs from manifest {entry.size}")
    if member.mode & 0o7777 != entry.mode:
        raise IntegrityError(
            f"{entry.path}: mode {member.mode & 0o7777:04o} differs from manifest {entry.mode:04o}"
        )


def unpack_layer(
    blob: Readable,
    *,
    digest: str,
    size: int,
    entries: Sequence[FileEntry],
    staging: StrPath,
    components: frozenset[str],
    max_tar_bytes: int | None = None,
    relocate: Callable[[str, bytes], bytes] | None = None,
    keep_mtimes: bool = False,
    record: LayerRecord | None = None,
    prefix: str | None = None,
) -> UnpackResult:
    """Verify and extract one layer stream into ``staging``.

    A format-2 layer gives its family directory as ``prefix`` and its
    ``record``: members must lie under ``prefix/`` (which is stripped) and the
    tree document must equal the record's
    (:func:`~artifactd.format.views.tree_document`). ``max_tar_bytes`` comes from
    :func:`check_layer` (default: :func:`tar_bound` of ``entries``); a format-2
    layer's tree document adds its own share. ``relocate(member_path,
    data)`` rewrites files the record marks with ``rewrite``. Raises
    :class:`IntegrityError` (digest, size, file hash or record mismatch),
    :class:`UnsafeArtifactError`, or ``OSError`` from the filesystem (a full
    disk); on error the caller discards ``staging``, which is the only place
    anything was written.
    """
    if prefix is not None and record is None:
        raise ValueError("a format-2 layer (prefix) needs its record")
    lead = f"{prefix}/" if prefix is not None else ""
    # The blob's digest and size are checked once, where its bytes arrive: by
    # the source's own verifier (a registry's), else by one made here.
    verifier = verifier_of(blob)
    if verifier is None or not verifier.checks(digest, size):
        blob = verifier = DigestReader(blob, digest, size, what="layer")
    dctx = ZstdDecompressor(max_window_size=MAX_ZSTD_WINDOW)
    zstd = dctx.stream_reader(blob, read_size=_AHEAD_CHUNK, closefd=False)  # type: ignore[arg-type]
    with zstd:
        # Download and decompression run on the read-ahead thread (zstd releases
        # the GIL), from here on: the link works while this thread checks the
        # record's names and makes its directories, then parses, verifies and
        # hands files to the writers. Nothing is written before the record is checked.
        ahead = _ReadAhead(zstd, tail=lambda stopped: _drain(blob, stopped))
        extractor: _Extractor | None = None
        try:
            extractor, max_tar_bytes = _extractor_for(
                staging,
                entries,
                relocate,
                keep_mtimes,
                components=components,
                record=record,
                prefix=prefix,
                max_tar_bytes=max_tar_bytes,
            )
            extractor.prepare()
            _extract(
                ahead,
                extractor,
                digest=digest,
                components=components,
                max_tar_bytes=max_tar_bytes,
                prefix=prefix,
                lead=lead,
            )
            ahead.close()  # nothing reads the blob once this returns
            if not verifier.verified:  # pragma: no cover - the tail reads to the end, or raises
                raise IntegrityError(f"layer {digest}: the blob was not read to its end")
            return extractor.finish(digest, components)
        finally:
            ahead.close()
            # On any error, no writer thread may still be writing when the caller
            # discards staging; on success this is a no-op (finish already waited).
            if extractor is not None:
                extractor.abort()


def _extractor_for(
    staging: StrPath,
    entries: Sequence[FileEntry],
    relocate: Callable[[str, bytes], bytes] | None,
    keep_mtimes: bool,
    *,
    components: frozenset[str],
    record: LayerRecord | None,
    prefix: str | None,
    max_tar_bytes: int | None,
) -> tuple[_Extractor, int]:
    """Return the extractor of one layer and the most bytes its tar stream may decompress to.

    A format-2 layer (``prefix``) carries its tree document: the extractor
    expects it equal to the record's, and the bound grows by its share.
    """
    tree: str | None = None
    limit = 0
    doc = b""
    if record is not None and prefix is not None:
        tree = record.family
        doc = tree_document(record)
        limit = _doc_limit(doc)
    extractor = _Extractor(
        staging,
        entries,
        relocate,
        keep_mtimes,
        components=components,
        tree=tree,
        tree_limit=limit,
        tree_doc=doc,
    )
    if max_tar_bytes is None:
        max_tar_bytes = tar_bound(entries, components, prefix=prefix)
    if prefix is not None:  # the tree document's share: from the document itself
        max_tar_bytes += _round(limit) + 2 * _header_bound(f"{prefix}/{TREE_DOC}")
    return extractor, max_tar_bytes


def _extract(
    ahead: _ReadAhead,
    extractor: _Extractor,
    *,
    digest: str,
    components: frozenset[str],
    max_tar_bytes: int,
    prefix: str | None,
    lead: str,
) -> None:
    """Read the tar stream's members into ``extractor``, tar and zstd errors made the format's.

    :meth:`_Extractor.scan` reads a layer as artifactd packs it, to its end;
    tarfile reads the members it leaves (:func:`_extract_rest`), so a layer
    that is plain throughout never imports tarfile.
    """
    try:
        plain = _Bounded(ahead, max_tar_bytes, digest)
        extractor.scan(plain, lead)
        if not extractor.ended:
            _extract_rest(
                plain, extractor, digest=digest, components=components, prefix=prefix, lead=lead
            )
        # Nothing is read past the end-of-archive marker; hash whatever follows too.
        while plain.read(_CHUNK):
            pass
    except _TruncatedError as exc:
        raise _not_tar(digest, exc) from exc
    except ZstdError as exc:
        raise IntegrityError(f"layer {digest} is not valid zstd data: {exc}") from exc
    except UnicodeError as exc:
        raise UnsafeArtifactError(f"layer {digest} has a member name that is not UTF-8") from exc


def _not_tar(digest: str, exc: Exception) -> IntegrityError:
    return IntegrityError(f"layer {digest} is not a valid tar stream: {exc}")


def _extract_rest(
    plain: _Bounded,
    extractor: _Extractor,
    *,
    digest: str,
    components: frozenset[str],
    prefix: str | None,
    lead: str,
) -> None:
    """Read the members :meth:`_Extractor.scan` left with tarfile, from where the scan stopped.

    Every member tarfile reads is checked in full (:func:`check_member`), and
    :meth:`_Extractor.scan` takes over again after each one.
    """
    import tarfile  # noqa: PLC0415  # lazy: a layer as artifactd packs it never needs it

    try:
        # Not mode "r|": tarfile's stream would buffer ahead of what it parsed.
        with tarfile.TarFile(fileobj=plain) as tar:  # type: ignore[arg-type]
            first = True  # tarfile read the first header when it opened: it hands it out next
            while not extractor.ended:
                if not first and extractor.scan(plain, lead, tar):
                    continue
                first = False
                raw = tar.next()
                if raw is None:
                    break
                if extractor.fast(tar, raw, lead):
                    continue
                member = raw if prefix is None else extractor.unprefixed(tar, raw, prefix)
                if member is not None:
                    extractor.member(tar, member, check_member(member, components))
    except tarfile.TarError as exc:
        raise _not_tar(digest, exc) from exc


def _drain(blob: Readable, stopped: Callable[[], bool]) -> None:
    """Read the blob past the zstd frame's end, to the verdict of its verifier.

    Runs on the read-ahead thread after the frame's last byte; a blob longer
    than its size is refused by the first read past it. Ends early when the
    extractor has stopped (it failed), which reads no verdict.
    """
    while not stopped():
        if not blob.read(_CHUNK):
            return


def stage_tree(
    source: Path,
    record: LayerRecord,
    staging: StrPath,
    *,
    relocate: Callable[[str, bytes], bytes] | None = None,
    keep_mtimes: bool = False,
) -> UnpackResult:
    """Verify and copy one family directory of an unpacked artifact into ``staging``.

    ``source`` is ``<family>/`` of a tree a container runtime unpacked (an
    image volume, a derived image): its components hold exactly the record's
    files. The same rules as a layer's members apply (the caller has run
    :func:`check_layer` on ``record``): the tree is walked without following
    links, and anything the record does not list (a file, a link, a device, a
    component it does not declare) is refused; every listed file must be a
    regular file of the listed size and sha256, every link must have the
    listed target. Each file is opened with
    :func:`~artifactd.fsutil.open_regular` and must still be the one the walk
    saw, so a FIFO or device swapped in meanwhile is refused, never read.
    Errors reading the source are the source's
    (:func:`source_error`), never the target's. Only
    ``staging`` is written.
    """
    components = frozenset(record.components)
    try:
        found = _scan_family_dir(source, components)
    except OSError as exc:
        raise source_error(exc, source.parent) from None
    extractor = _Extractor(staging, record.files, relocate, keep_mtimes, components=components)
    try:
        extractor.prepare()
        for rel, (kind, st) in sorted(found.items()):
            name = rel.as_posix()
            if kind == "dir":
                extractor.mkdirs(name)
                continue
            entry = extractor.claim(name)
            path = source.joinpath(*rel.parts)
            if kind == "link":
                if entry.link is None:
                    raise IntegrityError(f"{entry.path!r} is a file in the manifest, a link here")
                try:
                    target = os.readlink(path)
                except OSError as exc:
                    raise source_error(exc, source.parent) from None
                extractor.link(name, entry, target)
                continue
            if entry.link is not None:
                raise IntegrityError(f"{entry.path!r} is a symlink in the manifest, a file here")
            if st.st_size != entry.size:
                raise IntegrityError(
                    f"{entry.path}: size {st.st_size} differs from manifest {entry.size}"
                )
            # What the scan saw may have been swapped since (for a FIFO, which
            # would block the copy): the open descriptor is what is checked.
            try:
                src = open_regular(path, expect=st)
            except OSError as exc:
                raise source_error(exc, source.parent) from None
            with src:
                extractor.file(name, entry, _SourceReader(src, path, source.parent))
        return extractor.finish(str(source), components)
    finally:
        extractor.abort()


def source_error(exc: OSError, root: Path) -> ArtifactdError:
    """Classify an error reading a mounted artifact under ``root``: the source is at fault.

    A FIFO, device, socket or link where a file belongs is hostile; a file over
    its limit is corrupt; anything that cannot be read (permissions, I/O
    errors, a vanished mount) leaves the source unreachable. Never a
    :class:`~artifactd.errors.TargetError`: the target was not touched.
    """
    what = (
        str(exc)
        if isinstance(exc, InputFileError)
        else (f"{exc.filename or root} cannot be read ({exc.strerror or exc})")
    )
    reason = exc.reason if isinstance(exc, InputFileError) else "unreadable"
    if reason == "not_regular":
        return UnsafeArtifactError(f"the mounted artifact's {what}")
    if reason in ("too_large", "missing"):
        return IntegrityError(f"the mounted artifact's {what}")
    return StoreError(
        f"the mounted artifact at {root} is unreadable: {what}",
        hint="check the volume mounted there (--from-dir) and that the init container's "
        "user may read it",
    )


class _SourceReader:
    """A mounted artifact's file whose read errors are the source's, not the target's."""

    def __init__(self, handle: IO[bytes], path: Path, root: Path) -> None:
        self._handle = handle
        self._path = path
        self._root = root

    def read(self, n: int = -1, /) -> bytes:
        """Read up to ``n`` bytes."""
        try:
            return self._handle.read(n)
        except OSError as exc:
            if exc.filename is None:
                exc.filename = str(self._path)
            raise source_error(exc, self._root) from None


def _scan_family_dir(
    source: Path, components: frozenset[str]
) -> dict[PurePosixPath, tuple[str, os.stat_result]]:
    """Every entry under ``source``'s components, by relative path: ("dir"|"file"|"link", lstat).

    Never follows a link. Refuses an entry that is neither a directory, a
    regular file nor a symlink, and anything in ``source`` but the declared
    components and the tree document. Raises ``OSError`` when ``source``
    cannot be read (the caller blames the source for it).
    """
    from pathlib import PurePosixPath  # noqa: PLC0415  # lazy: only a mounted artifact's walk

    found: dict[PurePosixPath, tuple[str, os.stat_result]] = {}
    with os.scandir(source) as it:
        top = {e.name: e for e in it}
    extra = sorted(set(top) - components - {TREE_DOC})
    if extra:
        raise UnsafeArtifactError(f"{source} holds {extra[0]!r}, which its record does not list")
    todo: list[tuple[PurePosixPath, os.DirEntry[str]]] = [
        (PurePosixPath(name), top[name]) for name in sorted(components) if name in top
    ]
    while todo:
        rel, entry = todo.pop()
        st = entry.stat(follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            found[rel] = ("link", st)
        elif stat.S_ISREG(st.st_mode):
            found[rel] = ("file", st)
        elif stat.S_ISDIR(st.st_mode):
            found[rel] = ("dir", st)
            with os.scandir(entry.path) as it:
                todo.extend((rel / child.name, child) for child in it)
        else:
            raise UnsafeArtifactError(
                f"{source / str(rel)} is {file_kind(st.st_mode)}, not a file, link or directory"
            )
        check_name(rel.as_posix(), components)
    return found


def current_umask() -> int:
    """Return the process umask without changing it; 0o777 when unknown.

    ``os.umask`` sets while it reads, which would race with our own writer
    threads. With an unknown umask every mode is set explicitly.
    """
    try:
        with open("/proc/self/status", "rb") as f:  # bytes: a text file loads its codec
            for line in f:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o777


def _mkdir_checked(path: str, umask: int) -> None:
    """Create one directory, refusing to pass through anything but a real directory."""
    try:
        os.mkdir(path, 0o755)
    except FileExistsError:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            raise UnsafeArtifactError(
                f"{path.rpartition('/')[2]} collides with a member that is not a directory"
            ) from None
    except NotADirectoryError:
        raise UnsafeArtifactError(
            f"{path.rpartition('/')[2]}: a parent collides with a member that is not a directory"
        ) from None
    else:
        if umask & 0o755:  # the umask took bits away: put them back
            os.chmod(path, 0o755)  # noqa: S103 - cache dirs are world-readable by design


#: How every file is created: new (never through an existing file or a link), write-only.
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)


def _create(dest: str, entry: FileEntry, umask: int) -> int:
    mode = entry.mode & 0o777
    try:
        fd = os.open(dest, _CREATE_FLAGS, mode)
    except (FileExistsError, IsADirectoryError, NotADirectoryError) as exc:
        raise UnsafeArtifactError(
            # Writer threads race dir and file creation: whichever side loses
            # reports the same collision, so the message does not depend on timing.
            f"{entry.path}: collides with another member (one of them is not a directory)"
        ) from exc
    if umask & mode:
        try:
            os.fchmod(fd, mode)  # the manifest's mode, whatever the umask
        except OSError:
            os.close(fd)
            raise
    return fd


def _write_small(
    dest: str, data: bytes | memoryview, entry: FileEntry, keep_mtimes: bool, umask: int
) -> None:
    """Write an already verified file (runs on a writer thread)."""
    fd = _create(dest, entry, umask)
    try:
        written = os.write(fd, data) if data else 0
        if written < len(data):  # a short write: rare, so its loop is only entered then
            view = memoryview(data)[written:]
            while view:
                view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
    if keep_mtimes and entry.mtime is not None:
        os.utime(dest, (entry.mtime, entry.mtime))


def _stream_member(
    src: Readable | _Span,
    dest: str,
    entry: FileEntry,
    keep_mtimes: bool,
    umask: int,
    *,
    piece: int = _STREAM_CHUNK,
) -> None:
    """Stream a large file to disk, hashing as it goes.

    Two stages overlap: this thread reads the next piece (``piece`` bytes)
    while one helper thread hashes and writes the previous ones, in order.
    Hashing and writing release the GIL; on the CPU demo's 149 MiB Inductor
    header, ``bench/unpack.py`` measured 0.93 s serial and 0.44 s overlapped
    (median of 5). At most :data:`_STREAM_AHEAD` pieces wait, so memory stays
    bounded; a write error (a full disk) surfaces on this thread, and on any
    error the helper is stopped before the file is closed.
    """
    fd = _create(dest, entry, umask)
    copied = Hasher()
    kicked = 0  # bytes the kernel was asked to start writing back

    def put(data: bytes | memoryview) -> None:
        nonlocal kicked
        copied.update(data)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if copied.size - kicked >= _WRITEBACK:
            # The install syncs before its commit: started now, the disk writes this
            # run while the rest decompresses, and the sync waits for the tail only
            # (the CPU demo's 156 MB header: an install of 0.07-0.09 s, mostly that wait).
            start_writeback(fd, kicked, copied.size - kicked)
            kicked = copied.size

    pending: deque[Job[None]] = deque()
    pool = Pool(1, "stream")
    try:
        while data := src.read(piece):
            pending.append(pool.submit(put, data))
            if len(pending) > _STREAM_AHEAD:
                pending.popleft().result()  # a write error (a full disk) surfaces here
        while pending:
            pending.popleft().result()
    finally:
        for job in pending:
            job.cancel()
        pool.shutdown(wait=True)  # nothing writes to fd once it is closed
        os.close(fd)
    if copied.size != entry.size or copied.hex != entry.sha256:
        raise IntegrityError(f"{entry.path}: content does not match its sha256")
    if keep_mtimes and entry.mtime is not None:
        os.utime(dest, (entry.mtime, entry.mtime))
