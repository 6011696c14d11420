"""The extractor's tight path: the record checked once, dirs up front, the download read ahead.

:func:`artifactd.format.unpack.unpack_layer` is held here to how it works, not
how fast: the blob keeps being read while the extractor is held up on a
member (so a registry download and the disk work overlap), every directory the
record implies exists before the first file is written, and the members the
record vouches for are matched without building a path object each, their
plain ustar headers read without tarfile (a header read so reads as tarfile
reads it; a global PAX header sends what follows back to tarfile), while
zstd and the files' sha256 run off the thread that parses. The rules
themselves are held by the hostile-layer corpus (tests/hostile.py).
"""

from __future__ import annotations

import hashlib
import io
import itertools
import os
import pathlib
import tarfile
import threading
from pathlib import Path, PurePosixPath
from types import SimpleNamespace
from typing import Any

import pytest
import zstandard
from hypothesis import example, given, settings
from hypothesis import strategies as st
from layers import pack, record

import artifactd.format.unpack as unpack_mod
from artifactd import fsutil, hashing
from artifactd.errors import IntegrityError, UnsafeArtifactError
from artifactd.families import get_family
from artifactd.families.base import Located
from artifactd.format.archive import PackedLayer
from artifactd.format.config import FileEntry
from artifactd.format.unpack import unpack_layer

#: A generous ceiling for an event that comes at once when the code is right.
PATIENCE = 30.0


class _Blob:
    """A layer file whose reader tells when the last byte has been read."""

    def __init__(self, path: Path) -> None:
        self._f = path.open("rb")
        self.eof = threading.Event()

    def read(self, n: int = -1, /) -> bytes:
        data = self._f.read(n)
        if not data:
            self.eof.set()
        return data

    def close(self) -> None:
        self._f.close()


def _pack(src: Path, out: Path) -> PackedLayer:
    family = get_family("generic")
    return pack(family, [Located(family.components[0], src)], out)


def _unpack(
    layer: PackedLayer, blob: _Blob, staging: Path, entries: list[FileEntry], relocate: object
) -> int:
    rec = record(layer)
    res = unpack_layer(
        blob,
        digest=layer.digest,
        size=layer.size,
        entries=entries,
        staging=staging,
        components=frozenset(rec.components),
        relocate=relocate,  # type: ignore[arg-type]
        record=rec,
        prefix=rec.family,
    )
    return res.files


def _marked_first(layer: PackedLayer, name: str) -> list[FileEntry]:
    """The layer's entries with ``name`` marked for rewriting (relocate runs on it, in order)."""
    return [e.model_copy(update={"rewrite": e.path == name}) for e in layer.files]


def test_the_blob_is_read_to_its_end_while_the_extractor_waits_on_a_member(
    tmp_path: Path,
) -> None:
    """Download and extraction overlap: a held-up member does not hold up the download."""
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.json").write_bytes(b'{"root": "x"}')
    for i in range(8):  # 8 MiB that does not compress: many zstd reads of the blob
        (src / "sub" / f"blob{i}.bin").write_bytes(os.urandom(1 << 20))
    layer = _pack(src, tmp_path / "layer.tar.zst")
    blob = _Blob(layer.path)
    waited: list[bool] = []

    def relocate(path: str, data: bytes) -> bytes:
        # The first member: the extractor is held here until the blob has been read through.
        waited.append(blob.eof.wait(PATIENCE))
        return data

    try:
        files = _unpack(
            layer, blob, tmp_path / "stage", _marked_first(layer, "cache/a.json"), relocate
        )
    finally:
        blob.close()
    assert waited == [True], "the blob was not read ahead while the extractor was busy"
    assert files == 9
    assert (tmp_path / "stage" / "cache" / "sub" / "blob7.bin").read_bytes() == (
        src / "sub" / "blob7.bin"
    ).read_bytes()


def test_every_directory_of_the_record_exists_before_the_first_file(tmp_path: Path) -> None:
    src = tmp_path / "src"
    for d in ("k1/x", "k2", "k3/y/z"):
        (src / d).mkdir(parents=True)
        (src / d / "f.bin").write_bytes(d.encode())
    (src / "a.json").write_bytes(b"{}")
    layer = _pack(src, tmp_path / "layer.tar.zst")
    staging = tmp_path / "stage"
    seen: list[list[str]] = []

    def relocate(path: str, data: bytes) -> bytes:
        seen.append(sorted(str(p.relative_to(staging)) for p in staging.rglob("*")))
        return data

    blob = _Blob(layer.path)
    try:
        _unpack(layer, blob, staging, _marked_first(layer, "cache/a.json"), relocate)
    finally:
        blob.close()
    dirs = ["cache", "cache/k1", "cache/k1/x", "cache/k2", "cache/k3", "cache/k3/y", "cache/k3/y/z"]
    assert seen == [dirs]  # every directory, and not one file yet
    assert (staging / "cache" / "k3" / "y" / "z" / "f.bin").read_bytes() == b"k3/y/z"


def test_members_the_record_vouches_for_build_no_path_object(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per-member work is string work: names were checked once, against the record."""
    src = tmp_path / "src"
    for i in range(300):
        d = src / f"k{i % 30:02d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"kernel{i}.cubin").write_bytes(b"%d" % i * 100)
    layer = _pack(src, tmp_path / "layer.tar.zst")
    made: list[str] = []

    class Counted(PurePosixPath):
        def __new__(cls, *args: str) -> Counted:
            made.append("/".join(args))
            return super().__new__(cls, *args)

    monkeypatch.setattr(pathlib, "PurePosixPath", Counted)  # what a lazy import would get
    blob = _Blob(layer.path)
    try:
        files = _unpack(layer, blob, tmp_path / "stage", layer.files, None)
    finally:
        blob.close()
    assert files == 300
    assert made == []
    assert (tmp_path / "stage" / "cache" / "k29" / "kernel299.cubin").read_bytes() == b"299" * 100


def _kernels(src: Path, count: int) -> None:
    for i in range(count):
        d = src / f"k{i % 30:02d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"kernel{i}.cubin").write_bytes(b"%d" % i * 100)


def test_members_the_record_vouches_for_are_read_without_tarfile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Their plain ustar headers are read by the extractor: a layer artifactd packed, to its end.

    Names too long for the ustar field (PAX headers, as Inductor's cache has
    them) and a file over 1 MiB (streamed) included.
    """
    _kernels(tmp_path / "src", 300)
    deep = tmp_path / "src" / ("a" * 60) / ("b" * 52)
    deep.mkdir(parents=True)
    (deep / ("c" * 52)).write_bytes(b"long name")  # cache/ + 167 characters: a PAX path
    (tmp_path / "src" / "large.bin").write_bytes(os.urandom(3 << 20))
    layer = _pack(tmp_path / "src", tmp_path / "layer.tar.zst")
    assert max(len(e.path) for e in layer.files) > 100
    parsed: list[str] = []
    real = tarfile.TarInfo.fromtarfile.__func__  # type: ignore[attr-defined]

    def counted(cls: type[tarfile.TarInfo], tar: tarfile.TarFile) -> tarfile.TarInfo:
        info: tarfile.TarInfo = real(cls, tar)
        parsed.append(info.name)
        return info

    monkeypatch.setattr(tarfile.TarInfo, "fromtarfile", classmethod(counted))
    blob = _Blob(layer.path)
    try:
        files = _unpack(layer, blob, tmp_path / "stage", layer.files, None)
    finally:
        blob.close()
    assert files == 302
    # Not one: the family directory, the tree document and the end are read by the extractor.
    assert parsed == []
    assert (tmp_path / "stage" / "cache" / "k29" / "kernel299.cubin").read_bytes() == b"299" * 100
    long_name = tmp_path / "stage" / "cache" / ("a" * 60) / ("b" * 52) / ("c" * 52)
    assert long_name.read_bytes() == b"long name"
    large = (tmp_path / "stage" / "cache" / "large.bin").read_bytes()
    assert large == (tmp_path / "src" / "large.bin").read_bytes()


def _pax_member(records: bytes, member: tarfile.TarInfo) -> bytes:
    """A PAX extended header holding ``records``, then ``member``'s ustar header (name cut)."""
    pax = tarfile.TarInfo("././@PaxHeader")
    pax.type = tarfile.XHDTYPE
    pax.size = len(records)
    member.name = "cut"  # tarfile takes the name from the record
    padding = b"\0" * (-len(records) % 512)
    head = pax.tobuf(tarfile.USTAR_FORMAT) + records + padding
    return head + member.tobuf(tarfile.USTAR_FORMAT) + b"\0" * (member.size + 1024)


_PAX_CHANGES = {
    "as tarfile writes it": lambda r: r,
    "another record too": lambda r: r + b"16 mtime=1.5\n",
    "a record before it": lambda r: b"16 mtime=1.5\n" + r,
    "a length one short": lambda r: str(int(r.split(b" ")[0]) - 1).encode() + r[r.index(b" ") :],
    "no final newline": lambda r: r[:-1] + b"x",
    "not UTF-8": lambda r: r[:-2] + b"\xff\n",
    "a newline in the name": lambda r: r[:-2] + b"\nz\n",
    "a trailing slash": lambda r: r[:-1] + b"/\n",
    "another keyword": lambda r: r.replace(b" path=", b" linkpath="),
}


@settings(deadline=None, database=None, max_examples=200)
@given(
    name=st.text(
        st.characters(codec="utf-8", exclude_characters="/\0\n"), min_size=101, max_size=250
    ),
    change=st.sampled_from(sorted(_PAX_CHANGES)),
    kind=st.sampled_from([tarfile.REGTYPE, tarfile.DIRTYPE]),
)
def test_a_long_name_is_read_as_tarfile_reads_it_or_left_to_tarfile(
    name: str, change: str, kind: bytes
) -> None:
    """The scan's PAX reading agrees with tarfile wherever it answers; it answers tarfile's own."""
    body = b" path=" + f"cache/{name}".encode() + b"\n"
    length = len(body) + 1
    while len(str(length)) + len(body) != length:  # the length counts its own digits
        length += 1
    records = _PAX_CHANGES[change](str(length).encode() + body)
    member = tarfile.TarInfo("x")
    member.type, member.mode = kind, 0o755 if kind == tarfile.DIRTYPE else 0o644
    member.size = 0 if kind == tarfile.DIRTYPE else 7
    raw = _pax_member(records, member)
    ours = unpack_mod._long_named(
        unpack_mod._Bounded(io.BytesIO(raw), len(raw), "sha256:x"), raw[:512]
    )
    try:
        theirs = tarfile.TarFile(fileobj=io.BytesIO(raw)).next()
    except tarfile.TarError:
        theirs = None
    if change == "as tarfile writes it":
        assert ours is not None  # the scan reads what tarfile itself writes
    if ours is not None:
        assert theirs is not None
        assert (ours[0], ours[1], ours[2], ours[3]) == (
            theirs.name,
            theirs.type,
            theirs.mode,
            theirs.size,
        )
        assert ours[4] == 512 + -(-len(records) // 512) * 512 + 512


def test_decompression_and_file_hashes_run_off_the_reading_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batch_writer: str
) -> None:
    """The thread that parses the tar neither decompresses nor hashes the files it hands over.

    With the C batch writer the hashes are taken inside it: the threads that call it count.
    """
    _kernels(tmp_path / "src", 120)
    layer = _pack(tmp_path / "src", tmp_path / "layer.tar.zst")
    hashed: set[str] = set()
    decompressed: set[str] = set()

    def sha256(data: bytes = b"") -> Any:
        hashed.add(threading.current_thread().name)
        return hashlib.sha256(data)

    class Reader:
        def __init__(self, inner: Any) -> None:
            self._inner = inner

        def read(self, n: int = -1) -> bytes:
            decompressed.add(threading.current_thread().name)
            data: bytes = self._inner.read(n)
            return data

        def __enter__(self) -> Reader:
            return self

        def __exit__(self, *exc: object) -> None:
            self._inner.close()

    class Decompressor:
        def __init__(self, **kwargs: Any) -> None:
            self._inner = zstandard.ZstdDecompressor(**kwargs)

        def stream_reader(self, source: Any, **kwargs: Any) -> Reader:
            return Reader(self._inner.stream_reader(source, **kwargs))

    monkeypatch.setattr(unpack_mod, "ZstdDecompressor", Decompressor)
    monkeypatch.setattr(unpack_mod, "sha256_for", lambda total: sha256)
    native = unpack_mod._write_natively
    if native is not None:

        def write_batch(items: list[Any], umask: int) -> int:
            hashed.add(threading.current_thread().name)
            assert native is not None
            return native(items, umask)

        monkeypatch.setattr(unpack_mod, "_write_natively", write_batch)
    blob = _Blob(layer.path)
    try:
        files = _unpack(layer, blob, tmp_path / "stage", layer.files, None)
    finally:
        blob.close()
    assert files == 120
    me = threading.current_thread().name
    assert hashed and me not in hashed, hashed
    assert decompressed and me not in decompressed, decompressed


@pytest.mark.parametrize("size", [100, 1 << 20, (1 << 20) + 1])
def test_a_layer_past_bulk_is_hashed_by_openssl_and_a_smaller_one_by_cpython(
    tmp_path: Path, size: int
) -> None:
    """Loading OpenSSL costs a restore about 3 ms: only a layer whose hashing it speeds up pays."""
    entries = [FileEntry(path="cache/a", size=size, sha256="0" * 64, mode=0o644)]
    extractor = unpack_mod._Extractor(
        tmp_path, entries, None, False, components=frozenset({"cache"})
    )
    bulk = size > hashing.BULK
    assert extractor.bulk is bulk
    assert extractor.sha256 is (hashlib.sha256 if bulk else hashing.sha256_for(0))
    assert extractor.sha256(b"x").hexdigest() == hashlib.sha256(b"x").hexdigest()


def _big_layer(files: list[tuple[str, bytes]], cut: int = 0) -> tuple[bytes, list[FileEntry]]:
    """A format-1 layer of ``files`` under ``cache/`` (its tar cut ``cut`` bytes short)."""
    members = io.BytesIO()
    with tarfile.open(fileobj=members, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(_info("cache", tarfile.DIRTYPE, 0))
        for name, data in files:
            tar.addfile(_info(name, tarfile.REGTYPE, len(data)), io.BytesIO(data))
    raw = members.getvalue()
    entries = [
        FileEntry(path=name, size=len(data), sha256=hashlib.sha256(data).hexdigest(), mode=0o644)
        for name, data in files
    ]
    return zstandard.ZstdCompressor().compress(raw[: len(raw) - cut]), entries


def _unpack_bytes(blob: bytes, entries: list[FileEntry], staging: Path) -> int:
    return unpack_layer(
        io.BytesIO(blob),
        digest="sha256:" + hashlib.sha256(blob).hexdigest(),
        size=len(blob),
        entries=entries,
        staging=staging,
        components=frozenset({"cache"}),
    ).files


def test_a_large_file_is_read_in_place_not_through_tarfiles_file_object(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tarfile's file object copies every byte twice: a large member's bytes are taken in place."""
    files = [
        ("cache/big1", os.urandom((1 << 20) + 1)),
        ("cache/big2", os.urandom((3 << 20) + 123)),  # spans zstd's 4 MiB output pieces
        ("cache/small", b"after the big ones"),
        ("cache/big3", os.urandom(5 << 20)),  # a multiple of 512: no padding after it
    ]
    blob, entries = _big_layer(files)
    extracted: list[str] = []
    real = tarfile.TarFile.extractfile

    def counted(tar: tarfile.TarFile, member: Any) -> Any:
        extracted.append(member.name)
        return real(tar, member)

    monkeypatch.setattr(tarfile.TarFile, "extractfile", counted)
    assert _unpack_bytes(blob, entries, tmp_path / "stage") == 4
    assert extracted == []
    for name, data in files:
        assert (tmp_path / "stage" / name).read_bytes() == data


def test_a_large_file_asks_the_disk_to_start_writing_as_it_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The install's sync before its commit should find a large file mostly written already."""
    size = 3 * unpack_mod._WRITEBACK + 12345
    files = [("cache/big", os.urandom(size)), ("cache/small", b"x" * 100)]
    blob, entries = _big_layer(files)
    started: list[tuple[int, int]] = []
    real = fsutil.start_writeback

    def recorded(fd: int, offset: int, length: int) -> None:
        assert os.fstat(fd).st_size >= offset + length  # only bytes already written
        started.append((offset, length))
        real(fd, offset, length)  # libc's sync_file_range, for real

    monkeypatch.setattr(unpack_mod, "start_writeback", recorded)
    assert _unpack_bytes(blob, entries, tmp_path / "stage") == 2
    assert (tmp_path / "stage" / "cache" / "big").read_bytes() == files[0][1]
    # Contiguous runs from the first byte, each at least _WRITEBACK; only the tail is left.
    assert started and started[0][0] == 0
    assert all(a + n == b for (a, n), (b, _) in itertools.pairwise(started))
    assert all(n >= unpack_mod._WRITEBACK for _, n in started)
    end = started[-1][0] + started[-1][1]
    assert size - unpack_mod._WRITEBACK - unpack_mod._SPAN_PIECE <= end <= size


def test_a_large_file_cut_short_or_unlike_its_record_is_refused(tmp_path: Path) -> None:
    big = os.urandom(3 << 20)
    blob, entries = _big_layer([("cache/big", big)], cut=1024 + 100_000)  # the end blocks, data
    with pytest.raises(IntegrityError, match="not a valid tar stream: unexpected end of data"):
        _unpack_bytes(blob, entries, tmp_path / "cut")
    blob, _ = _big_layer([("cache/big", big[:-1] + bytes([big[-1] ^ 1]))])
    with pytest.raises(IntegrityError, match="cache/big: content does not match its sha256"):
        _unpack_bytes(blob, entries, tmp_path / "flipped")


_ABC = (("cache/a", b"A"), ("cache/b", b"B"), ("cache/c", b"C"))


def test_a_global_header_sends_every_member_after_it_to_tarfile(tmp_path: Path) -> None:
    """A PAX global header renames what follows: the raw headers after it tell another story."""
    members = io.BytesIO()
    with tarfile.open(fileobj=members, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        tar.addfile(_info("cache", tarfile.DIRTYPE, 0))
        for name, data in _ABC:
            tar.addfile(_info(name, tarfile.REGTYPE, len(data)), io.BytesIO(data))
    renames = io.BytesIO()  # an archive of nothing but a global header: its first two blocks
    with tarfile.open(fileobj=renames, mode="w", pax_headers={"path": "cache/a"}):
        pass
    # After the directory: tarfile reads cache/a (A's bytes, as listed), then cache/a again.
    raw = members.getvalue()[:512] + renames.getvalue()[:1024] + members.getvalue()[512:]
    blob = zstandard.ZstdCompressor().compress(raw)
    entries = [
        FileEntry(path=name, size=1, sha256=hashlib.sha256(data).hexdigest(), mode=0o644)
        for name, data in _ABC
    ]
    with pytest.raises(UnsafeArtifactError, match="'cache/a' appears twice"):
        unpack_layer(
            io.BytesIO(blob),
            digest="sha256:" + hashlib.sha256(blob).hexdigest(),
            size=len(blob),
            entries=entries,
            staging=tmp_path / "stage",
            components=frozenset({"cache"}),
        )


def _info(name: str, kind: bytes, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.mode = kind, size, 0o755 if kind == tarfile.DIRTYPE else 0o644
    return info


def _header_block(name: str, kind: bytes, size: int, fmt: int) -> bytes:
    return _info(name, kind, size).tobuf(fmt, "utf-8", "surrogateescape")[-512:]  # type: ignore[arg-type]


#: Where a header's fields start or end (name, mode, uid, size, mtime, type, link, magic,
#: uname, devmajor, devminor, prefix), and what an edit writes there.
_FIELD_EDGES = [0, 99, 100, 107, 108, 116, 124, 135, 136, 156, 157, 257, 263, 265, 329, 337, 345]
_EDIT_BYTES = [b"\0", b" ", b"/", b"0", b"5", b"8", b"x", b"\x80", b"\xff", b"\x1c", b"ab/"]


_PLAIN_FILE: dict[str, Any] = {
    "name": "a",
    "slash": False,
    "kind": tarfile.REGTYPE,
    "size": 1,
    "fmt": tarfile.USTAR_FORMAT,
    "edits": [],
    "spoil": False,
}


@settings(deadline=None, database=None, derandomize=True, max_examples=300)
@given(
    name=st.text(st.characters(min_codepoint=1, max_codepoint=0x7F), min_size=1, max_size=97),
    slash=st.booleans(),
    kind=st.sampled_from([tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE]),
    size=st.integers(0, 1 << 20),
    fmt=st.sampled_from([tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT]),
    edits=st.lists(
        st.tuples(
            st.sampled_from(_FIELD_EDGES) | st.integers(0, 511), st.sampled_from(_EDIT_BYTES)
        ),
        max_size=2,
    ),
    spoil=st.sampled_from([False, False, False, True]),
)
# A ustar name prefix, a NUL-type member named as a directory, a checksum off by one.
@example(**{**_PLAIN_FILE, "edits": [(345, b"ab/")]})
@example(**{**_PLAIN_FILE, "slash": True, "kind": tarfile.AREGTYPE})
@example(**{**_PLAIN_FILE, "spoil": True})
def test_a_header_read_past_tarfile_reads_as_tarfile_reads_it(
    *,
    name: str,
    slash: bool,
    kind: bytes,
    size: int,
    fmt: int,
    edits: list[tuple[int, bytes]],
    spoil: bool,
) -> None:
    """Whatever header the extractor reads itself, tarfile reads the same member from it."""
    block = bytearray(_header_block(name + "/" * slash, kind, size, fmt))
    for at, value in edits:
        block[at : at + len(value)] = value
        del block[512:]
    if edits:  # a consistent checksum, so the edit itself is what is judged
        block[148:156] = b" " * 8
        block[148:155] = b"%06o\0" % sum(block)
    if spoil:  # a checksum that is off by one: tarfile refuses the header
        block[148:155] = b"%06o\0" % (int(block[148:154], 8) + 1)
    mine = unpack_mod._plain_header(bytes(block))
    if mine is None:
        return
    theirs = tarfile.TarInfo.frombuf(bytes(block), "utf-8", "surrogateescape")
    assert mine == (theirs.name, theirs.type, theirs.mode, theirs.size)


@settings(deadline=None, database=None, derandomize=True, max_examples=300)
@given(block=st.binary(min_size=512, max_size=512) | st.sampled_from([b"\xff" * 512, b"\0" * 512]))
def test_a_header_blocks_sum_is_its_bytes_sum(block: bytes) -> None:
    """The checksum's sum, taken from two Adler-32s, is the plain sum of the block's bytes."""
    assert unpack_mod._block_sum(block) == sum(block)


class _Pieces:
    """A source that returns ``data`` in the given piece sizes (then the rest, then b"")."""

    def __init__(self, data: bytes, sizes: list[int]) -> None:
        self._data = data
        self._at = 0
        self._sizes = iter(sizes)

    def read(self, n: int = -1, /) -> bytes:
        size = next(self._sizes, n)
        piece = self._data[self._at : self._at + min(size, n)]
        self._at += len(piece)
        return piece


_OPS = st.tuples(
    st.sampled_from(["peek", "read", "take", "skip", "member", "seek"]), st.integers(0, 700)
)


@settings(deadline=None, database=None, derandomize=True, max_examples=400)
@given(
    size=st.integers(0, 6000),
    pieces=st.lists(st.integers(1, 1500), max_size=12),
    join=st.sampled_from([1, 7, 64, 512]),
    ops=st.lists(_OPS, max_size=40),
)
def test_the_tar_readers_buffer_serves_the_stream_as_it_is_whatever_its_pieces(
    size: int, pieces: list[int], join: int, ops: list[tuple[str, int]]
) -> None:
    """Every read, peek, take, skip, member and seek gives the stream's bytes at its offset.

    Small pieces and a small join make every member straddle pieces, so the
    joined buffer, a longer join, and the return to a piece in place all run.
    """
    data = bytes((i * 7 + i // 251) % 256 for i in range(size))
    bounded = unpack_mod._Bounded(_Pieces(data, pieces), limit=size, digest="sha256:x")
    old_join, unpack_mod._JOIN = unpack_mod._JOIN, join
    try:
        at = 0
        for op, n in ops:
            assert bounded.tell() == at
            if op == "peek":
                assert bounded.peek(n) == data[at : at + n]
            elif op == "read":
                assert bounded.read(n) == data[at : at + n]
                at = min(at + n, size)
            elif op == "take":
                got = bytes(bounded.take(n))
                assert got == data[at : at + len(got)]
                assert got or n == 0 or at == size  # empty only when asked none, or at the end
                at += len(got)
            elif op == "skip":
                bounded.skip(n)
                at = min(at + n, size)
            elif op == "seek":
                assert bounded.seek(at + n) == min(at + n, size)
                at = min(at + n, size)
            else:
                padded = -(-n // 512) * 512
                if at + 512 + padded > size:  # the data or its padding ends inside: an error
                    with pytest.raises(unpack_mod._TruncatedError, match="unexpected end"):
                        bounded.member(n, padded)
                    return
                assert bytes(bounded.member(n, padded)) == data[at + 512 : at + 512 + n]
                at += 512 + padded
        assert bounded.read(-1) == data[at:]
    finally:
        unpack_mod._JOIN = old_join


def test_the_writers_budget_counts_the_buffers_that_small_files_keep_alive(tmp_path: Path) -> None:
    """A small file handed over as a view holds its whole decompressed buffer: that is charged.

    Else small files between large ones (each large file streamed at once,
    each small one holding a different 4 MiB buffer) could keep many times
    the budget in memory while the writers lag.
    """
    extractor = unpack_mod._Extractor(
        tmp_path / "stage", [], None, False, components=frozenset({"cache"})
    )
    charged: list[int] = []
    extractor._submit = lambda size, fn, *args: charged.append(size)  # type: ignore[method-assign]
    buffers = [bytes(4 << 20) for _ in range(3)]

    def entry(i: int) -> Any:
        return SimpleNamespace(path=f"cache/f{i}", size=1024, rewrite=False)

    for i, buf in enumerate(buffers):  # three files, each in a buffer of its own
        extractor._accept(f"cache/f{i}", entry(i), memoryview(buf)[:1024])
    extractor._flush()
    for i in range(3, 6):  # three files in one buffer
        extractor._accept(f"cache/f{i}", entry(i), memoryview(buffers[0])[i << 10 : (i + 1) << 10])
    extractor._flush()
    extractor._accept("cache/f6", entry(6), bytes(1024))  # bytes: its own size
    extractor._flush()
    assert charged == [3 * (4 << 20), 4 << 20, 1024]
    extractor.abort()


def test_the_extractor_keeps_the_same_names_whichever_way_it_checks_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain record's names, checked a field at a time, give what each entry checked gives."""

    def entry(path: str, size: int) -> Any:
        return SimpleNamespace(
            path=path, size=size, link=None, mode=0o644, rewrite=False, sha256="0" * 64
        )

    entries = [
        entry("cache/a/b/c.json", 10),
        entry("cache/a/d.bin", 2 << 20),  # large: streamed, not on the tight path
        entry("cache/e", 0),
        entry("pch/x/y", 5),
    ]
    comps = frozenset({"cache", "pch"})
    assert unpack_mod._plain_entries(entries, comps) is not None  # the plain way applies

    def kept() -> tuple[dict[str, Any], set[str]]:
        x = unpack_mod._Extractor(tmp_path / "s", entries, None, False, components=comps)
        x.abort()
        return x.fast_files, x.record_dirs

    plain = kept()
    monkeypatch.setattr(unpack_mod, "_plain_entries", lambda entries, components: None)
    assert kept() == plain
    assert plain[1] == {"cache", "cache/a", "cache/a/b", "pch", "pch/x"}
    assert sorted(plain[0]) == ["cache/a/b/c.json", "cache/e", "pch/x/y"]
