"""The node store's unpacked layers: each verified layer kept unpacked once, served by link.

A node store (:mod:`artifactd.stores.nodestore`) keeps each layer's blob, and
beside it, once a pod has restored from it, the layer unpacked:
``unpacked/<hex>/<component>/...`` with a stamp (:data:`STAMP_NAME`). A tree
is made from the blob by the format's own extractor, so every file was
verified against the record's sha256 on its way in; then each file is made
read-only (0444, or 0555 where the record says 0755) and given a known mtime,
and the stamp records that mtime, the directories, which blob (size,
mtime, inode) the tree was made from, and the record it was made for
(:func:`record_identity`: a tree serves no other config's record of the
layer). The blob stays: the node store remains an OCI layout that gc,
``prefetch`` and any OCI client read, and a tree can always be made again
from it without the network.

Serving a tree into a pod's staging (:func:`serve`) is per file: a cheap
check (:func:`os.lstat`: a regular file, the record's size, the sealed mode,
the stamp's mtime), then the file itself, in this order of preference:

* a **reflink** (``FICLONE``) where the filesystem can: the pod gets its own
  copy-on-write copy, so nothing it does reaches the node store;
* a **hard link** to the node store's own inode for a file its family never
  writes (:meth:`artifactd.families.base.Family.shares_inode`), unless the
  restore asked for :data:`COPY` linking;
* a **copy** for the rest (a file rewritten for its target, or one the library
  rewrites or appends to), and for every file when the staging directory is on
  another filesystem (``EXDEV``) or a link is refused.

A warm serve asks the kernel for one ``lstat`` and one ``link`` per file and
one ``mkdir`` per directory, made up front from the stamp, and nothing else
per file: a link carries the sealed mode and mtime, so no ``chmod`` or
``utime`` follows it, and the install renames the staged component
directories whole (``tests/test_nodetree.py`` counts the calls). That is
fewer calls than ``cp -al`` makes (two stats or more a file, a dozen calls a
directory). The ``lstat`` is the check and cannot be shared: a write through a
shared inode moves that file's mtime, never its directory's, so a
per-directory check would not see it, and on Linux ``os.scandir`` carries no
stat (``DirEntry.stat()`` is an ``lstat`` of its own).

A pod cannot change what the node store serves next through a path: a
rename over, an unlink or a new file in the pod's directory changes the pod's
directory, never the node store's. Through a shared inode it can only by
writing a read-only file, which needs root or the file's owner (a ``chmod``
first); that write moves the file's mtime (and a truncate its size, a chmod its
mode), which the check before every serve sees: the tree is discarded and made
again from the blob, with new inodes, and the tampered inode stays with the
pods that hold it. What the check cannot see is a writer that also sets the
mtime back (``utime``) with the size unchanged: deliberate tampering, which
copy linking (``--node-link copy``) or a filesystem with reflinks rules out.
``docs/node-store.md`` states this guarantee.
"""

from __future__ import annotations

import errno
import operator
import os
import stat
import time

from artifactd import jsontext
from artifactd.errors import ArtifactdError
from artifactd.format.unpack import check_name, current_umask
from artifactd.fsutil import atomic_write, make_durable, read_regular, rmtree
from artifactd.hashing import sha256_hex
from artifactd.records import Record
from artifactd.stores.nodestore import LINKINGS, TREES_DIR
from artifactd.workers import Pool

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from artifactd.format.views import FileView, LayerView
    from artifactd.fsutil import StrPath

#: The stamp of a complete tree, inside it: its blob, its mtime, its directories.
STAMP_NAME = ".artifactd-node-tree.json"
#: Largest stamp read: a few bytes per directory (100,000 directories fit).
MAX_STAMP_BYTES = 16 << 20
#: What the writers in ``unpacked/`` name a tree before it is complete (a kill leaves it).
TMP_PREFIX = ".tmp-"
#: ``ioctl(dest, FICLONE, src)``: share the source's extents copy-on-write (Linux).
FICLONE = 0x40049409

#: Reflink, else hard link where the family allows, else copy (the default).
AUTO = LINKINGS[0]
#: Reflink, else copy: a pod never gets the node store's own inode.
COPY = LINKINGS[1]

#: Errors that say "this filesystem (or pair of them) cannot do that", not "it failed".
_UNSUPPORTED = frozenset(
    {errno.EXDEV, errno.EOPNOTSUPP, errno.ENOTTY, errno.EINVAL, errno.ENOSYS, errno.EBADF}
)
#: Errors a hard link meets where it is refused (another filesystem, protected links, limits).
_NO_LINK = frozenset({errno.EXDEV, errno.EPERM, errno.EACCES, errno.EMLINK, errno.ENOTSUP})


class Stale(Exception):  # noqa: N818 - a state, not a failure: the caller makes the tree again
    """The tree cannot serve as it is: missing, incomplete, or changed since it was made."""


class OtherRecord(Stale):
    """The tree is sound, but made for another record of its layer (:func:`record_identity`).

    Not a reason to make it again: a layer's records that agree with its own
    tree document all have the tree's identity, so this record cannot be
    extracted either. The caller leaves the tree to the pods it serves and
    lets the extractor refuse the record.
    """


class Stamp(Record):
    """What a complete tree records of itself (:data:`STAMP_NAME`)."""

    layer: str
    #: The blob it was made from: size, mtime in ns, inode.
    blob: tuple[int, int, int]
    #: Every file's mtime in ns (a family that keeps mtimes: the record's instead).
    mtime_ns: int
    #: Every directory under the components, parents first.
    dirs: list[str]


class Served(Record):
    """What :func:`serve` put into staging, and how."""

    files: int
    bytes: int
    reflinked: int
    linked: int
    copied: int


def tree_path(root: StrPath, digest: str) -> str:
    """Return where the node store at ``root`` keeps the layer ``digest`` unpacked."""
    return os.path.join(root, TREES_DIR, digest.partition(":")[2])


def blob_file(root: StrPath, digest: str) -> str:
    """Return the file of the blob ``digest`` in the node store's layout at ``root``."""
    algorithm, _, hexdigest = digest.partition(":")
    return os.path.join(root, "blobs", algorithm, hexdigest)


def blob_identity(path: StrPath) -> tuple[int, int, int]:
    """Return what a tree remembers of its blob: size, mtime (ns), inode."""
    st = os.stat(path)
    return (st.st_size, st.st_mtime_ns, st.st_ino)


def sealed_mode(mode: int) -> int:
    """Return a tree file's mode: read-only for all, executable where the record's is."""
    return 0o555 if mode & 0o100 else 0o444


def read_stamp(tree: StrPath, record: LayerView) -> Stamp:
    """Return the stamp of a complete tree of ``record``'s layer, or raise :class:`Stale`.

    Read as a regular file of at most :data:`MAX_STAMP_BYTES`; every directory
    it names must be a normal relative path under one of the record's
    components (the format's own name check), or the tree is not used.
    """
    try:
        doc = jsontext.loads(read_regular(os.path.join(tree, STAMP_NAME), MAX_STAMP_BYTES))
    except (OSError, ValueError) as exc:
        raise Stale(f"no readable stamp ({exc})") from None
    if not isinstance(doc, dict) or doc.get("schema_version") != 1:
        raise Stale("a stamp of another version")
    blob, mtime, dirs = doc.get("blob"), doc.get("mtime_ns"), doc.get("dirs")
    if (
        doc.get("layer") != record.digest
        or not isinstance(blob, list)
        or len(blob) != 3  # size, mtime, inode
        or not all(isinstance(x, int) and not isinstance(x, bool) for x in blob)
        or not isinstance(mtime, int)
        or isinstance(mtime, bool)
        or not isinstance(dirs, list)
    ):
        raise Stale("a stamp that is not this layer's")
    components = frozenset(record.components)
    for d in dirs:
        if not isinstance(d, str) or "/" not in d:
            raise Stale("a stamp naming a directory outside the components")
        try:
            check_name(d, components)
        except ArtifactdError as exc:
            raise Stale(exc.message) from None
    made_for = doc.get("record")
    if not isinstance(made_for, str):
        raise Stale("a stamp of an artifactd that did not name the record")
    if made_for != record_identity(record):
        raise OtherRecord("a tree made for another record of this layer")
    dirs.sort(key=lambda d: d.count("/"))
    return Stamp(record.digest, (blob[0], blob[1], blob[2]), mtime, dirs)


def record_identity(record: LayerView) -> str:
    """Return the sha256 of what a tree made from ``record``'s layer is, by the record.

    A tree is made from its blob by the extractor, which holds the layer's own
    tree document to the record of the config it restores; a warm serve checks
    each file against the tree (size, mode, mtime), not its bytes. So a tree
    serves only the record it was made for (:func:`seal` stamps this digest,
    :func:`read_stamp` compares it): another config naming the same layer
    with other files, digests or scope is served nothing from it
    (:class:`OtherRecord`), and its restore extracts the layer from the blob,
    where the extractor refuses it as it refuses it from a registry. What the
    serve compares file by file with the tree itself (each size and mode) is
    left out; every other field of the layer's tree document is in: family,
    scope key and scope, components, unpacked size, and each file's path,
    sha256, mtime, link and rewrite flag.
    Columns joined, not a document: 18,000 files in a few milliseconds.
    """
    files = record.files
    head = [record.family, record.scope_key, record.scope, record.components, record.unpacked_size]
    links = list(map(operator.attrgetter("link"), files))
    text = "\x00".join(
        [
            jsontext.dumps(head, sort_keys=True, compact=True),
            "".join(map(operator.attrgetter("sha256"), files)),
            repr(list(map(operator.attrgetter("mtime"), files))),
            "" if links.count(None) == len(links) else jsontext.dumps(links),
            bytes(map(operator.attrgetter("rewrite"), files)).hex(),
            # NUL never appears in a checked member path: a separator nothing can forge.
            *map(operator.attrgetter("path"), files),
        ]
    )
    return sha256_hex(text.encode("utf-8", "surrogatepass"))


def seal(
    tree: StrPath, record: LayerView, blob: tuple[int, int, int], *, keep_mtimes: bool
) -> None:
    """Make a freshly unpacked tree servable: files read-only, mtimes known, the stamp last.

    Its bytes reach the disk before the stamp is written: after a power cut a
    stamp never describes files the page cache did not write back.
    """
    made = time.time_ns()
    for entry in record.files:
        if entry.link is not None:
            continue
        path = os.path.join(tree, entry.path)
        os.chmod(path, sealed_mode(entry.mode))
        ns = entry.mtime * 1_000_000_000 if keep_mtimes and entry.mtime is not None else made
        os.utime(path, ns=(ns, ns), follow_symlinks=False)
    dirs: list[str] = []
    for comp in sorted(record.components):
        base = os.path.join(tree, comp)
        for top, subdirs, _ in os.walk(base):
            rel = os.path.relpath(top, tree)
            if rel != comp:
                dirs.append(rel.replace(os.sep, "/"))
            subdirs.sort()
    make_durable(tree, record.unpacked_size, len(record.files))
    doc = {"schema_version": 1, "layer": record.digest, "blob": list(blob), "mtime_ns": made}
    doc["dirs"] = dirs
    doc["record"] = record_identity(record)
    atomic_write(os.path.join(tree, STAMP_NAME), jsontext.dumps(doc).encode(), durable=True)


def put_in_place(made: StrPath, tree: StrPath) -> None:
    """Rename the sealed tree ``made`` to ``tree``; another pod's complete tree there wins.

    A stale tree at ``tree`` is renamed aside first (so a reader sees the old
    tree, no tree, or the new one), then removed.
    """
    try:
        os.rename(made, tree)
        return
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
    aside = _aside(tree)
    try:  # noqa: SIM105 - contextlib is off a pod start's modules (cli/fast.py FLOOR)
        os.rename(tree, aside)
    except FileNotFoundError:
        pass
    try:
        os.rename(made, tree)
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        discard(made)  # another pod put its tree there meanwhile: it serves as well
    discard(aside)


def discard(path: StrPath) -> None:
    """Remove a tree (or what is left of one); its read-only files go with their directories."""
    rmtree(path)


def _aside(tree: StrPath) -> str:
    """Return a new name beside ``tree`` for a stale tree on its way out."""
    return os.path.join(
        os.path.dirname(os.fspath(tree)), f"{TMP_PREFIX}stale-{os.urandom(6).hex()}"
    )


def retire(tree: StrPath) -> None:
    """Take a stale tree out of service at once (renamed aside), then remove it."""
    aside = _aside(tree)
    try:
        os.rename(tree, aside)
    except OSError:
        return
    discard(aside)


#: A record of at least this many files is served by two threads (see :func:`serve`).
PARALLEL_FROM = 2048


def serve(
    tree: StrPath,
    stamp: Stamp,
    record: LayerView,
    staging: StrPath,
    *,
    shares: Callable[[str, str, bool], bool],
    relocate: Callable[[str, bytes], bytes],
    keep_mtimes: bool,
    linking: str = AUTO,
) -> Served:
    """Put ``record``'s files from the checked tree into ``staging`` (``<component>/...``).

    Each file is checked (:class:`Stale` when it is not what the tree made)
    before it is reflinked, hard linked (``shares(component, rel, rewrite)``
    says the family allows it, and ``linking`` is :data:`AUTO`) or copied.
    Files the record marks for rewriting are read, ``relocate``-d and written
    new, in the record's order. Symlinks are made last, from the record. Only
    ``staging`` is written; on any error the caller discards it, once both
    threads have stopped.

    The directories are made first, then the files: a record of
    :data:`PARALLEL_FROM` files or more on two threads, each half of the
    plain files (the kernel links into different directories side by side:
    18,000 links took 0.13 s instead of 0.18 here; directories share their
    parent's lock, so they are made on one).
    """
    dst_root = os.fspath(staging) + os.sep
    umask = current_umask()
    os.makedirs(staging, exist_ok=True)
    for d in [*sorted(record.components), *stamp.dirs]:
        os.mkdir(dst_root + d, 0o755)
        if umask & 0o755:
            os.chmod(dst_root + d, 0o755)  # noqa: S103 - cache dirs are world-readable by design
    put = _Putter(tree, stamp, staging, shares, relocate, keep_mtimes, linking, umask)
    files = [entry for entry in record.files if entry.link is None]
    half = len(files) // 2 if len(files) >= PARALLEL_FROM and (os.cpu_count() or 1) > 1 else 0
    if half:
        # relocate runs on this thread, in order: the other half holds plain files only.
        theirs = [entry for entry in files[half:] if not entry.rewrite]
        mine = files[:half] + [entry for entry in files[half:] if entry.rewrite]
        counts = _in_two(put, mine, theirs)
    else:
        counts = put(files)
    for entry in record.files:
        if entry.link is not None:
            os.symlink(entry.link, dst_root + entry.path)
    return Served(len(record.files), counts[3], counts[0], counts[1], counts[2])


def _in_two(put: _Putter, mine: list[FileView], theirs: list[FileView]) -> list[int]:
    """Run ``put`` over ``mine`` here and ``theirs`` on a thread; return the summed counts.

    The first error stops both (each checks between files) and is raised
    once the thread has ended: nothing writes into staging after this returns.
    """
    with Pool(1, "serve") as pool:
        job = pool.submit(put, theirs)
        try:
            counts = put(mine)
        except BaseException:
            pool.shutdown(wait=True)  # put set halt: the thread ends at its next file
            raise
        other = job.result()
    return [a + b for a, b in zip(counts, other, strict=True)]


class _Putter:
    """Check and put tree files into staging (:func:`serve`): one call per batch of files."""

    def __init__(  # noqa: PLR0917 - the serve's settings, once
        self,
        tree: StrPath,
        stamp: Stamp,
        staging: StrPath,
        shares: Callable[[str, str, bool], bool],
        relocate: Callable[[str, bytes], bytes],
        keep_mtimes: bool,
        linking: str,
        umask: int,
    ) -> None:
        self.src_root = os.fspath(tree) + os.sep
        self.dst_root = os.fspath(staging) + os.sep
        self.mtime_ns = stamp.mtime_ns
        self.shares = shares
        self.relocate = relocate
        self.keep_mtimes = keep_mtimes
        self.linking = linking
        self.umask = umask
        #: Set when a batch failed: the others stop at their next file.
        self.halt = False
        # A tree file is a regular file of its sealed mode: one comparison of st_mode
        # (S_IFREG, no setuid/setgid/sticky bit, the permission bits) per file.
        self.regular = {mode: stat.S_IFREG | sealed_mode(mode) for mode in range(0o1000)}

    def __call__(self, entries: list[FileView]) -> list[int]:
        """Put ``entries`` (no symlinks); return [reflinked, linked, copied, bytes].

        Its first error also sets :attr:`halt`, so a batch on another thread
        stops at its next file.
        """
        try:
            return self._put(entries)
        except BaseException:
            self.halt = True
            raise

    def _put(self, entries: list[FileView]) -> list[int]:  # noqa: PLR0912 - the loop
        src_root, dst_root, umask = self.src_root, self.dst_root, self.umask
        keep_mtimes, regular, shares, lstat = self.keep_mtimes, self.regular, self.shares, os.lstat
        clone: bool | None = None  # unknown until the first file tries
        link: bool | None = None if self.linking == AUTO else False
        reflinked = linked = copied = total = 0
        for entry in entries:
            if self.halt:
                break
            src = src_root + entry.path
            try:
                st = lstat(src)
            except OSError as exc:
                raise Stale(f"{entry.path}: {exc.strerror}") from None
            mtime = (
                entry.mtime * 1_000_000_000
                if keep_mtimes and entry.mtime is not None
                else self.mtime_ns
            )
            if (
                st.st_mode != regular.get(entry.mode)
                or st.st_size != entry.size
                or st.st_mtime_ns != mtime
            ):
                raise Stale(f"{entry.path} changed since the tree was made")
            total += entry.size
            dst = dst_root + entry.path
            if entry.rewrite:
                _write_new(dst, self.relocate(entry.path, _read(src, st)), entry.mode, umask)
                copied += 1
                continue
            if clone is not False:
                clone = _clone(src, st, dst, entry.mode, umask)
                if clone:
                    if keep_mtimes and entry.mtime is not None:
                        os.utime(dst, ns=(mtime, mtime))
                    reflinked += 1
                    continue
            comp, _, rel = entry.path.partition("/")
            if link is not False and shares(comp, rel, entry.rewrite):
                try:
                    os.link(src, dst, follow_symlinks=False)
                    link = True
                    linked += 1
                    continue
                except OSError as exc:
                    if exc.errno not in _NO_LINK:
                        raise
                    if exc.errno != errno.EMLINK:  # this file only: the next may link
                        link = False
            _copy(src, st, dst, entry.mode, umask)
            if keep_mtimes and entry.mtime is not None:
                os.utime(dst, ns=(mtime, mtime))
            copied += 1
        return [reflinked, linked, copied, total]


def _open_checked(src: str, st: os.stat_result) -> int:
    """Open the tree's file ``src`` for reading; it must still be the inode ``st`` checked."""
    try:
        fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise Stale(f"{src}: {exc.strerror}") from None
    found = os.fstat(fd)
    if (found.st_ino, found.st_dev) != (st.st_ino, st.st_dev):
        os.close(fd)
        raise Stale(f"{src} was replaced while it was served")
    return fd


def _create(dst: str, mode: int, umask: int) -> int:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    fd = os.open(dst, flags, mode)
    if umask & mode:
        os.fchmod(fd, mode)  # the record's mode, whatever the umask
    return fd


def _read(src: str, st: os.stat_result) -> bytes:
    fd = _open_checked(src, st)
    try:
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(st.st_size + 1)
    finally:
        os.close(fd)
    if len(data) != st.st_size:
        raise Stale(f"{src} changed while it was read")
    return data


def _write_new(dst: str, data: bytes, mode: int, umask: int) -> None:
    fd = _create(dst, mode, umask)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def _clone(src: str, st: os.stat_result, dst: str, mode: int, umask: int) -> bool:
    """Reflink ``src`` to a new ``dst``; False (``dst`` not left behind) where it cannot be."""
    # lazy: only a serve loads fcntl's ioctl (the no-op restore never serves)
    import fcntl  # noqa: PLC0415

    sfd = _open_checked(src, st)
    try:
        dfd = _create(dst, mode, umask)
        try:
            fcntl.ioctl(dfd, FICLONE, sfd)
        except OSError as exc:
            os.close(dfd)
            os.unlink(dst)
            if exc.errno in _UNSUPPORTED:
                return False
            raise
        os.close(dfd)
    finally:
        os.close(sfd)
    return True


def _copy(src: str, st: os.stat_result, dst: str, mode: int, umask: int) -> None:
    """Copy ``src`` (the inode ``st`` checked) to a new ``dst`` of ``mode``, in the kernel."""
    sfd = _open_checked(src, st)
    try:
        dfd = _create(dst, mode, umask)
        try:
            left = st.st_size
            try:
                while left > 0:
                    n = os.copy_file_range(sfd, dfd, left)
                    if n == 0:
                        break
                    left -= n
            except OSError as exc:
                if exc.errno not in _UNSUPPORTED:
                    raise
                while left > 0 and (chunk := os.read(sfd, min(left, 1 << 20))):
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(dfd, view) :]
                    left -= len(chunk)
            if left:
                raise Stale(f"{src} is shorter than when it was checked")
        finally:
            os.close(dfd)
    finally:
        os.close(sfd)
