"""Small filesystem helpers shared by the stores and restore.

:func:`open_regular` and :func:`read_regular` own how artifactd opens a file it
is *given* (a key, an env file, a mounted artifact's files and documents, a
store's blobs): without blocking, as a regular file only, and read up to a
limit, so that no input can hang a command (a FIFO), stream forever (a device)
or fill memory (a huge file). :func:`read_lines` reads a text file that may
still be growing (an engine log) line by line, up to a byte budget, each line
cut at a cap.

:func:`open_append` and :func:`replace_regular` are the writing side, for the
files written beside a command (an engine log, a metrics textfile): a symlink
at the path is never followed, a FIFO never blocks the open, and anything but
a regular file is refused, never written into or replaced.
"""

from __future__ import annotations

import errno
import os
import stat

from artifactd.errors import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from pathlib import Path, PurePosixPath
    from typing import BinaryIO, Literal, TypeAlias

    #: A path as text or as a Path: the pod-start path holds text (see :func:`as_path`).
    StrPath: TypeAlias = "str | os.PathLike[str]"

    #: Why :func:`open_regular` refused a file.
    Refusal = Literal["missing", "unreadable", "not_regular", "too_large"]


class InputFileError(OSError):
    """A file given as input is missing, unreadable, not a regular file, or too large.

    ``problem`` says what is wrong in words that fit after the file's name
    ("is a FIFO, not a regular file"); ``reason`` says which of the four it is,
    so each caller raises the error of its own side (a key file's usage error,
    a mounted artifact's hostile or unreachable source, a store's error). An
    ``OSError``, so code that treats an unreadable file as absent still does.
    """

    def __init__(self, path: str | Path, problem: str, *, reason: Refusal, code: int = 0) -> None:
        super().__init__(code or errno.EINVAL, problem, str(path))
        self.path = str(path)
        self.problem = problem
        self.reason: Refusal = reason

    def __str__(self) -> str:
        return f"{self.path} {self.problem}"


class MissingInputError(InputFileError, FileNotFoundError):
    """The input file does not exist (still a ``FileNotFoundError`` to code that asks)."""


_KINDS = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISLNK, "a symlink"),
)


def as_path(path: str | os.PathLike[str]) -> Path:
    """Return ``path`` as a :class:`pathlib.Path`, importing :mod:`pathlib` on first use.

    The modules a pod start loads hold paths as text (``pathlib`` imports ``re``,
    ``fnmatch`` and ``urllib.parse``: more than half a bare Python start); what
    they hand to the rest of the library, which works on ``Path`` objects, goes
    through here.
    """
    from pathlib import Path  # noqa: PLC0415  # lazy: see the docstring

    return Path(path)


def path_text(path: str) -> str:
    """Return ``str(Path(path))`` without :mod:`pathlib`: slashes collapsed, ``.`` parts dropped.

    ``..`` stays (as ``pathlib`` keeps it); a leading ``//`` stays, as POSIX allows.
    """
    if path.startswith("//") and not path.startswith("///"):
        root = "//"
    else:
        root = "/" if path.startswith("/") else ""
    return root + "/".join(p for p in path.split("/") if p and p != ".") or "."


def file_kind(mode: int) -> str:
    """Name the type of a file mode in words ("a FIFO", "a directory", "a regular file")."""
    return next((name for test, name in _KINDS if test(mode)), "a regular file")


def open_regular(
    path: str | Path,
    *,
    max_bytes: int | None = None,
    follow: bool = False,
    expect: os.stat_result | None = None,
) -> BinaryIO:
    """Open a file given as input for reading, refusing anything but a regular file.

    Opened with ``O_NONBLOCK`` (a FIFO or a device answers at once instead of
    blocking the open) and ``O_NOFOLLOW`` unless ``follow``; then the *open
    descriptor* is checked with ``fstat``, so what is read is what was checked,
    whatever is swapped in at that path meanwhile. ``max_bytes`` refuses a
    larger file; ``expect`` (an earlier ``lstat``) refuses a file that is not
    that one any more. Raises :class:`InputFileError`.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    fd = _open_nonblocking(path, flags, follow=follow, verb="read")
    try:
        st = _regular_stat(fd, path)
        if expect is not None and (st.st_dev, st.st_ino) != (expect.st_dev, expect.st_ino):
            raise InputFileError(path, "was replaced while it was read", reason="not_regular")
        if max_bytes is not None and st.st_size > max_bytes:
            raise InputFileError(
                path,
                f"is larger than {max_bytes} bytes ({st.st_size})",
                reason="too_large",
                code=errno.EFBIG,
            )
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _open_nonblocking(
    path: str | Path, flags: int, *, follow: bool, verb: str, mode: int = 0o644
) -> int:
    """``os.open`` ``flags`` (with ``O_NONBLOCK``); its errors as :class:`InputFileError`."""
    if not follow:
        flags |= os.O_NOFOLLOW
    try:
        return os.open(path, flags, mode)
    except FileNotFoundError:
        raise MissingInputError(
            path, "does not exist", reason="missing", code=errno.ENOENT
        ) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow:
            raise InputFileError(
                path, "is a symlink, not a regular file", reason="not_regular", code=errno.ELOOP
            ) from None
        if exc.errno == errno.ENXIO:  # a socket, a FIFO no one reads, a device with nothing behind
            raise InputFileError(
                path, "is not a regular file (a FIFO, socket or device)", reason="not_regular"
            ) from None
        raise InputFileError(
            path,
            f"cannot be {verb} ({exc.strerror or exc})",
            reason="unreadable",
            code=exc.errno or errno.EIO,
        ) from None


def _regular_stat(fd: int, path: str | Path) -> os.stat_result:
    """``fstat`` the open descriptor; refuse anything but a regular file (the caller closes)."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise InputFileError(
            path, f"is {file_kind(st.st_mode)}, not a regular file", reason="not_regular"
        )
    return st


def open_append(path: str | Path, *, mode: int = 0o644) -> int:
    """Open ``path`` for appending (created when missing), as a regular file only.

    The writing side of :func:`open_regular`, for a file written beside a
    command (an engine log): ``O_NOFOLLOW`` (a symlink at the path is refused,
    never followed), ``O_NONBLOCK`` (a FIFO no one reads fails at once, one
    someone reads opens at once: neither blocks), then the open descriptor is
    checked with ``fstat``: a FIFO, a device (``/dev/full``), a directory is
    refused. Returns the descriptor (close-on-exec, blocking again). Raises
    :class:`InputFileError`.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    fd = _open_nonblocking(path, flags, follow=False, verb="written", mode=mode)
    try:
        _regular_stat(fd, path)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def replace_regular(path: Path, data: bytes, *, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` atomically (:func:`atomic_write`), over a regular file only.

    What is at ``path`` is looked at first (``lstat``): a symlink, a FIFO, a
    device or a directory there is refused and left as it was, never
    replaced (``rename`` would put a regular file in place of ``/dev/full``
    when run as root). Raises :class:`InputFileError`, or ``OSError`` when the
    write fails (a full disk, a read-only directory).
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise InputFileError(
            path,
            f"cannot be written ({exc.strerror or exc})",
            reason="unreadable",
            code=exc.errno or errno.EIO,
        ) from None
    else:
        if not stat.S_ISREG(st.st_mode):
            raise InputFileError(
                path, f"is {file_kind(st.st_mode)}, not a regular file", reason="not_regular"
            )
    atomic_write(path, data, mode=mode)


def read_lines(
    handle: BinaryIO, *, max_bytes: int, max_line: int, chunk: int = 1 << 16
) -> Iterator[bytes]:
    """Yield the lines of ``handle`` (without their newline), reading at most ``max_bytes``.

    For a text file that may keep growing while it is read (an engine log):
    the caller fixes the budget when it opens the file (its size then, and a
    cap), so the read ends whatever is appended meanwhile. A line longer than
    ``max_line`` bytes yields its first ``max_line`` bytes; the rest is read
    past, never held. Memory is ``chunk + max_line`` whatever the input, and
    time is linear in the bytes read.
    """
    remaining = max_bytes
    line = bytearray()
    while remaining > 0:
        data = handle.read(min(chunk, remaining))
        if not data:
            break
        remaining -= len(data)
        start = 0
        while (end := data.find(b"\n", start)) >= 0:
            room = max_line - len(line)
            if room > 0:
                line += data[start : min(end, start + room)]
            yield bytes(line)
            line.clear()
            start = end + 1
        room = max_line - len(line)
        if room > 0 and start < len(data):
            line += data[start : start + room]
    if line:
        yield bytes(line)


def text_problem(data: bytes) -> str | None:
    """Say why ``data`` is not UTF-8 text (a NUL byte, an invalid byte), or None when it is.

    The one check of documents people write (matrices, metrics expositions):
    the caller names the file and raises its own error.
    """
    nul = data.find(b"\0")
    if nul >= 0:
        return f"is binary (a NUL byte at {nul})"
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"is not UTF-8 text (byte {exc.start})"
    return None


def utf8_argument(value: str, what: str) -> str:
    """Return ``value``, or raise :class:`~artifactd.errors.UsageError` if it is not UTF-8 text.

    The one check of text that came from a command line or the environment
    and must be written as text (a fingerprint, JSON, a tag, an env file): a
    byte that is not UTF-8 reaches Python as a lone surrogate, which none of
    them can hold. ``what`` names the argument (``--set``, ``--target``).
    """
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        shown = value.encode("utf-8", "backslashreplace").decode("utf-8")
        raise UsageError(
            f"{what} '{shown}': not UTF-8 text (\\udcXX stands for a byte that is not)",
            hint="pass UTF-8 text",
        ) from None
    return value


def read_regular(path: str | Path, max_bytes: int, *, follow: bool = False) -> bytes:
    """Return the bytes of a regular file of at most ``max_bytes`` (see :func:`open_regular`).

    Reads at most ``max_bytes + 1`` bytes, so a file that grows after the check
    costs no more memory than the limit. Raises :class:`InputFileError`.
    """
    with open_regular(path, max_bytes=max_bytes, follow=follow) as f:
        try:
            data = f.read(max_bytes + 1)
        except OSError as exc:
            raise InputFileError(
                path,
                f"cannot be read ({exc.strerror or exc})",
                reason="unreadable",
                code=exc.errno or errno.EIO,
            ) from None
    if len(data) > max_bytes:
        raise InputFileError(
            path, f"is larger than {max_bytes} bytes", reason="too_large", code=errno.EFBIG
        )
    return data


def atomic_write(
    path: str | os.PathLike[str], data: bytes, *, mode: int = 0o644, durable: bool = False
) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the new one, never a part.

    A temp file in the same directory is written, given ``mode``, then renamed
    over ``path``; on any error the temp file is removed. ``durable`` also
    fsyncs the file before the rename and the directory after it, so the new
    content survives a power cut once this returns (commit points need that).
    """
    parent = os.path.dirname(os.fspath(path)) or "."
    os.makedirs(parent, exist_ok=True)
    tmp = _write_temp(parent, data, mode=mode, durable=durable, prefix=".tmp-")
    try:
        os.replace(tmp, path)
    except BaseException:
        unlink_if_there(tmp)
        raise
    if durable:
        fsync_dir(parent)


def write_temp(
    directory: StrPath,
    data: bytes,
    *,
    mode: int = 0o644,
    durable: bool = False,
    prefix: str = ".tmp-",
) -> str:
    """Write ``data`` to a new temp file in ``directory`` and return its path.

    Used to get the bytes of a later rename onto disk first: the rename itself
    needs no space, so it cannot fail for a full disk.
    """
    return _write_temp(directory, data, mode=mode, durable=durable, prefix=prefix)


#: How :func:`rmtree` opens a directory: never through a link.
_DIR_FLAGS = (
    os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
)


def rmtree(path: StrPath) -> None:
    """Remove the directory tree at ``path``, following no link; errors are ignored.

    :func:`shutil.rmtree` with ``ignore_errors``, without importing
    :mod:`shutil` (which loads ``fnmatch``, ``re``, ``bz2`` and ``lzma``: every
    restore that installs removes its staging directory). The same walk as
    its safe form: each directory is opened with ``O_NOFOLLOW`` and read and
    emptied through its descriptor, so a directory swapped for a link while
    the walk runs is never followed out of the tree. A loop, not recursion:
    no depth is too deep.
    """
    try:
        top = os.open(path, _DIR_FLAGS)
    except OSError:
        return
    # Each level: its descriptor, the entries not yet removed, and its name in its parent.
    stack: list[tuple[int, list[os.DirEntry[str]], str]] = [(top, _entries(top), "")]
    while stack:
        fd, entries, _ = stack[-1]
        if not entries:  # this directory is empty now: close it, remove it from its parent
            _, _, name = stack.pop()
            os.close(fd)
            if stack:
                try:  # noqa: SIM105 - contextlib is off a pod start's modules (cli/fast.py FLOOR)
                    os.rmdir(name, dir_fd=stack[-1][0])
                except OSError:
                    pass
            continue
        entry = entries.pop()
        try:
            is_dir = entry.is_dir(follow_symlinks=False)
        except OSError:
            is_dir = False
        if not is_dir:
            try:  # noqa: SIM105 - contextlib is off a pod start's modules (cli/fast.py FLOOR)
                os.unlink(entry.name, dir_fd=fd)
            except OSError:
                pass
            continue
        try:
            child = os.open(entry.name, _DIR_FLAGS, dir_fd=fd)
        except OSError:
            continue
        stack.append((child, _entries(child), entry.name))
    try:  # noqa: SIM105 - contextlib is off a pod start's modules (cli/fast.py FLOOR)
        os.rmdir(path)
    except OSError:
        pass


def _entries(fd: int) -> list[os.DirEntry[str]]:
    """List the entries of the open directory ``fd`` ([] when it cannot be read)."""
    try:
        with os.scandir(fd) as it:
            return list(it)
    except OSError:
        return []


def _write_temp(
    directory: str | os.PathLike[str], data: bytes, *, mode: int, durable: bool, prefix: str
) -> str:
    fd, tmp = _create_temp(directory, prefix)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, mode)
    except BaseException:
        unlink_if_there(tmp)
        raise
    return tmp


def unlink_if_there(path: str) -> None:
    """Remove the file ``path`` if it is there (``Path.unlink(missing_ok=True)``)."""
    try:  # noqa: SIM105 - contextlib is off a pod start's modules (cli/fast.py FLOOR)
        os.unlink(path)
    except FileNotFoundError:
        pass


def _create_temp(directory: str | os.PathLike[str], prefix: str) -> tuple[int, str]:
    """Create a new file ``<prefix><random>`` in ``directory``, mode 0600; return (fd, path).

    What :func:`tempfile.mkstemp` does, without importing :mod:`tempfile` (with
    ``random``, ``shutil``, ``bz2`` and ``lzma``): a restore from a warm node
    store writes one small file at every pod start.
    """
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        path = os.path.join(directory, prefix + os.urandom(6).hex())
        try:
            return os.open(path, flags, 0o600), path
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no unused temp file name", str(directory))


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Make renames and unlinks in ``directory`` durable (best effort where unsupported)."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on directories; rename order still holds
    finally:
        os.close(fd)


#: libc's ``sync_file_range`` once looked up ([None] where there is none); Python has no binding.
_SYNC_FILE_RANGE: list[object] = []
#: ``sync_file_range``'s flag: start writing the range's dirty pages, do not wait.
_SYNC_FILE_RANGE_WRITE = 2


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to start writing ``length`` bytes of ``fd`` at ``offset`` to disk now.

    A hint that never waits and never fails: a later :func:`sync_filesystem`
    (or ``fsync``) is what makes the bytes durable, and finds less left to write.
    Linux's ``sync_file_range(2)`` through libc; nothing elsewhere.
    """
    if not _SYNC_FILE_RANGE:
        # lazy: ctypes is off the fast path; a restore that writes a large file loads it
        # here instead of at its sync
        import ctypes  # noqa: PLC0415

        fn = getattr(ctypes.CDLL(None, use_errno=True), "sync_file_range", None)
        if fn is not None:
            fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
        _SYNC_FILE_RANGE.append(fn)
    fn = _SYNC_FILE_RANGE[0]
    if fn is not None:
        fn(fd, offset, length, _SYNC_FILE_RANGE_WRITE)  # type: ignore[operator]  # -1: a hint lost


def sync_filesystem(path: StrPath) -> None:
    """Flush the dirty data of the filesystem holding ``path`` (syncfs(2); sync(2) without it).

    It waits for every writer's dirty pages on that filesystem, not only the
    caller's: :func:`make_durable` decides when that is cheap.
    """
    # lazy: ctypes is off the fast path (artifactd/cli/fast.py allows it for the GPU probe only)
    import ctypes  # noqa: PLC0415

    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fn = getattr(ctypes.CDLL(None, use_errno=True), "syncfs", None)
        if fn is None or fn(fd) != 0:
            os.sync()
    finally:
        os.close(fd)


#: Other writers' dirty page cache, in bytes, that one ``syncfs`` may wait for
#: at least (at about 1 GB/s of disk, 64 MiB is about 60 ms) before
#: :func:`make_durable` syncs a tree's files one by one instead.
FOREIGN_DIRTY_MAX = 64 << 20
#: What one file's fsync costs, as bytes of writeback: 60-90 us a file on 8
#: threads here (``bench/busy_disk.py``), what about 64 KiB take at 1 GB/s. A
#: tree of many files may wait for that much more of other writers' data.
FSYNC_COST_BYTES = 64 << 10
#: Threads that fsync a tree's files: concurrent fsyncs share journal commits.
FSYNC_THREADS = 8


def dirty_bytes() -> int | None:
    """Return the machine's dirty and under-writeback page cache in bytes; None if unknown.

    Read from ``/proc/meminfo``: every filesystem's, not one's.
    """
    try:
        with open("/proc/meminfo", "rb") as f:
            return parse_dirty(f.read(1 << 16))
    except OSError:
        return None


def parse_dirty(meminfo: bytes) -> int | None:
    """Return the ``Dirty`` and ``Writeback`` lines of a ``/proc/meminfo`` text, summed, in bytes.

    None unless both are there, each as ``<digits> kB``.
    """
    total, seen = 0, 0
    for line in meminfo.splitlines():
        name, _, rest = line.partition(b":")
        if name in (b"Dirty", b"Writeback"):
            fields = rest.split()
            if len(fields) != 2 or fields[1] != b"kB" or not fields[0].isdigit():
                return None
            total += int(fields[0]) << 10
            seen += 1
    return total if seen == 2 else None


def make_durable(root: StrPath, written: int, files: int) -> str:
    """Make every file and directory under ``root`` durable; return the way taken.

    ``written`` and ``files`` are about how many bytes and files the caller
    wrote there. ``syncfs`` is one call however many files there are, but it
    also waits for every other writer's dirty pages on the filesystem: on a
    node where another pod is writing gigabytes (model weights), that is
    seconds to minutes. So when the page cache holds more than
    :data:`FOREIGN_DIRTY_MAX` bytes besides ``written`` (plus
    :data:`FSYNC_COST_BYTES` a file: fsyncing many files costs time too),
    each file and directory under ``root`` is fsynced instead
    (:func:`fsync_tree`), which waits for those alone. Either way the tree is
    on disk when this returns. Returns ``"syncfs"`` or ``"fsync"``.
    """
    dirty = dirty_bytes()
    if dirty is None or dirty - written <= FOREIGN_DIRTY_MAX + files * FSYNC_COST_BYTES:
        sync_filesystem(root)
        return "syncfs"
    fsync_tree(root)
    return "fsync"


def fsync_tree(root: StrPath) -> None:
    """Flush every regular file and directory under ``root`` with fsync (symlinks not followed).

    On :data:`FSYNC_THREADS` threads, files first, then directories deepest
    first, ``root`` last. A file this user may not open (mode 000 as a
    non-root user) is flushed with the filesystem instead. Raises the first
    ``OSError`` of an fsync (an I/O error: the data may not be on disk).
    """
    files: list[str] = []
    dirs: list[str] = []  # each directory before the ones inside it
    stack = [os.fspath(root)]
    while stack:
        top = stack.pop()
        dirs.append(top)
        with os.scandir(top) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    files.append(entry.path)
    denied = _fsync_all(files)
    denied += _fsync_all(dirs[::-1], directory=True)
    if denied:
        sync_filesystem(root)


def _fsync_all(paths: list[str], *, directory: bool = False) -> int:
    """Flush ``paths`` with fsync on a few threads; return how many this user may not open."""
    # lazy: only a restore on a busy disk syncs file by file
    from artifactd.workers import Thread  # noqa: PLC0415

    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    if directory:
        flags |= os.O_DIRECTORY
    denied: list[str] = []
    failed: list[OSError] = []

    def run(part: list[str]) -> None:
        for path in part:
            if failed:
                return
            try:
                fd = os.open(path, flags)
            except PermissionError:
                denied.append(path)
                continue
            except OSError as exc:
                failed.append(exc)
                return
            try:
                os.fsync(fd)
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.EROFS):  # a filesystem without fsync
                    failed.append(exc)
                    return
            finally:
                os.close(fd)

    count = min(FSYNC_THREADS, len(paths))

    def part(i: int) -> Callable[[], None]:
        return lambda: run(paths[i::count])

    threads = [Thread(part(i), f"fsync-{i}") for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failed:
        raise failed[0]
    return len(denied)


def link_inside(rel: PurePosixPath, target: str) -> bool:
    """Whether a symlink at ``rel`` pointing to ``target`` stays inside its root."""
    if not target or target.startswith("/"):
        return False
    from pathlib import PurePosixPath  # noqa: PLC0415  # lazy: off the first modules

    depth = len(rel.parent.parts)
    for part in PurePosixPath(target).parts:
        if part == "..":
            depth -= 1
            if depth < 0:
                return False
        elif part != ".":
            depth += 1
    return True
