"""Reproducible family layers: pack a cache tree into a tar.zst.

Packing walks each component root in sorted order, leaves out what the family
excludes, and writes a POSIX tar with uid/gid 0, no user names and a fixed
mtime (unless the family keeps mtimes), compressed with zstd. Packing the same
tree twice gives the same bytes, so the registry stores identical content once.
Each file is hashed while it is copied into the tar.

Every component root is written as a directory member first, even when it is
empty: restore refuses a layer that declares a component it does not carry.

Layers are written in format 2 only: every member sits under ``<family>/``
and the layer ends with the family's tree document
(:class:`~artifactd.format.config.FamilyTree` at ``<family>/.artifactd-layer.json``),
so a runtime that merges several layers gives one self-describing directory
per family. Format 1 (members ``<component>/...``) is still read, never
written: restore is tested against an artifact an old release wrote
(``tests/fixtures/format-v1``), not against an imitation.
Unpacking, the dangerous half, lives in :mod:`artifactd.format.unpack`.
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from artifactd.errors import BuildError, IntegrityError
from artifactd.families.base import Family, Located
from artifactd.families.tree import root_spellings, walk_component
from artifactd.format import config
from artifactd.format.config import FamilyTree, FileEntry, LayerRecord, SkippedEntry
from artifactd.format.oci import TREE_DOC
from artifactd.format.zstd import ZstdCompressor
from artifactd.fsutil import link_inside
from artifactd.hashing import HashingReader, HashingWriter, sha256_hex

#: mtime written for every member of families that do not keep mtimes.
FIXED_MTIME = 0
ZSTD_LEVEL = 6
#: sha256 of no bytes: what a symlink entry records.
EMPTY_SHA256 = sha256_hex(b"")

__all__ = [
    "EMPTY_SHA256",
    "FIXED_MTIME",
    "ZSTD_LEVEL",
    "PackedLayer",
    "link_inside",
    "pack_family",
]


@dataclass
class PackedLayer:
    """The result of packing one family."""

    path: Path
    digest: str
    size: int
    diff_id: str
    files: list[FileEntry]
    #: The tree document the layer ends with.
    tree: FamilyTree
    skipped: list[SkippedEntry] = field(default_factory=list)
    pinned: list[str] = field(default_factory=list)

    @property
    def unpacked_size(self) -> int:
        """Sum of the sizes of the files in the layer."""
        return sum(f.size for f in self.files)

    def record(
        self, *, facts: Mapping[str, Any] | None = None, pinned: Sequence[str] | None = None
    ) -> LayerRecord:
        """Return the layer's record (:func:`artifactd.format.config.layer_record`).

        ``pinned`` replaces the paths packing pinned: a merge passes what the
        cells recorded, since a pinned site-packages dir is found on the
        packing machine's ``sys.path``, which the merging machine need not share.
        """
        return config.layer_record(
            self.tree,
            digest=self.digest,
            size=self.size,
            diff_id=self.diff_id,
            skipped=self.skipped,
            pinned=self.pinned if pinned is None else pinned,
            facts=facts,
        )


def _norm_mode(st_mode: int) -> int:
    return 0o755 if st_mode & 0o111 else 0o644


def pack_family(
    family: Family,
    located: list[Located],
    out: Path,
    *,
    scope_key: str,
    scope: Mapping[str, Any],
) -> PackedLayer:
    """Pack the located components of ``family`` into ``out`` (a .tar.zst file), format 2.

    Members are ``<family>/`` (the directory), ``<family>/<component>/<relative
    path>``, then ``<family>/`` plus :data:`~artifactd.format.oci.TREE_DOC`: the
    tree document for ``scope_key`` and the ``scope`` fields it hashes. Files
    the family marks as path-bearing are stored with their root replaced by a
    placeholder.
    """
    prefix = f"{family.name}/"
    files: list[FileEntry] = []
    skipped: list[SkippedEntry] = []
    pinned = sorted(
        {p for loc in located for p in family.pinned_paths(loc.component.name, loc.path)}
    )
    cctx = ZstdCompressor(level=ZSTD_LEVEL)
    with out.open("wb") as raw:
        compressed = HashingWriter(raw)
        with cctx.stream_writer(compressed, closefd=False) as zw:  # type: ignore[arg-type]
            plain = HashingWriter(zw)
            with tarfile.open(fileobj=plain, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
                tar.addfile(_tarinfo(family.name, tarfile.DIRTYPE, 0o755, FIXED_MTIME))
                for loc in sorted(located, key=lambda item: item.component.name):
                    _pack_component(family, loc, tar, files, skipped, prefix=prefix)
                tree = FamilyTree(
                    family=family.name,
                    scope_key=scope_key,
                    scope=dict(scope),
                    components=sorted({loc.component.name for loc in located}),
                    files=files,
                    unpacked_size=sum(f.size for f in files),
                )
                doc = tree.canonical()
                _check_tree_doc(family.name, doc, len(files))
                info = _tarinfo(prefix + TREE_DOC, tarfile.REGTYPE, 0o644, FIXED_MTIME)
                info.size = len(doc)
                tar.addfile(info, io.BytesIO(doc))
        diff_id = plain.hasher.digest
    return PackedLayer(
        path=out,
        digest=compressed.hasher.digest,
        size=compressed.hasher.size,
        diff_id=diff_id,
        files=files,
        skipped=skipped,
        pinned=pinned,
        tree=tree,
    )


def _check_tree_doc(family: str, doc: bytes, files: int) -> None:
    """Refuse to pack a tree document larger than a restore from a mounted tree reads.

    The limit is read from its owner at each call (:data:`~artifactd.format.config.MAX_TREE_DOC`).
    """
    limit = config.MAX_TREE_DOC
    if len(doc) > limit:
        raise BuildError(
            f"{family}: its tree document would take {len(doc)} bytes ({files} files), over "
            f"the {limit >> 20} MiB a restore reads",
            hint="clear stale entries from the cache before harvesting it",
        )


def _tarinfo(name: str, kind: bytes, mode: int, mtime: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = mode
    info.mtime = mtime
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _pack_component(
    family: Family,
    loc: Located,
    tar: tarfile.TarFile,
    files: list[FileEntry],
    skipped: list[SkippedEntry],
    *,
    prefix: str,
) -> None:
    comp = loc.component.name
    root = loc.path
    roots = root_spellings(root)
    tar.addfile(_tarinfo(prefix + comp, tarfile.DIRTYPE, 0o755, FIXED_MTIME))
    for entry in walk_component(family, comp, root):
        rel, st, is_dir = entry.rel, entry.st, entry.is_dir
        name = f"{comp}/{rel.as_posix()}"
        if entry.skip is not None:
            skipped.append(
                SkippedEntry(path=name.encode("utf-8", "replace").decode(), reason=entry.skip)
            )
            continue
        mtime = int(st.st_mtime) if family.keep_mtimes else FIXED_MTIME
        if is_dir:
            tar.addfile(_tarinfo(prefix + name, tarfile.DIRTYPE, 0o755, mtime))
        elif stat.S_ISLNK(st.st_mode):
            target = os.readlink(root / rel)
            if not link_inside(rel, target):
                skipped.append(SkippedEntry(path=name, reason=f"symlink leaves root: {target}"))
                continue
            info = _tarinfo(prefix + name, tarfile.SYMTYPE, 0o777, mtime)
            info.linkname = target
            tar.addfile(info)
            files.append(
                FileEntry(
                    path=name,
                    size=0,
                    sha256=EMPTY_SHA256,
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
                member=prefix + name,
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
    member: str,
    tar: tarfile.TarFile,
    files: list[FileEntry],
) -> None:
    mode = _norm_mode(st.st_mode)
    rewrite = family.path_bearing(comp, rel)
    info = _tarinfo(member, tarfile.REGTYPE, mode, mtime)
    if rewrite:
        data = family.normalize(path.read_bytes(), roots)
        info.size = len(data)
        sha = sha256_hex(data)
        tar.addfile(info, io.BytesIO(data))
    else:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            info.size = size
            reader = HashingReader(f)
            tar.addfile(info, reader)
            if reader.hasher.size != size:
                raise IntegrityError(f"{path} changed size while it was packed")
            sha = reader.hasher.hex
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
