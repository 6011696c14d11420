"""Hostile artifacts: generators that publish evil artifacts into a store.

Each :class:`Case` builds one artifact the way an attacker who controls the
store would: the tar is made with :mod:`tarfile` in memory, compressed with
zstd, and wrapped into a FULLY CONSISTENT artifact (layer digest and size,
``diff_id``, file list with sizes, sha256 and modes, ``unpacked_size``, config
and manifest all agree with what the tar really holds), so only the format's
rules can refuse it. ``*_lying`` variants carry a record that lies (a benign
file list or sizes over an evil tar) and exercise the checks made while the
layer streams. A few cases corrupt the store itself (missing or mismatching
blobs, a malformed ``index.json``): they need a :class:`LayoutStore`.

``Case.build(store, fp, tmp_dir)`` publishes the artifact under
``fp-<fp.hash>`` (the tag a restore with ``fp`` resolves first) and returns a
:class:`Built`. ``expect_kind`` is the failure kind a restore must report,
``message`` a regex its message must match, ``stage`` where it must be
refused: ``"resolve"`` (reading manifest or config), ``"record"`` (the layer
record, before any layer byte is downloaded) or ``"stream"`` (while the layer
is extracted into staging).

Escaping members are aimed at :data:`PWN`: ``<tmp_path>/PWN`` for a restore
into ``<tmp_path>/vol/target`` (six levels up from a member's component
directory in staging) and ``/tmp/PWN``.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import platform
import tarfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Literal

import zstandard

from artifactd.families import get_family
from artifactd.fingerprint.model import Fingerprint
from artifactd.format.config import goarch
from artifactd.format.oci import (
    ANN_FAMILY,
    ANN_FILES,
    ANN_FINGERPRINT,
    ANN_KIND,
    ANN_REF_NAME,
    ANN_SCOPE_KEY,
    ANN_TITLE,
    ARTIFACT_TYPE,
    CONFIG_MEDIA_TYPE,
    LAYER_MEDIA_TYPE,
    MANIFEST_MEDIA_TYPE,
    full_tag,
)
from artifactd.hashing import canonical_json
from artifactd.stores import Store
from artifactd.stores.layout import LayoutStore

#: The documented exit code of each failure kind under --require (docs/reference/exit-codes.md's
#: table, written out by hand so that the tests check the code against it).
EXIT = {
    "unreachable": 3,
    "not_found": 4,
    "corrupt": 5,
    "hostile": 5,
    "schema": 5,
    "no_space": 9,
    "target": 10,
}
#: File name every escaping member aims at.
PWN = "artifactd-hostile-pwn"
#: From a member's component dir in staging (<target>/.artifactd/staging-x/<family>/<comp>)
#: six '..' reach the parent of the target's parent: tmp_path in the tests.
UP6 = "/".join([".."] * 6)
#: "Several GB" of zeros for the compression bomb (the blob stays ~130 KB).
BOMB_BYTES = 4 << 30
#: Zeros after the end-of-archive marker of the trailing bomb.
TRAILING_BYTES = 256 << 20
TB10 = 10 * 10**12
EMPTY_SHA = hashlib.sha256(b"").hexdigest()

Stage = Literal["resolve", "record", "stream"]


# --------------------------------------------------------------------------
# Tar members and layers
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Member:
    """One tar member: ``kind`` is file, dir, symlink, hardlink, chr, blk or fifo."""

    name: str
    kind: str = "file"
    data: bytes = b""
    mode: int | None = None
    link: str = ""

    @property
    def tar_mode(self) -> int:
        if self.mode is not None:
            return self.mode
        return {"dir": 0o755, "symlink": 0o777}.get(self.kind, 0o644)


def f(name: str, data: bytes = b"payload\n", mode: int = 0o644) -> Member:
    return Member(name, "file", data, mode)


def d(name: str, mode: int = 0o755) -> Member:
    return Member(name, "dir", mode=mode)


def ln(name: str, target: str) -> Member:
    return Member(name, "symlink", link=target)


_TYPES = {
    "file": tarfile.REGTYPE,
    "dir": tarfile.DIRTYPE,
    "symlink": tarfile.SYMTYPE,
    "hardlink": tarfile.LNKTYPE,
    "chr": tarfile.CHRTYPE,
    "blk": tarfile.BLKTYPE,
    "fifo": tarfile.FIFOTYPE,
}


def tarinfo(m: Member) -> tarfile.TarInfo:
    info = tarfile.TarInfo(m.name)
    info.type = _TYPES[m.kind]
    info.mode = m.tar_mode
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if m.kind in ("symlink", "hardlink"):
        info.linkname = m.link
    if m.kind in ("chr", "blk"):
        info.devmajor, info.devminor = (1, 3) if m.kind == "chr" else (8, 0)
    if m.kind == "file":
        info.size = len(m.data)
    return info


def tar_bytes(members: Iterable[Member], fmt: int = tarfile.PAX_FORMAT) -> bytes:
    """The uncompressed tar of ``members``, in order (duplicates kept)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=fmt) as tar:
        for m in members:
            tar.addfile(tarinfo(m), io.BytesIO(m.data) if m.kind == "file" else None)
    return raw.getvalue()


def entry(
    path: str,
    *,
    size: int = 0,
    sha256: str = EMPTY_SHA,
    mode: int = 0o644,
    link: str | None = None,
    rewrite: bool = False,
) -> dict[str, Any]:
    """A file entry of a layer record, as JSON (no validation: it may be hostile)."""
    return {
        "path": path,
        "size": size,
        "sha256": sha256,
        "mode": mode,
        "mtime": None,
        "link": link,
        "rewrite": rewrite,
    }


def entries_of(family: str, members: Iterable[Member]) -> list[dict[str, Any]]:
    """The record an attacker writes for ``members``: as close to the truth as it can be.

    Files carry their real size and sha256 (the mode without setuid bits, which
    the schema cannot express); symlinks their target; hard links, devices and
    fifos are listed as empty files; directories are not listed.
    """
    fam = get_family(family)
    out = []
    for m in members:
        if m.kind == "dir":
            continue
        if m.kind == "symlink":
            out.append(entry(m.name, mode=0o777, link=m.link))
            continue
        parts = m.name.split("/", 1)
        rewrite = len(parts) == 2 and fam.path_bearing(parts[0], PurePosixPath(parts[1]))
        out.append(
            entry(
                m.name,
                size=len(m.data),
                sha256=hashlib.sha256(m.data).hexdigest(),
                mode=m.tar_mode & 0o777,
                rewrite=rewrite,
            )
        )
    return out


@dataclass
class Layer:
    """A family layer: the blob as stored and the record the config carries."""

    family: str
    components: list[str]
    blob: bytes
    diff_id: str
    files: list[dict[str, Any]]
    unpacked_size: int | None = None
    #: The digest/size the record and manifest claim (default: the blob's own).
    claimed_digest: str | None = None

    @property
    def digest(self) -> str:
        return self.claimed_digest or "sha256:" + hashlib.sha256(self.blob).hexdigest()

    @property
    def size(self) -> int:
        return len(self.blob)

    @property
    def unpacked(self) -> int:
        if self.unpacked_size is not None:
            return self.unpacked_size
        return sum(int(e["size"]) for e in self.files)


def compress(tar: bytes, level: int = 3) -> bytes:
    return zstandard.ZstdCompressor(level=level).compress(tar)


def layer(
    members: list[Member],
    *,
    family: str = "generic",
    components: list[str] | None = None,
    decoy: list[Member] | None = None,
    files: list[dict[str, Any]] | None = None,
    fmt: int = tarfile.PAX_FORMAT,
    tar: bytes | None = None,
) -> Layer:
    """Wrap ``members`` (or a ready ``tar``) into a layer.

    The record lists ``files``, else the entries of ``decoy`` (a lying record),
    else the entries of ``members`` (a consistent one).
    """
    raw = tar if tar is not None else tar_bytes(members, fmt)
    if files is None:
        files = entries_of(family, decoy if decoy is not None else members)
    return Layer(
        family=family,
        components=components or ["cache"],
        blob=compress(raw),
        diff_id="sha256:" + hashlib.sha256(raw).hexdigest(),
        files=files,
    )


# --------------------------------------------------------------------------
# Artifact documents and publishing
# --------------------------------------------------------------------------


def record(fp: Fingerprint, lay: Layer) -> dict[str, Any]:
    fam = get_family(lay.family)
    return {
        "family": lay.family,
        "scope_key": fp.scope_key(fam.name, fam.scope, fam.scope_revision),
        "scope": fp.select(fam.scope),
        "components": list(lay.components),
        "files": lay.files,
        "skipped": [],
        "pinned_paths": [],
        "facts": {},
        "digest": lay.digest,
        "size": lay.size,
        "diff_id": lay.diff_id,
        "unpacked_size": lay.unpacked,
    }


def config_doc(fp: Fingerprint, layers: list[Layer]) -> dict[str, Any]:
    return {
        "architecture": goarch(platform.machine()),
        "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": [lay.diff_id for lay in layers]},
        "schema_version": 1,
        "kind": "full",
        "fingerprint": fp.model_dump(mode="json"),
        "fingerprint_hash": fp.hash,
        "layers": [record(fp, lay) for lay in layers],
        "provenance": {"builder": "tests/hostile.py", "source": "harvest"},
    }


def layer_descriptor(fp: Fingerprint, lay: Layer) -> dict[str, Any]:
    return {
        "mediaType": LAYER_MEDIA_TYPE,
        "digest": lay.digest,
        "size": lay.size,
        "annotations": {
            ANN_TITLE: f"{lay.family}.tar.zst",
            ANN_FAMILY: lay.family,
            ANN_SCOPE_KEY: record(fp, lay)["scope_key"],
            ANN_FILES: str(len(lay.files)),
        },
    }


def manifest_doc(fp: Fingerprint, config: bytes, layers: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "artifactType": ARTIFACT_TYPE,
        "config": {
            "mediaType": CONFIG_MEDIA_TYPE,
            "digest": "sha256:" + hashlib.sha256(config).hexdigest(),
            "size": len(config),
        },
        "layers": layers,
        "annotations": {ANN_FINGERPRINT: fp.hash, ANN_KIND: "full"},
    }


@dataclass
class Built:
    """What a case published."""

    tag: str
    manifest_digest: str
    config_digest: str
    layer_digests: list[str] = field(default_factory=list)


def put_blob(store: Store, data: bytes, tmp_dir: Path) -> str:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    tmp_dir.mkdir(parents=True, exist_ok=True)
    path = tmp_dir / f"blob-{digest[7:]}"
    path.write_bytes(data)
    try:
        store.put_blob(path, digest, len(data))
    finally:
        path.unlink(missing_ok=True)
    return digest


def publish(
    store: Store,
    fp: Fingerprint,
    tmp_dir: Path,
    layers: list[Layer],
    *,
    config: bytes | dict[str, Any] | None = None,
    descriptors: list[dict[str, Any]] | None = None,
    upload: bool = True,
) -> Built:
    """Upload the layer blobs and the config, then the manifest tagged ``fp-<fp.hash>``."""
    tmp_dir.mkdir(parents=True, exist_ok=True)
    digests = []
    for lay in layers:
        if upload:
            put_blob(store, lay.blob, tmp_dir)
        digests.append(lay.digest)
    if config is None:
        config = config_doc(fp, layers)
    cfg = canonical_json(config) if isinstance(config, dict) else config
    cfg_digest = put_blob(store, cfg, tmp_dir)
    if descriptors is None:
        descriptors = [layer_descriptor(fp, lay) for lay in layers]
    data = canonical_json(manifest_doc(fp, cfg, descriptors))
    tag = full_tag(fp.hash)
    digest = store.put_manifest(data, MANIFEST_MEDIA_TYPE, [tag])
    return Built(tag, digest, cfg_digest, digests)


def layout(store: Store) -> LayoutStore:
    assert isinstance(store, LayoutStore), "this case corrupts a local OCI layout"
    return store


def blob_path(store: Store, digest: str) -> Path:
    return layout(store).root / "blobs" / "sha256" / digest.split(":", 1)[1]


# --------------------------------------------------------------------------
# Compression bombs (streamed: gigabytes of zeros never sit in memory)
# --------------------------------------------------------------------------

_ZEROS = bytes(8 << 20)

#: sha256 of ``prefix + n zero bytes``, keyed by (sha256 of prefix, n): hashing
#: gigabytes of zeros takes seconds, so the values for the bombs below are kept
#: here. A key that is not listed (another Python writes other tar headers, or
#: the sizes change) is computed, so a stale table costs time, never correctness.
_KNOWN_ZERO_HASHES = {
    (EMPTY_SHA, 4 << 30): "8479e43911dc45e89f934fe48d01297e16f51d17aa561d4d1c216b1ae0fcddca",
    # _bomb_head(4 << 30): the PAX headers of cache/ and cache/zeros, then zeros.
    (
        "9426c3f923acc5ed7604f855f6114df237081f3a2a0ef5a0ad75f6b466d50abb",
        4294972416,
    ): "639212b91682df781314f04e37250a33ec8f5da51eb26b4c21b7db5ad76a6fab",
}


def sha256_zeros_after(prefix: bytes, n: int) -> str:
    """sha256 of ``prefix`` followed by ``n`` zero bytes."""
    key = (hashlib.sha256(prefix).hexdigest(), n)
    if key in _KNOWN_ZERO_HASHES:
        return _KNOWN_ZERO_HASHES[key]
    h = hashlib.sha256(prefix)
    full, rest = divmod(n, len(_ZEROS))
    for _ in range(full):
        h.update(_ZEROS)
    h.update(_ZEROS[:rest])
    return h.hexdigest()


def _compress_zeros_after(prefix: bytes, n: int) -> bytes:
    """zstd of ``prefix`` and ``n`` zero bytes, streamed (the zeros never sit in memory)."""
    out = io.BytesIO()
    with zstandard.ZstdCompressor(level=3).stream_writer(out, closefd=False) as zw:
        zw.write(prefix)
        full, rest = divmod(n, len(_ZEROS))
        for _ in range(full):
            zw.write(_ZEROS)
        zw.write(_ZEROS[:rest])
    return out.getvalue()


def _bomb_head(n: int) -> tuple[bytes, int]:
    """Headers of a tar holding ``cache/`` and ``cache/zeros`` (``n`` zero bytes).

    Everything after the headers is zeros: the file data, its padding, the
    end-of-archive blocks and the record padding. Returns (headers, zeros).
    """
    info = tarinfo(f("cache/zeros"))
    info.size = n
    head = b"".join(
        t.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape") for t in (tarinfo(d("cache")), info)
    )
    total = len(head) + -(-n // 512) * 512 + 1024
    total = -(-total // tarfile.RECORDSIZE) * tarfile.RECORDSIZE
    return head, total - len(head)


@functools.cache
def bomb_tar(n: int = BOMB_BYTES) -> tuple[bytes, str, str]:
    """(blob, diff_id, file sha256) of a tar holding ``cache/zeros``: ``n`` zero bytes."""
    head, zeros = _bomb_head(n)
    diff_id = "sha256:" + sha256_zeros_after(head, zeros)
    return _compress_zeros_after(head, zeros), diff_id, sha256_zeros_after(b"", n)


@functools.cache
def trailing_bomb(n: int = TRAILING_BYTES) -> tuple[bytes, str]:
    """(blob, diff_id): an honest tiny tar followed by ``n`` zero bytes."""
    head = tar_bytes([d("cache"), f("cache/a")])
    return _compress_zeros_after(head, n), "sha256:" + sha256_zeros_after(head, n)


# --------------------------------------------------------------------------
# The cases
# --------------------------------------------------------------------------

Build = Callable[[Store, Fingerprint, Path], Built]


@dataclass(frozen=True)
class Case:
    """One hostile artifact and the failure a restore of it must end with."""

    name: str
    build: Build
    expect_kind: str
    message: str
    stage: Stage
    layout_only: bool = False
    #: Passed as --max-bytes (the honest bomb would otherwise really unpack 4 GB).
    max_bytes: int | None = None
    #: Files an escape would create, relative to the test's tmp_path, or absolute.
    escapes: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return f"Case({self.name})"


CASES: list[Case] = []


def case(
    name: str,
    kind: str,
    stage: Stage,
    message: str,
    **kw: Any,
) -> Callable[[Build], Build]:
    def register(fn: Build) -> Build:
        CASES.append(Case(name, fn, kind, message, stage, **kw))
        return fn

    return register


def simple(
    name: str,
    kind: str,
    stage: Stage,
    message: str,
    members: list[Member],
    *,
    decoy: list[Member] | None = None,
    family: str = "generic",
    fmt: int = tarfile.PAX_FORMAT,
    **kw: Any,
) -> None:
    """Register a case whose artifact is one layer of ``members``."""

    def build(store: Store, fp: Fingerprint, tmp: Path) -> Built:
        return publish(store, fp, tmp, [layer(members, decoy=decoy, family=family, fmt=fmt)])

    CASES.append(Case(name, build, kind, message, stage, **kw))


ROOT = d("cache")
SUB = d("cache/sub")


def honest(store: Store, fp: Fingerprint, tmp: Path) -> Built:
    """The control: a well-formed generic layer that restores."""
    return publish(
        store,
        fp,
        tmp,
        [layer([ROOT, f("cache/a", b"A" * 100), SUB, f("cache/sub/k.so", b"\x7fELF", 0o755)])],
    )


# -- names ------------------------------------------------------------------
simple("traversal", "hostile", "record", r"'\.\.'", [ROOT, f("cache/../x")])
simple(
    "traversal_lying",
    "hostile",
    "stream",
    r"'\.\.'",
    [ROOT, f(f"cache/{UP6}/{PWN}")],
    decoy=[f(f"cache/{PWN}")],
    escapes=(PWN,),
)
simple(
    "absolute_name",
    "hostile",
    "record",
    "absolute",
    [ROOT, f(f"/tmp/{PWN}")],
    escapes=(f"/tmp/{PWN}",),
)
simple(
    "absolute_name_lying",
    "hostile",
    "stream",
    "absolute",
    [ROOT, f(f"/tmp/{PWN}")],
    decoy=[f("cache/x")],
    escapes=(f"/tmp/{PWN}",),
)
simple(
    "config_path_dotdot",
    "hostile",
    "record",
    r"'\.\.'",
    [ROOT, f("cache/x")],
    decoy=[f("cache/sub/../../x")],
)
simple(
    "component_named_file",
    "hostile",
    "record",
    "component directory",
    [f("cache", b"i am not a directory")],
)
simple(
    "component_named_file_lying",
    "hostile",
    "stream",
    "component directory",
    [f("cache", b"i am not a directory")],
    decoy=[f("cache/cache", b"i am not a directory")],
)
simple(
    "long_name_part",
    "hostile",
    "record",
    "over 255 bytes",
    [ROOT, f("cache/" + "n" * 300)],
)
simple(
    "long_name_part_lying",
    "hostile",
    "stream",
    "over 255 bytes",
    [ROOT, f("cache/" + "n" * 300)],
    decoy=[f("cache/n")],
)
# GNU tar's "tar -C dir -cf x.tar ." starts with a "./" member.
simple(
    "dot_member",
    "hostile",
    "stream",
    r"member '\.'",
    [d("./"), ROOT, f("cache/a")],
    decoy=[f("cache/a")],
)
simple("dot_path_in_config", "hostile", "record", r"'\.'", [ROOT, f(".")])
DEEP = "cache/" + "d/" * 1500 + "f"
simple("deep_path", "hostile", "record", "bytes long", [ROOT, f(DEEP)])
simple(
    "deep_path_lying",
    "hostile",
    "stream",
    "bytes long",
    [ROOT] + [d("cache/" + "d/" * i) for i in range(1, 1501)] + [f(DEEP)],
    decoy=[f("cache/f")],
)
simple(
    "non_utf8_member_name",
    "hostile",
    "stream",
    "not in the manifest|not UTF-8",
    [ROOT, f("cache/\udcff\udcfe")],
    decoy=[f("cache/x")],
    fmt=tarfile.GNU_FORMAT,
)
simple(
    "unknown_component",
    "hostile",
    "record",
    "outside the layer's components",
    [ROOT, d("evil"), f("evil/x")],
)


@case("unknown_component_declared", "hostile", "record", r"\['evil'\].*does not have")
def _unknown_component_declared(store: Store, fp: Fingerprint, tmp: Path) -> Built:
    members = [ROOT, f("cache/a"), d("evil"), f("evil/x")]
    return publish(store, fp, tmp, [layer(members, components=["cache", "evil"])])


# -- links ------------------------------------------------------------------
simple(
    "symlink_escape_write",
    "hostile",
    "record",
    "leaves root",
    [ROOT, ln("cache/l", UP6), f(f"cache/l/{PWN}")],
    escapes=(PWN,),
)
simple(
    "symlink_escape_write_lying",
    "hostile",
    "stream",
    "leaves its root",
    [ROOT, ln("cache/l", UP6), f(f"cache/l/{PWN}")],
    decoy=[f(f"cache/{PWN}")],
    escapes=(PWN,),
)
simple(
    "symlink_tmp_write",
    "hostile",
    "record",
    "leaves root",
    [ROOT, ln("cache/l", "/tmp"), f(f"cache/l/{PWN}")],
    escapes=(f"/tmp/{PWN}",),
)
simple(
    "symlink_tmp_write_lying",
    "hostile",
    "stream",
    "leaves its root",
    [ROOT, ln("cache/l", "/tmp"), f(f"cache/l/{PWN}")],
    decoy=[f("cache/x")],
    escapes=(f"/tmp/{PWN}",),
)
simple(
    "symlink_inside_then_write_through",
    "hostile",
    "record",
    "listed as a file and holds other members",
    [ROOT, SUB, ln("cache/l", "sub"), f(f"cache/l/{PWN}")],
)
simple(
    "symlink_inside_then_write_through_lying",
    "hostile",
    "stream",
    "not in the manifest",
    [ROOT, SUB, ln("cache/l", "sub"), f(f"cache/l/{PWN}")],
    decoy=[ln("cache/l", "sub"), f(f"cache/sub/{PWN}")],
)
simple("symlink_absolute", "hostile", "record", "leaves root", [ROOT, ln("cache/p", "/etc/passwd")])
simple(
    "symlink_absolute_lying",
    "hostile",
    "stream",
    "leaves its root",
    [ROOT, ln("cache/p", "/etc/passwd")],
    decoy=[ln("cache/p", "passwd")],
)
simple(
    "symlink_dangling_outside",
    "hostile",
    "record",
    "leaves root",
    [ROOT, ln("cache/dangling", f"{UP6}/{PWN}-missing")],
)
simple(
    "symlink_chain_escape",
    "hostile",
    "stream",
    "resolves outside root",
    [ROOT, ln("cache/y", "."), ln("cache/b", "y/y/../..")],
)
simple(
    "hardlink_escape",
    "hostile",
    "stream",
    "hard link",
    [ROOT, Member("cache/h", "hardlink", link="/etc/passwd")],
)
simple(
    "hardlink_relative_escape",
    "hostile",
    "stream",
    "hard link",
    [ROOT, Member("cache/h", "hardlink", link=f"cache/{UP6}/{PWN}")],
)
simple(
    "hardlink_inside",
    "hostile",
    "stream",
    "hard link",
    [ROOT, f("cache/a"), Member("cache/h", "hardlink", link="cache/a")],
)

# -- types and modes ----------------------------------------------------------
simple("char_device", "hostile", "stream", "device or fifo", [ROOT, Member("cache/null", "chr")])
simple("block_device", "hostile", "stream", "device or fifo", [ROOT, Member("cache/sda", "blk")])
simple("fifo", "hostile", "stream", "device or fifo", [ROOT, Member("cache/pipe", "fifo")])
for _name, _mode in (("setuid", 0o4755), ("setgid", 0o2755), ("sticky", 0o1644)):
    simple(
        f"{_name}_file",
        "hostile",
        "stream",
        "setuid/setgid/sticky",
        [ROOT, f("cache/bin", b"\x7fELF", _mode)],
    )
simple("sticky_dir", "hostile", "stream", "setuid/setgid/sticky", [ROOT, d("cache/t", 0o1777)])
simple(
    "world_writable_dir",
    "hostile",
    "stream",
    "only 0755",
    [ROOT, d("cache/sub", 0o777), f("cache/sub/a")],
)
simple(
    "file_mode_0777", "hostile", "record", "only 0644 and 0755", [ROOT, f("cache/a", mode=0o777)]
)
simple(
    "file_mode_0777_lying",
    "corrupt",
    "stream",
    "mode 0777 differs",
    [ROOT, f("cache/a", mode=0o777)],
    decoy=[f("cache/a", mode=0o644)],
)


@case("setuid_in_config", "schema", "resolve", r"mode")
def _setuid_in_config(store: Store, fp: Fingerprint, tmp: Path) -> Built:
    lay = layer([ROOT, f("cache/bin", b"\x7fELF", 0o4755)])
    lay.files[0]["mode"] = 0o4755
    return publish(store, fp, tmp, [lay])


# -- duplicates and structure ---------------------------------------------------
simple(
    "duplicate_member",
    "hostile",
    "record",
    "listed twice",
    [ROOT, f("cache/a", b"first"), f("cache/a", b"first")],
)
simple(
    "duplicate_member_lying",
    "hostile",
    "stream",
    "appears twice",
    [ROOT, f("cache/a", b"first"), f("cache/a", b"second")],
    decoy=[f("cache/a", b"first")],
)
simple(
    "file_under_file",
    "hostile",
    "record",
    "listed as a file and holds other members",
    [ROOT, f("cache/a"), f("cache/a/b")],
)


@case("empty_layer", "corrupt", "stream", "carries no directory")
def _empty_layer(store: Store, fp: Fingerprint, tmp: Path) -> Built:
    return publish(store, fp, tmp, [layer([], files=[])])


@case("empty_layer_with_files", "corrupt", "stream", "lacks 1 listed file")
def _empty_layer_with_files(store: Store, fp: Fingerprint, tmp: Path) -> Built:
    return publish(store, fp, tmp, [layer([], decoy=[f("cache/a")])])


@case("empty_blob", "corrupt", "stream", "not a valid tar stream")
def _empty_blob(store: Store, fp: Fingerprint, tmp: Path) -> Built:
    lay = Layer("generic", ["cache"], b"", "sha256:" + EMPTY_SHA, [])
    return publish(store, fp, tmp, [lay])


@case("component_missing", "corrupt", "stream", "declares component 'jit'")
def _component_missing(store: Store, fp: Fingerprint, tmp: Path) -> Built:
    lay = layer([ROOT, f("cache/a")], family="sglang", components=["cache", "jit"])
    return publish(store, fp, tmp, [lay])


@case("truncated_tar", "corrupt", "stream", "not a valid tar stream")
def _truncated_tar(store: Store, fp: Fingerprint, tmp: Path) -> Built:
    members = [ROOT, f("cache/a", os.urandom(64 << 10))]
    raw = tar_bytes(members)
    return publish(store, fp, tmp, [layer(members, tar=raw[: 512 * 3 + (32 << 10)])])


@case("truncated_zstd", "corrupt", "stream", "not a valid (tar|zstd)")
def _truncated_zstd(store: Store, fp: Fingerprint, tmp: Path) -> Built:
    members = [ROOT, f("cache/a", os.urandom(64 << 10))]
    lay = layer(members)
    lay.blob = lay.blob[: len(lay.blob) // 2]
    return publish(store, fp, tmp, [lay])


# -- sizes and bombs ----------------------------------------------------------


@case("claims_10tb_file", "no_space", "record", r"needs .* MiB on .* MiB are free")
def _claims_10tb_file(store: Store, fp: Fingerprint, tmp: Path) -> Built:
    lay = layer([ROOT, f("cache/huge", b"tiny")])
    lay.files[0]["size"] = TB10
    return publish(store, fp, tmp, [lay])


@case("claims_10tb_file_max_bytes", "no_space", "record", "max-bytes", max_bytes=1 << 30)
def _claims_10tb_file_max_bytes(store: Store, fp: Fingerprint, tmp: Path) -> Built:
    return _claims_10tb_file(store, fp, tmp)


@case("claims_10tb_unpacked", "corrupt", "record", "unpacked_size")
def _claims_10tb_unpacked(store: Store, fp: Fingerprint, tmp: Path) -> Built:
    lay = layer([ROOT, f("cache/a")])
    lay.unpacked_size = TB10
    return publish(store, fp, tmp, [lay])


@case("bomb_honest_max_bytes", "no_space", "record", "max-bytes", max_bytes=64 << 20)
def _bomb_honest(store: Store, fp: Fingerprint, tmp: Path) -> Built:
    blob, diff_id, sha = bomb_tar()
    files = [entry("cache/zeros", size=BOMB_BYTES, sha256=sha)]
    return publish(store, fp, tmp, [Layer("generic", ["cache"], blob, diff_id, files)])


@case("bomb_lying_sizes", "corrupt", "stream", r"size \d+ differs from manifest 1024")
def _bomb_lying(store: Store, fp: Fingerprint, tmp: Path) -> Built:
    blob, diff_id, _ = bomb_tar()
    files = [entry("cache/zeros", size=1024, sha256=hashlib.sha256(bytes(1024)).hexdigest())]
    return publish(store, fp, tmp, [Layer("generic", ["cache"], blob, diff_id, files)])


@case("bomb_after_end_of_archive", "corrupt", "stream", "decompresses to more than")
def _bomb_trailing(store: Store, fp: Fingerprint, tmp: Path) -> Built:
    blob, diff_id = trailing_bomb()
    return publish(
        store,
        fp,
        tmp,
        [Layer("generic", ["cache"], blob, diff_id, entries_of("generic", [f("cache/a")]))],
    )


@case("zstd_huge_window", "corrupt", "stream", "not valid zstd")
def _zstd_huge_window(store: Store, fp: Fingerprint, tmp: Path) -> Built:
    members = [ROOT, f("cache/a")]
    raw = tar_bytes(members)
    params = zstandard.ZstdCompressionParameters.from_level(3, window_log=31)
    out = io.BytesIO()
    with zstandard.ZstdCompressor(compression_params=params).stream_writer(
        out, closefd=False
    ) as zw:
        zw.write(raw)
    lay = layer(members)
    lay.blob = out.getvalue()
    return publish(store, fp, tmp, [lay])


# -- file bytes against the record ------------------------------------------------


@case("file_bytes_not_their_sha256", "corrupt", "stream", "does not match its sha256")
def _file_bytes_not_their_sha256(store: Store, fp: Fingerprint, tmp: Path) -> Built:
    """A consistent blob whose record claims other bytes for one file (same size)."""
    lay = layer([ROOT, f("cache/a", b"payload\n")])
    lay.files[0]["sha256"] = hashlib.sha256(b"PAYLOAD\n").hexdigest()
    return publish(store, fp, tmp, [lay])


@case("file_bytes_not_their_sha256_mid_batch", "corrupt", "stream", "c/k2: content does not")
def _mid_batch(store: Store, fp: Fingerprint, tmp: Path) -> Built:
    """The third of five small files (one writer's batch) is not what the record says."""
    files = [f(f"cache/c/k{i}", f"kernel {i}\n".encode()) for i in range(5)]
    lay = layer([ROOT, d("cache/c"), *files])
    (third,) = [e for e in lay.files if e["path"].endswith("/k2")]
    third["sha256"] = hashlib.sha256(b"kernel X\n").hexdigest()
    return publish(store, fp, tmp, [lay])


# -- path rewriting -------------------------------------------------------------
TRITON_KEY = "Q" * 52


@case("rewrite_non_utf8", "corrupt", "stream", "cannot be rewritten")
def _rewrite_non_utf8(store: Store, fp: Fingerprint, tmp: Path) -> Built:
    members = [
        d("cache"),
        d(f"cache/{TRITON_KEY}"),
        f(f"cache/{TRITON_KEY}/__grp__k.json", b"\xff\xfe{\x80"),
    ]
    lay = layer(members, family="triton")
    assert lay.files[0]["rewrite"] is True
    return publish(store, fp, tmp, [lay])


@case("rewrite_1gib_claimed", "hostile", "record", "path rewriting")
def _rewrite_huge(store: Store, fp: Fingerprint, tmp: Path) -> Built:
    name = f"cache/{TRITON_KEY}/__grp__k.json"
    members = [d("cache"), d(f"cache/{TRITON_KEY}"), f(name, b"{}")]
    lay = layer(members, family="triton")
    lay.files[0].update(size=1 << 30, rewrite=True)
    return publish(store, fp, tmp, [lay])


# -- documents: schema ------------------------------------------------------------


@case("schema_version_999", "schema", "resolve", "schema_version")
def _schema_999(store: Store, fp: Fingerprint, tmp: Path) -> Built:
    lays = [layer([ROOT, f("cache/a")])]
    cfg = config_doc(fp, lays)
    cfg["schema_version"] = 999
    return publish(store, fp, tmp, lays, config=cfg)


@case("config_not_json", "schema", "resolve", "not an artifactd manifest")
def _config_not_json(store: Store, fp: Fingerprint, tmp: Path) -> Built:
    lays = [layer([ROOT, f("cache/a")])]
    return publish(store, fp, tmp, lays, config=b'{"architecture": "amd64", "layers": [')


@case("file_entry_bad_sha", "schema", "resolve", "sha256")
def _bad_sha(store: Store, fp: Fingerprint, tmp: Path) -> Built:
    lay = layer([ROOT, f("cache/a")])
    lay.files[0]["sha256"] = "zz"
    return publish(store, fp, tmp, [lay])


# -- documents: consistency of manifest, config and blobs ---------------------------


@case("manifest_layer_other_digest", "corrupt", "resolve", "does not carry")
def _manifest_other_digest(store: Store, fp: Fingerprint, tmp: Path) -> Built:
    lay = layer([ROOT, f("cache/a")])
    other = layer([ROOT, f("cache/b")])
    put_blob(store, other.blob, tmp)
    return publish(store, fp, tmp, [lay], descriptors=[layer_descriptor(fp, other)])


@case("manifest_layer_other_size", "corrupt", "resolve", "does not carry")
def _manifest_other_size(store: Store, fp: Fingerprint, tmp: Path) -> Built:
    lay = layer([ROOT, f("cache/a")])
    desc = layer_descriptor(fp, lay)
    desc["size"] += 1
    return publish(store, fp, tmp, [lay], descriptors=[desc])


@case("manifest_extra_layer", "corrupt", "resolve", "manifest")
def _manifest_extra_layer(store: Store, fp: Fingerprint, tmp: Path) -> Built:
    lay = layer([ROOT, f("cache/a")])
    extra = layer([ROOT, f(f"cache/{PWN}")])
    put_blob(store, extra.blob, tmp)
    descs = [layer_descriptor(fp, lay), layer_descriptor(fp, extra)]
    return publish(store, fp, tmp, [lay], descriptors=descs)


@case(
    "layer_blob_mismatch",
    "corrupt",
    "stream",
    r"digest mismatch|expected \d+ bytes|more than the",
    layout_only=True,
)
def _layer_blob_mismatch(store: Store, fp: Fingerprint, tmp: Path) -> Built:
    members = [ROOT, f("cache/a", b"A" * 4096)]
    lay = layer(members)
    built = publish(store, fp, tmp, [lay])
    # Same files, other compression: every file hash holds, only the layer digest lies.
    blob_path(store, lay.digest).write_bytes(compress(tar_bytes(members), level=19))
    return built


@case("layer_blob_flipped", "corrupt", "stream", "digest|not a valid|sha256", layout_only=True)
def _layer_blob_flipped(store: Store, fp: Fingerprint, tmp: Path) -> Built:
    lay = layer([ROOT, f("cache/a", b"A" * 4096)])
    built = publish(store, fp, tmp, [lay])
    data = bytearray(lay.blob)
    data[-1] ^= 0x01
    blob_path(store, lay.digest).write_bytes(bytes(data))
    return built


@case("config_blob_mismatch", "corrupt", "resolve", "does not match its digest", layout_only=True)
def _config_blob_mismatch(store: Store, fp: Fingerprint, tmp: Path) -> Built:
    built = publish(store, fp, tmp, [layer([ROOT, f("cache/a")])])
    path = blob_path(store, built.config_digest)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    return built


@case("manifest_blob_mismatch", "corrupt", "resolve", "corrupt", layout_only=True)
def _manifest_blob_mismatch(store: Store, fp: Fingerprint, tmp: Path) -> Built:
    built = publish(store, fp, tmp, [layer([ROOT, f("cache/a")])])
    path = blob_path(store, built.manifest_digest)
    path.write_bytes(path.read_bytes().replace(b'"schemaVersion":2', b'"schemaVersion":3'))
    return built


@case("tag_missing_manifest", "corrupt", "resolve", "missing blob", layout_only=True)
def _tag_missing_manifest(store: Store, fp: Fingerprint, tmp: Path) -> Built:
    built = publish(store, fp, tmp, [layer([ROOT, f("cache/a")])])
    blob_path(store, built.manifest_digest).unlink()
    return built


@case("tag_missing_config", "not_found", "resolve", "no blob", layout_only=True)
def _tag_missing_config(store: Store, fp: Fingerprint, tmp: Path) -> Built:
    built = publish(store, fp, tmp, [layer([ROOT, f("cache/a")])])
    blob_path(store, built.config_digest).unlink()
    return built


@case("tag_missing_layer", "not_found", "stream", "no blob", layout_only=True)
def _tag_missing_layer(store: Store, fp: Fingerprint, tmp: Path) -> Built:
    lay = layer([ROOT, f("cache/a")])
    return publish(store, fp, tmp, [lay], upload=False)


def _index_entries(store: Store, bad: list[Any]) -> None:
    index_path = layout(store).root / "index.json"
    index = json.loads(index_path.read_bytes())
    index["manifests"] = bad + index["manifests"]
    index_path.write_text(json.dumps(index))


@case("index_entry_without_digest", "corrupt", "resolve", "index.json", layout_only=True)
def _index_no_digest(store: Store, fp: Fingerprint, tmp: Path) -> Built:
    built = publish(store, fp, tmp, [layer([ROOT, f("cache/a")])])
    _index_entries(
        store, [{"mediaType": MANIFEST_MEDIA_TYPE, "annotations": {ANN_REF_NAME: built.tag}}]
    )
    return built


@case("index_entry_not_an_object", "corrupt", "resolve", "index.json", layout_only=True)
def _index_string(store: Store, fp: Fingerprint, tmp: Path) -> Built:
    built = publish(store, fp, tmp, [layer([ROOT, f("cache/a")])])
    _index_entries(store, [built.tag])
    return built


CASE_NAMES = [c.name for c in CASES]
assert len(set(CASE_NAMES)) == len(CASE_NAMES), "case names repeat"


def get_case(name: str) -> Case:
    return next(c for c in CASES if c.name == name)
