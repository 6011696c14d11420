"""The extractor's tight path: the record checked once, dirs up front, the download read ahead.

:func:`artifactd.format.unpack.unpack_layer` is held here to how it works, not
how fast: the blob keeps being read while the extractor is held up on a
member (so a registry download and the disk work overlap), every directory the
record implies exists before the first file is written, and the members the
record vouches for are matched without building a path object each. The
rules themselves are held by the hostile-layer corpus (tests/hostile.py).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path, PurePosixPath

import pytest
from layers import pack, record

import artifactd.format.unpack as unpack_mod
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

    monkeypatch.setattr(unpack_mod, "PurePosixPath", Counted)
    blob = _Blob(layer.path)
    try:
        files = _unpack(layer, blob, tmp_path / "stage", layer.files, None)
    finally:
        blob.close()
    assert files == 300
    assert made == []
    assert (tmp_path / "stage" / "cache" / "k29" / "kernel299.cubin").read_bytes() == b"299" * 100
