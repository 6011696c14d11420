"""Reproducible family layers: pack a cache tree into a tar.zst, unpack one safely.

Packing walks each component root in sorted order, leaves out what the family
excludes, and writes a POSIX tar with uid/gid 0, no user names and a fixed
mtime (unless the family keeps mtimes), compressed with zstd. Packing the same
tree twice gives the same bytes, so the registry stores identical content once.
Each file is hashed while it is copied into the tar.

Unpacking is the dangerous half. It fails closed: every member is checked
before anything is written (no absolute paths, no ``..``, no devices, fifos or
hard links, no setuid/setgid, no symlink leaving its root, nothing the manifest
does not list), files are created with ``O_EXCL | O_NOFOLLOW`` under a staging
root, symlinks are created last so no member can write through one, and the
layer digest and every file digest are verified. Callers install from staging
only after :func:`unpack_layer` returns.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import tarfile
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Protocol

import zstandard

from artifactd.errors import IntegrityError, UnsafeArtifactError
from artifactd.families.base import Family, Located
from artifactd.manifest import FileEntry, SkippedEntry

#: mtime written for every member of families that do not keep mtimes.
FIXED_MTIME = 0
ZSTD_LEVEL = 6
_CHUNK = 1 << 20


class Readable(Protocol):
    """Anything with ``read(n)``: a file, an HTTP body, a progress wrapper."""

    def read(self, n: int = -1, /) -> bytes:
        """Return up to ``n`` bytes; b"" at the end."""
        ...


class _HashingWriter:
    """A write-only file object that hashes and counts what passes through."""

    def __init__(self, sink: IO[bytes]) -> None:
        self._sink = sink
        self.sha = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += len(data)
        return self._sink.write(data)

    def flush(self) -> None:
        self._sink.flush()


class _HashingReader:
    """A read-only file object that hashes and counts what is read from it."""

    def __init__(self, source: Readable) -> None:
        self._source = source
        self.sha = hashlib.sha256()
        self.size = 0

    def read(self, n: int = -1) -> bytes:
        data = self._source.read(n)
        self.sha.update(data)
        self.size += len(data)
        return data

    def readinto(self, buf: bytearray | memoryview) -> int:
        data = self.read(len(buf))
        buf[: len(data)] = data
        return len(data)

    def drain(self) -> None:
        while self.read(_CHUNK):
            pass


@dataclass
class PackedLayer:
    """The result of packing one family."""

    path: Path
    digest: str
    size: int
    diff_id: str
    files: list[FileEntry]
    skipped: list[SkippedEntry] = field(default_factory=list)
    pinned: list[str] = field(default_factory=list)

    @property
    def unpacked_size(self) -> int:
        """Sum of the sizes of the files in the layer."""
        return sum(f.size for f in self.files)


def _walk(root: Path) -> Iterator[tuple[PurePosixPath, os.stat_result]]:
    """Yield (relative path, lstat) for everything under ``root``, sorted, dirs first."""
    stack = [PurePosixPath()]
    while stack:
        rel = stack.pop()
        try:
            names = sorted(os.listdir(root / rel))
        except OSError:
            continue
        subdirs = []
        for name in names:
            child = rel / name
            try:
                st = os.lstat(root / child)
            except OSError:
                continue  # vanished while we walked: a concurrent writer's temp file
            yield child, st
            if stat.S_ISDIR(st.st_mode):
                subdirs.append(child)
        stack.extend(reversed(subdirs))


def _norm_mode(st_mode: int) -> int:
    return 0o755 if st_mode & 0o111 else 0o644


def _link_inside(rel: PurePosixPath, target: str) -> bool:
    """Whether a symlink at ``rel`` pointing to ``target`` stays inside its root."""
    if not target or target.startswith("/"):
        return False
    depth = len(rel.parent.parts)
    for part in PurePosixPath(target).parts:
        if part == "..":
            depth -= 1
            if depth < 0:
                return False
        elif part != ".":
            depth += 1
    return True


def pack_family(family: Family, located: list[Located], out: Path) -> PackedLayer:
    """Pack the located components of ``family`` into ``out`` (a .tar.zst file).

    Members are named ``<component>/<relative path>``. Files the family marks as
    path-bearing are stored with their root replaced by a placeholder.
    """
    files: list[FileEntry] = []
    skipped: list[SkippedEntry] = []
    pinned = sorted(
        {p for loc in located for p in family.pinned_paths(loc.component.name, loc.path)}
    )
    cctx = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    with out.open("wb") as raw:
        compressed = _HashingWriter(raw)
        with cctx.stream_writer(compressed, closefd=False) as zw:  # type: ignore[arg-type]
            plain = _HashingWriter(zw)
            with tarfile.open(fileobj=plain, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
                for loc in sorted(located, key=lambda item: item.component.name):
                    _pack_component(family, loc, tar, files, skipped)
        diff_id = "sha256:" + plain.sha.hexdigest()
    return PackedLayer(
        path=out,
        digest="sha256:" + compressed.sha.hexdigest(),
        size=compressed.size,
        diff_id=diff_id,
        files=files,
        skipped=skipped,
        pinned=pinned,
    )


def _tarinfo(name: str, kind: bytes, mode: int, mtime: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.mtime = mtime
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _skip_reason(
    family: Family,
    comp: str,
    *,
    rel: PurePosixPath,
    is_dir: bool,
    invalid: dict[PurePosixPath, str],
    name: str,
) -> str | None:
    """Why a path stays out of the layer, or None to pack it."""
    if rel in invalid:
        return invalid[rel]
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "file name is not valid UTF-8"  # not representable in tar or JSON config
    if family.excluded(comp, rel, is_dir):
        return "excluded by family"
    return None


def _pack_component(
    family: Family,
    loc: Located,
    tar: tarfile.TarFile,
    files: list[FileEntry],
    skipped: list[SkippedEntry],
) -> None:
    comp = loc.component.name
    root = loc.path
    roots = tuple(dict.fromkeys([str(root.absolute()), os.path.realpath(root)]))
    tar.addfile(_tarinfo(comp, tarfile.DIRTYPE, 0o755, FIXED_MTIME))
    pruned: list[PurePosixPath] = []
    invalid = family.invalid_entries(comp, root)
    for rel, st in _walk(root):
        if any(rel.is_relative_to(p) for p in pruned):
            continue
        is_dir = stat.S_ISDIR(st.st_mode)
        name = f"{comp}/{rel.as_posix()}"
        reason = _skip_reason(family, comp, rel=rel, is_dir=is_dir, invalid=invalid, name=name)
        if reason is not None:
            if is_dir:
                pruned.append(rel)
            skipped.append(
                SkippedEntry(path=name.encode("utf-8", "replace").decode(), reason=reason)
            )
            continue
        mtime = int(st.st_mtime) if family.keep_mtimes else FIXED_MTIME
        if is_dir:
            tar.addfile(_tarinfo(name, tarfile.DIRTYPE, 0o755, mtime))
        elif stat.S_ISLNK(st.st_mode):
            target = os.readlink(root / rel)
            if not _link_inside(rel, target):
                skipped.append(SkippedEntry(path=name, reason=f"symlink leaves root: {target}"))
                continue
            info = _tarinfo(name, tarfile.SYMTYPE, 0o777, mtime)
            info.linkname = target
            tar.addfile(info)
            files.append(
                FileEntry(
                    path=name,
                    size=0,
                    sha256=hashlib.sha256(b"").hexdigest(),
                    mode=0o777,
                    mtime=None,
                    link=target,
                )
            )
        elif stat.S_ISREG(st.st_mode):
            _pack_file(
                family=family,
                comp=comp,
                rel=rel,
                path=root / rel,
                st=st,
                roots=roots,
                mtime=mtime,
                name=name,
                tar=tar,
                files=files,
            )
        else:
            skipped.append(SkippedEntry(path=name, reason="not a regular file"))


def _pack_file(
    *,
    family: Family,
    comp: str,
    rel: PurePosixPath,
    path: Path,
    st: os.stat_result,
    roots: tuple[str, ...],
    mtime: int,
    name: str,
    tar: tarfile.TarFile,
    files: list[FileEntry],
) -> None:
    mode = _norm_mode(st.st_mode)
    rewrite = family.path_bearing(comp, rel)
    info = _tarinfo(name, tarfile.REGTYPE, mode, mtime)
    if rewrite:
        data = family.normalize(path.read_bytes(), roots)
        info.size = len(data)
        sha = hashlib.sha256(data).hexdigest()
        tar.addfile(info, io.BytesIO(data))
    else:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            info.size = size
            reader = _HashingReader(f)
            tar.addfile(info, reader)
            if reader.size != size:
                raise IntegrityError(f"{path} changed size while it was packed")
            sha = reader.sha.hexdigest()
    files.append(
        FileEntry(
            path=name,
            size=info.size,
            sha256=sha,
            mode=mode,
            mtime=mtime if family.keep_mtimes else None,
            rewrite=rewrite,
        )
    )


# --------------------------------------------------------------------------
# Unpacking
# --------------------------------------------------------------------------


def check_member_name(name: str, components: frozenset[str]) -> PurePosixPath:
    """Return the member's relative path, or raise :class:`UnsafeArtifactError`."""
    if not name or "\x00" in name or "\\" in name:
        raise UnsafeArtifactError(f"member name {name!r} is empty or has forbidden characters")
    path = PurePosixPath(name)
    if path.is_absolute():
        raise UnsafeArtifactError(f"member {name!r} has an absolute path")
    if any(part in ("..", ".") for part in path.parts) or name.startswith("./"):
        raise UnsafeArtifactError(f"member {name!r} has a '.' or '..' component")
    if path.parts[0] not in components:
        raise UnsafeArtifactError(f"member {name!r} is outside the layer's components")
    return path


def check_member(member: tarfile.TarInfo, components: frozenset[str]) -> PurePosixPath:
    """Validate one tar member fully (name, type, mode, link target)."""
    path = check_member_name(member.name.rstrip("/"), components)
    if member.isdev() or member.isfifo():
        raise UnsafeArtifactError(f"member {member.name!r} is a device or fifo")
    if member.islnk():
        raise UnsafeArtifactError(f"member {member.name!r} is a hard link")
    if not (member.isreg() or member.isdir() or member.issym()):
        raise UnsafeArtifactError(f"member {member.name!r} has unsupported type {member.type!r}")
    if member.mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX):
        raise UnsafeArtifactError(f"member {member.name!r} has setuid/setgid/sticky bits")
    if member.issym():
        within = PurePosixPath(*path.parts[1:])
        if len(path.parts) < 2 or not _link_inside(within, member.linkname):
            raise UnsafeArtifactError(
                f"symlink {member.name!r} -> {member.linkname!r} leaves its root"
            )
    return path


@dataclass
class UnpackResult:
    """What :func:`unpack_layer` wrote under the staging root."""

    files: int
    bytes: int


#: Files up to this size are read whole and written by the writer threads;
#: larger ones stream to disk on the reading thread.
_BUFFERED_FILE = 64 << 20
#: Bytes read ahead of the writer threads, at most.
_IN_FLIGHT = 256 << 20
#: Two writers overlap file creation with parsing; more contend on this disk (measured).
_WRITERS = 2
#: Writes queued ahead of the writer threads, at most.
_MAX_QUEUED = 1024


class _ByteBudget:
    """Bounds the bytes handed to writer threads and not yet written."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._used = 0
        self._cond = threading.Condition()

    def acquire(self, n: int) -> None:
        with self._cond:
            # A file bigger than the whole budget waits until nothing else is in flight.
            self._cond.wait_for(lambda: self._used == 0 or self._used + n <= self._limit)
            self._used += n

    def release(self, n: int) -> None:
        with self._cond:
            self._used -= n
            self._cond.notify_all()


class _Extractor:
    """Per-layer extraction state: what the manifest expects, what was written.

    The tar stream is read, checked and hashed in order on one thread; small
    files are then written by a few writer threads, because creating files is
    what restore time is made of on real disks (open + write + close overlap
    well, and release the GIL). Large files stream straight to disk. Every
    write goes under ``staging`` only; any error discards it.
    """

    def __init__(
        self,
        staging: Path,
        entries: list[FileEntry],
        relocate: Callable[[str, bytes], bytes] | None,
        keep_mtimes: bool,
    ) -> None:
        self.staging = staging
        self.expected = {e.path: e for e in entries}
        self.seen: set[str] = set()
        self.dirs: set[PurePosixPath] = set()
        self.links: list[tuple[Path, str]] = []
        self.total = 0
        self.relocate = relocate
        self.keep_mtimes = keep_mtimes
        self._pool = ThreadPoolExecutor(max_workers=_WRITERS, thread_name_prefix="extract")
        self._budget = _ByteBudget(_IN_FLIGHT)
        _umask.value = current_umask()
        self._slots = threading.BoundedSemaphore(_MAX_QUEUED)
        self._error: BaseException | None = None

    def abort(self) -> None:
        """Stop the writers: drop queued writes, wait for running ones."""
        self._pool.shutdown(wait=True, cancel_futures=True)

    def close(self) -> None:
        """Wait for the writers; raise the first error any of them hit."""
        self._pool.shutdown(wait=True)
        if self._error is not None:
            raise self._error

    def _mkdirs(self, rel: PurePosixPath) -> None:
        """Create ``rel`` and its parents under staging (any thread; idempotent)."""
        if rel in self.dirs or not rel.parts:
            return
        self._mkdirs(rel.parent)
        _mkdir_checked(self.staging.joinpath(*rel.parts))
        self.dirs.add(rel)

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

    def _write(self, rel: PurePosixPath, data: bytes, entry: FileEntry) -> None:
        """Writer-thread task: make the parent dirs, then the file."""
        self._mkdirs(rel.parent)
        _write_small(self.staging.joinpath(*rel.parts), data, entry, self.keep_mtimes)

    def member(self, tar: tarfile.TarFile, member: tarfile.TarInfo, rel: PurePosixPath) -> None:
        if member.isdir():
            self._submit(0, self._mkdirs, rel)
            return
        name = rel.as_posix()
        entry = self.expected.get(name)
        if entry is None:
            raise UnsafeArtifactError(f"member {name!r} is not in the manifest")
        if name in self.seen:
            raise UnsafeArtifactError(f"member {name!r} appears twice")
        self.seen.add(name)
        dest = self.staging.joinpath(*rel.parts)
        if member.issym():
            if entry.link != member.linkname:
                raise IntegrityError(f"symlink {name!r} differs from the manifest")
            # Created after every file: no later member can write through a link.
            self.links.append((dest, member.linkname))
            return
        if member.size != entry.size:
            raise IntegrityError(f"{name}: size {member.size} differs from manifest {entry.size}")
        src = tar.extractfile(member)
        if src is None:  # pragma: no cover - a regular member always has a data stream
            raise IntegrityError(f"member {name!r} has no data")
        self.total += entry.size
        if entry.size > _BUFFERED_FILE and not entry.rewrite:
            self._mkdirs(rel.parent)
            _stream_member(src, dest, entry, self.keep_mtimes)
            return
        data = src.read()
        if hashlib.sha256(data).hexdigest() != entry.sha256:
            raise IntegrityError(f"{entry.path}: content does not match its sha256")
        if entry.rewrite and self.relocate is not None:
            data = self.relocate(entry.path, data)
        self._submit(len(data), self._write, rel, data, entry)

    def finish(self, digest: str) -> UnpackResult:
        self.close()
        missing = sorted(set(self.expected) - self.seen)
        if missing:
            raise IntegrityError(
                f"layer {digest} lacks {len(missing)} listed file(s), e.g. {missing[0]}"
            )
        for dest, target in self.links:
            self._mkdirs(PurePosixPath(dest.relative_to(self.staging)).parent)
            try:
                os.symlink(target, dest)
            except OSError as exc:
                raise UnsafeArtifactError(f"symlink {dest.name}: collides with a member") from exc
        # The lexical check cannot see through links to links (cache/y -> ., then
        # cache/b -> y/y/../..): resolve every link now that all exist. Nothing was
        # written through any of them, so refusing here still loses nothing.
        for dest, target in self.links:
            component = self.staging / dest.relative_to(self.staging).parts[0]
            root = os.path.realpath(component)
            real = os.path.realpath(dest)
            if real != root and not real.startswith(root + os.sep):
                raise UnsafeArtifactError(f"symlink {dest.name} -> {target} resolves outside root")
        return UnpackResult(files=len(self.seen), bytes=self.total)


def unpack_layer(
    blob: Readable,
    *,
    digest: str,
    size: int,
    entries: list[FileEntry],
    staging: Path,
    components: frozenset[str],
    relocate: Callable[[str, bytes], bytes] | None = None,
    keep_mtimes: bool = False,
) -> UnpackResult:
    """Verify and extract one layer stream into ``staging``.

    ``relocate(member_path, data)`` rewrites files the manifest marks with
    ``rewrite``. Raises :class:`IntegrityError` (digest, size, file hash or
    manifest mismatch) or :class:`UnsafeArtifactError`; on error the caller
    discards ``staging``, which is the only place anything was written.
    """
    extractor = _Extractor(staging, entries, relocate, keep_mtimes)
    try:
        return _unpack(blob, extractor, digest=digest, size=size, components=components)
    finally:
        # On any error, no writer thread may still be writing when the caller
        # discards staging; on success this is a no-op (finish already waited).
        extractor.abort()


def _unpack(
    blob: Readable,
    extractor: _Extractor,
    *,
    digest: str,
    size: int,
    components: frozenset[str],
) -> UnpackResult:
    extractor.staging.mkdir(parents=True, exist_ok=True)
    compressed = _HashingReader(blob)
    try:
        dctx = zstandard.ZstdDecompressor()
        with dctx.stream_reader(compressed, closefd=False) as zr:  # type: ignore[arg-type]
            with tarfile.open(fileobj=zr, mode="r|") as tar:
                for member in tar:
                    extractor.member(tar, member, check_member(member, components))
            # tarfile stops at the end-of-archive marker; hash whatever follows too.
            while zr.read(_CHUNK):
                pass
    except tarfile.TarError as exc:
        raise IntegrityError(f"layer {digest} is not a valid tar stream: {exc}") from exc
    except zstandard.ZstdError as exc:
        raise IntegrityError(f"layer {digest} is not valid zstd data: {exc}") from exc
    compressed.drain()
    if compressed.size != size:
        raise IntegrityError(f"layer {digest}: expected {size} bytes, got {compressed.size}")
    actual = "sha256:" + compressed.sha.hexdigest()
    if actual != digest:
        raise IntegrityError(f"layer digest mismatch: expected {digest}, got {actual}")
    return extractor.finish(digest)


class _Umask:
    """The umask as read when the current extraction started."""

    value = 0o777


_umask = _Umask()


def current_umask() -> int:
    """Return the process umask without changing it; 0o777 when unknown.

    ``os.umask`` sets while it reads, which would race with our own writer
    threads. With an unknown umask every mode is set explicitly.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o777


def _mkdir_checked(path: Path) -> None:
    """Create one directory, refusing to pass through anything but a real directory."""
    try:
        os.mkdir(path, 0o755)
    except FileExistsError:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            raise UnsafeArtifactError(
                f"{path} collides with a member that is not a directory"
            ) from None
    else:
        if _umask.value & 0o755:  # the umask took bits away: put them back
            os.chmod(path, 0o755)  # noqa: S103 - cache dirs are world-readable by design


def _create(dest: Path, entry: FileEntry) -> int:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    mode = entry.mode & 0o777
    try:
        fd = os.open(dest, flags, mode)
    except (FileExistsError, IsADirectoryError, NotADirectoryError) as exc:
        raise UnsafeArtifactError(
            # Writer threads race dir and file creation: whichever side loses
            # reports the same collision, so the message does not depend on timing.
            f"{entry.path}: collides with another member (one of them is not a directory)"
        ) from exc
    if _umask.value & mode:
        os.fchmod(fd, mode)  # the manifest's mode, whatever the umask
    return fd


def _write_small(dest: Path, data: bytes, entry: FileEntry, keep_mtimes: bool) -> None:
    """Write an already verified file (runs on a writer thread)."""
    fd = _create(dest, entry)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
    if keep_mtimes and entry.mtime is not None:
        os.utime(dest, (entry.mtime, entry.mtime))


def _stream_member(src: IO[bytes], dest: Path, entry: FileEntry, keep_mtimes: bool) -> None:
    """Stream a large file to disk, hashing as it goes."""
    fd = _create(dest, entry)
    sha = hashlib.sha256()
    with os.fdopen(fd, "wb") as out:
        while chunk := src.read(_CHUNK):
            sha.update(chunk)
            out.write(chunk)
    if sha.hexdigest() != entry.sha256:
        raise IntegrityError(f"{entry.path}: content does not match its sha256")
    if keep_mtimes and entry.mtime is not None:
        os.utime(dest, (entry.mtime, entry.mtime))
