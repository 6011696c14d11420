"""Merge the cache trees of several isolated warm-up cells into one tree per family.

A build runs each matrix cell with its own fresh cache roots; afterwards each
family's trees are merged here into one tree, which is then packed as the
family's layer (``artifactd merge`` does the same with the cells' unpacked
partial artifacts). :func:`merge_family` follows these rules:

* **What is merged.** Each cell's component root is walked exactly as the
  packer walks it (:func:`artifactd.families.tree.walk_component`): whatever
  the harvest leaves out (the family's exclusions such as locks and temp or
  staging dirs, invalid entries, names that are not UTF-8) is not merged, and
  neither is a symlink leaving its root nor anything but files, dirs and
  symlinks. A component missing from a cell, or whose dir does not exist, is
  passed over.
* **Union.** A path present in one cell is copied: a regular file as
  :func:`shutil.copy2` copies it (bytes, mode and mtime, so families with
  ``keep_mtimes`` keep them), a relative symlink recreated as a link, a
  directory created (its mode, and its mtime for ``keep_mtimes`` families,
  applied once its contents are written).
* **Duplicates.** The same path with the same bytes (the same link target) in
  several cells is kept once, with the first cell's mode and mtime. So is a
  keyed path (:meth:`Family.keyed`: Inductor's, where the path is a hash of
  what was compiled) whatever its bytes: either copy serves.
* **Path-bearing files** (:meth:`Family.path_bearing`: Triton's ``__grp__*.json``,
  vLLM's ``vllm_compile_cache.py``) hold absolute paths to their own root: they
  are compared and merged in normalised form (:meth:`Family.normalize` with that
  cell's root, as the packer computes it) and written relocated to the
  destination root (:meth:`Family.relocate`), so a merged group file points at
  the merged tree. A file that will not normalise (not UTF-8) is taken as is.
* **Conflicts.** The same path with different bytes is a conflict unless the
  family merges the two copies (:meth:`Family.merge_file`; files over
  :data:`MERGE_LIMIT` are never offered); so are a symlink and a file, a file
  and a directory, and two links with other targets. The first cell's entry
  stays, and what lies under the other cell's conflicting directory is not
  merged. Conflicts are returned, never raised: the caller decides (a build
  fails naming both cells).
* **Errors.** :class:`~artifactd.errors.BuildError` is raised only for what
  cannot be got past: a source that cannot be read, a destination that cannot
  be written or already holds a file at a merged path, a destination
  overlapping a source, a component with no destination. Nothing is written
  outside ``dest``: files are created exclusively, never through a symlink,
  and only inside directories this merge created or found as real directories.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from artifactd.errors import BuildError
from artifactd.families.base import Family
from artifactd.families.tree import TreeEntry, root_spellings, walk_component
from artifactd.fsutil import link_inside

#: Larger files that differ are a conflict without asking the family to merge them.
MERGE_LIMIT = 64 * 1024 * 1024
_CHUNK = 1024 * 1024
_FILE = "file"
_DIR = "directory"
_LINK = "symlink"
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_REWRITE = os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC

__all__ = ["MERGE_LIMIT", "Conflict", "FamilyMerge", "Resolved", "Skipped", "merge_family"]


@dataclass(frozen=True)
class Conflict:
    """One path two cells wrote differently, and the family could not merge.

    ``path`` is relative to the component root; ``first`` is the cell whose
    entry the merged tree keeps, ``other`` the cell that disagrees with it.
    """

    family: str
    component: str
    path: str
    first: str
    other: str
    reason: str

    def describe(self) -> str:
        """Return one line naming the path and both cells."""
        return (
            f"{self.family}/{self.component}/{self.path}: cells {self.first!r} and"
            f" {self.other!r} {self.reason}"
        )


@dataclass(frozen=True)
class Resolved:
    """A path whose copies differed and were merged by the family's rule, and the cells merged."""

    family: str
    component: str
    path: str
    cells: tuple[str, ...]


@dataclass(frozen=True)
class Skipped:
    """An entry of one cell that is not merged, and why (the packer would leave it out too)."""

    cell: str
    component: str
    path: str
    reason: str


@dataclass
class FamilyMerge:
    """What :func:`merge_family` did.

    ``files_written`` counts the regular files and ``links_written`` the
    symlinks created; ``bytes_written`` is the size of the merged tree's
    files; ``duplicates`` counts entries dropped because an earlier cell had
    the same bytes (or link target) at that path.
    """

    family: str
    files_written: int = 0
    links_written: int = 0
    bytes_written: int = 0
    duplicates: int = 0
    resolved: list[Resolved] = field(default_factory=list)
    conflicts: list[Conflict] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether the cells merged without a conflict."""
        return not self.conflicts


@dataclass
class _Slot:
    """What the merged tree holds at one path so far."""

    kind: str
    cell: str
    dest: Path
    st: os.stat_result
    size: int = 0
    #: A path-bearing file's normalised content.
    data: bytes | None = None
    link: str | None = None
    created: bool = True


def _describe_os_error(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _same_file_bytes(a: Path, b: Path) -> bool:
    """Whether two regular files hold the same bytes (sizes first, then chunk by chunk)."""
    if os.stat(a).st_size != os.stat(b).st_size:
        return False
    with a.open("rb") as fa, b.open("rb") as fb:
        while True:
            ca, cb = fa.read(_CHUNK), fb.read(_CHUNK)
            if ca != cb:
                return False
            if not ca:
                return True


def _inside(child: str, parent: str) -> bool:
    return child == parent or child.startswith(parent.rstrip("/") + "/")


class _ComponentMerge:
    """Merges one component of every cell into one destination root."""

    def __init__(self, family: Family, component: str, dest_root: Path, result: FamilyMerge):
        self.family = family
        self.component = component
        self.dest_root = dest_root
        self.dest_str = str(dest_root.absolute())
        self.result = result
        self.slots: dict[PurePosixPath, _Slot] = {}
        self.resolved: dict[PurePosixPath, list[str]] = {}

    # -- driving ----------------------------------------------------------

    def add_cell(self, cell: str, root: Path) -> None:
        """Merge one cell's tree of this component into the destination."""
        roots = root_spellings(root)
        blocked: set[PurePosixPath] = set()

        def unreadable(rel: PurePosixPath, exc: OSError) -> None:
            raise BuildError(
                f"cannot list {self._name(rel)} of cell {cell!r} ({root / rel}):"
                f" {_describe_os_error(exc)}",
                hint="the cell's cache tree must stay readable until it is merged",
            )

        for entry in walk_component(self.family, self.component, root, on_error=unreadable):
            rel = entry.rel
            if rel.parent in blocked:
                if entry.is_dir:
                    blocked.add(rel)
                continue
            if entry.skip is not None:
                self._skip(cell, rel, entry.skip)
                continue
            try:
                kept = self._entry(cell, entry, roots)
            except OSError as exc:
                raise BuildError(
                    f"cannot merge {self._name(rel)} of cell {cell!r}: {_describe_os_error(exc)}",
                    hint=f"source {entry.path}, destination {self.dest_root / rel}",
                ) from exc
            if not kept and entry.is_dir:
                blocked.add(rel)

    def finish(self) -> None:
        """Apply directory modes (and mtimes) deepest first; total the merged files."""
        dirs = [s for s in self.slots.values() if s.kind == _DIR and s.created]
        try:
            for slot in reversed(dirs):
                os.chmod(slot.dest, stat.S_IMODE(slot.st.st_mode))
                if self.family.keep_mtimes:
                    os.utime(slot.dest, ns=(slot.st.st_atime_ns, slot.st.st_mtime_ns))
        except OSError as exc:
            raise BuildError(
                f"cannot set the metadata of {self.family.name}/{self.component} in"
                f" {self.dest_root}: {_describe_os_error(exc)}"
            ) from exc
        self.result.bytes_written += sum(s.size for s in self.slots.values() if s.kind == _FILE)
        for rel, cells in self.resolved.items():
            self.result.resolved.append(
                Resolved(self.family.name, self.component, rel.as_posix(), tuple(cells))
            )

    # -- one entry ----------------------------------------------------------

    def _entry(self, cell: str, entry: TreeEntry, roots: tuple[str, ...]) -> bool:
        """Merge one entry; False when it conflicts (so a directory's contents are not merged)."""
        mode = entry.st.st_mode
        if stat.S_ISDIR(mode):
            return self._dir(cell, entry)
        if stat.S_ISLNK(mode):
            return self._link(cell, entry)
        if stat.S_ISREG(mode):
            return self._file(cell, entry, roots)
        self._skip(cell, entry.rel, "not a regular file")
        return True

    def _existing(self, cell: str, entry: TreeEntry, kind: str) -> _Slot | None:
        """Return the slot at ``entry.rel``; record a conflict when its kind differs."""
        slot = self.slots.get(entry.rel)
        if slot is not None and slot.kind != kind:
            self._conflict(entry.rel, slot.cell, cell, f"hold a {slot.kind} and a {kind}")
        return slot

    def _dest(self, rel: PurePosixPath) -> Path:
        """Return where ``rel`` goes; its parent must be a directory of the merged tree."""
        parent = rel.parent
        if parent != PurePosixPath() and (
            (slot := self.slots.get(parent)) is None or slot.kind != _DIR
        ):
            raise BuildError(f"internal: {self._name(rel)} has no merged parent directory")
        return self.dest_root / rel

    def _dir(self, cell: str, entry: TreeEntry) -> bool:
        slot = self._existing(cell, entry, _DIR)
        if slot is not None:
            return slot.kind == _DIR
        dest = self._dest(entry.rel)
        created = True
        try:
            os.mkdir(dest, 0o700)
        except FileExistsError:
            if not stat.S_ISDIR(os.lstat(dest).st_mode):
                raise self._occupied(entry.rel) from None
            created = False
        self.slots[entry.rel] = _Slot(_DIR, cell, dest, entry.st, created=created)
        return True

    def _link(self, cell: str, entry: TreeEntry) -> bool:
        target = os.readlink(entry.path)
        if not link_inside(entry.rel, target):
            self._skip(cell, entry.rel, f"symlink leaves root: {target}")
            return True
        slot = self._existing(cell, entry, _LINK)
        if slot is not None:
            if slot.kind != _LINK:
                return False
            if slot.link != target:
                self._conflict(entry.rel, slot.cell, cell, f"link to {slot.link!r} and {target!r}")
                return False
            self.result.duplicates += 1
            return True
        dest = self._dest(entry.rel)
        try:
            os.symlink(target, dest)
        except FileExistsError:
            raise self._occupied(entry.rel) from None
        if self.family.keep_mtimes:
            os.utime(dest, ns=(entry.st.st_atime_ns, entry.st.st_mtime_ns), follow_symlinks=False)
        self.slots[entry.rel] = _Slot(_LINK, cell, dest, entry.st, link=target)
        self.result.links_written += 1
        return True

    def _file(self, cell: str, entry: TreeEntry, roots: tuple[str, ...]) -> bool:
        rel = entry.rel
        slot = self._existing(cell, entry, _FILE)
        if slot is not None and slot.kind != _FILE:
            return False
        if self.family.path_bearing(self.component, rel):
            return self._path_bearing(cell, entry, roots, slot)
        if slot is None:
            dest = self._dest(rel)
            size = self._copy(entry.path, dest)
            self.slots[rel] = _Slot(_FILE, cell, dest, entry.st, size=size)
            self.result.files_written += 1
            return True
        if self.family.keyed(self.component, rel) or _same_file_bytes(entry.path, slot.dest):
            self.result.duplicates += 1
            return True
        merged: bytes | None = None
        if max(entry.st.st_size, slot.size) <= MERGE_LIMIT:
            ours, theirs = slot.dest.read_bytes(), entry.path.read_bytes()
            merged = self.family.merge_file(self.component, rel, ours, theirs)
        if merged is None:
            self._conflict(rel, slot.cell, cell, "hold different bytes")
            return False
        self._rewrite(slot, merged)
        self._resolved(rel, slot.cell, cell)
        return True

    def _path_bearing(
        self, cell: str, entry: TreeEntry, roots: tuple[str, ...], slot: _Slot | None
    ) -> bool:
        rel = entry.rel
        data = self._normalize(entry.path.read_bytes(), roots)
        if slot is None:
            dest = self._dest(rel)
            out = self._relocate(data)
            self._write_new(dest, out, entry.st)
            self.slots[rel] = _Slot(_FILE, cell, dest, entry.st, size=len(out), data=data)
            self.result.files_written += 1
            return True
        if slot.data == data or self.family.keyed(self.component, rel):
            self.result.duplicates += 1
            return True
        merged = None
        if slot.data is not None:
            merged = self.family.merge_file(self.component, rel, slot.data, data)
        if merged is None:
            self._conflict(rel, slot.cell, cell, "hold different bytes (once normalised)")
            return False
        slot.data = merged
        self._rewrite(slot, self._relocate(merged))
        self._resolved(rel, slot.cell, cell)
        return True

    # -- helpers ------------------------------------------------------------

    def _normalize(self, data: bytes, roots: tuple[str, ...]) -> bytes:
        try:
            return self.family.normalize(data, roots)
        except ValueError:  # not UTF-8 text: compared and copied as is
            return data

    def _relocate(self, data: bytes) -> bytes:
        try:
            return self.family.relocate(data, self.dest_str)
        except ValueError:
            return data

    def _copy(self, src: Path, dest: Path) -> int:
        """Copy a regular file as :func:`shutil.copy2` does, never over an existing path."""
        with src.open("rb") as fin:
            try:
                fd = os.open(dest, _CREATE, 0o600)
            except FileExistsError:
                raise self._occupied(PurePosixPath(dest.relative_to(self.dest_root))) from None
            with os.fdopen(fd, "wb") as fout:
                shutil.copyfileobj(fin, fout, _CHUNK)
                size = fout.tell()
        shutil.copystat(src, dest)
        return size

    def _write_new(self, dest: Path, data: bytes, st: os.stat_result) -> None:
        try:
            fd = os.open(dest, _CREATE, 0o600)
        except FileExistsError:
            raise self._occupied(PurePosixPath(dest.relative_to(self.dest_root))) from None
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(dest, stat.S_IMODE(st.st_mode))
        os.utime(dest, ns=(st.st_atime_ns, st.st_mtime_ns))

    def _rewrite(self, slot: _Slot, data: bytes) -> None:
        """Replace a file this merge wrote; it keeps the first cell's mode and mtime."""
        os.chmod(slot.dest, 0o600)
        fd = os.open(slot.dest, _REWRITE)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(slot.dest, stat.S_IMODE(slot.st.st_mode))
        os.utime(slot.dest, ns=(slot.st.st_atime_ns, slot.st.st_mtime_ns))
        slot.size = len(data)

    def _resolved(self, rel: PurePosixPath, first: str, cell: str) -> None:
        cells = self.resolved.setdefault(rel, [first])
        if cell not in cells:
            cells.append(cell)

    def _conflict(self, rel: PurePosixPath, first: str, other: str, reason: str) -> None:
        self.result.conflicts.append(
            Conflict(self.family.name, self.component, rel.as_posix(), first, other, reason)
        )

    def _skip(self, cell: str, rel: PurePosixPath, reason: str) -> None:
        path = rel.as_posix().encode("utf-8", "replace").decode("utf-8")
        self.result.skipped.append(Skipped(cell, self.component, path, reason))

    def _name(self, rel: PurePosixPath) -> str:
        name = f"{self.family.name}/{self.component}"
        return name if rel == PurePosixPath() else f"{name}/{rel.as_posix()}"

    def _occupied(self, rel: PurePosixPath) -> BuildError:
        return BuildError(
            f"the merge destination already holds {self.dest_root / rel}",
            hint="merge into empty destination directories",
        )


def _check_overlap(
    family: Family, present: Mapping[str, Sequence[tuple[str, Path]]], dest: Mapping[str, Path]
) -> None:
    """Refuse a destination inside a source, or a source inside a destination."""
    dest_real = {c: os.path.realpath(dest[c]) for c in present}
    for comp, cells in present.items():
        for cell, root in cells:
            src = os.path.realpath(root)
            for dcomp, dst in dest_real.items():
                if _inside(dst, src) or _inside(src, dst):
                    raise BuildError(
                        f"the merge destination of {family.name}/{dcomp} ({dest[dcomp]})"
                        f" overlaps cell {cell!r}'s {comp} ({root})",
                        hint="merge into a directory apart from every cell's cache tree",
                    )


def merge_family(
    family: Family,
    sources: Sequence[tuple[str, Mapping[str, Path]]],
    dest: Mapping[str, Path],
) -> FamilyMerge:
    """Merge the cells' trees of ``family`` into ``dest``, by the rules of the module doc.

    ``sources`` lists ``(cell id, {component: that cell's component root})`` in
    cell order; a component missing from a cell, or whose dir does not exist,
    is passed over. ``dest`` maps each component to its destination root,
    created as needed. Conflicts are returned in :attr:`FamilyMerge.conflicts`,
    never raised; :class:`~artifactd.errors.BuildError` means an I/O problem
    the merge cannot get past (see the module doc).
    """
    result = FamilyMerge(family=family.name)
    present: dict[str, list[tuple[str, Path]]] = {}
    for cell, roots in sources:
        for comp, root in roots.items():
            if root.is_dir():
                present.setdefault(comp, []).append((cell, root))
    components = sorted(present)
    missing = [c for c in components if c not in dest]
    if missing:
        raise BuildError(
            f"no merge destination for {family.name} component(s) {', '.join(missing)}",
            hint="give every component the cells hold a destination directory",
        )
    _check_overlap(family, present, dest)
    for comp in components:
        dest_root = dest[comp]
        try:
            dest_root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise BuildError(
                f"cannot create the merge destination {dest_root}: {_describe_os_error(exc)}"
            ) from exc
        merge = _ComponentMerge(family, comp, dest_root, result)
        for cell, root in present[comp]:
            merge.add_cell(cell, root)
        merge.finish()
    return result
