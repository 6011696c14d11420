from __future__ import annotations

import errno
import gzip
import hashlib
import inspect
import io
import json
import os
import shutil
import stat
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import layers
import pytest
import zstandard
from diskfaults import mount_tmpfs, unmount
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from artifactd.errors import IntegrityError, UnsafeArtifactError
from artifactd.families import FAMILIES, Family, Located
from artifactd.families.base import ROOT_PLACEHOLDER
from artifactd.format.archive import PackedLayer, pack_family
from artifactd.format.config import FileEntry
from artifactd.format.unpack import UnpackResult, unpack_layer

GENERIC = FAMILIES["generic"]
TRITON = FAMILIES["triton"]
CACHE = frozenset({"cache"})
EMPTY_SHA = hashlib.sha256(b"").hexdigest()

Snapshot = dict[str, tuple[object, ...]]


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


@contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def write(path: Path, data: bytes, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.chmod(path, mode)


def snapshot(root: Path, *, skip: Path | None = None) -> Snapshot:
    """Everything under root (not following symlinks): type, content, mode, link target."""
    out: Snapshot = {}
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        if skip is not None and (here == skip or skip in here.parents):
            dirnames[:] = []
            continue
        for name in sorted(dirnames + filenames):
            path = here / name
            if skip is not None and path == skip:
                continue
            rel = path.relative_to(root).as_posix()
            st_ = os.lstat(path)
            if stat.S_ISLNK(st_.st_mode):
                out[rel] = ("link", os.readlink(path))
            elif stat.S_ISDIR(st_.st_mode):
                out[rel] = ("dir",)
            else:
                out[rel] = ("file", path.read_bytes(), stat.S_IMODE(st_.st_mode))
    return out


def pack_tree(
    root: Path, out: Path, family: Family = GENERIC, component: str = "cache"
) -> PackedLayer:
    comp = next(c for c in family.components if c.name == component)
    return layers.pack(family, [Located(comp, root)], out)


def unpack_packed(
    layer: PackedLayer,
    staging: Path,
    *,
    relocate: Callable[[str, bytes], bytes] | None = None,
) -> UnpackResult:
    return layers.unpack(layer, staging, relocate=relocate)


def tar_members(layer: PackedLayer) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    """The members under the family directory, named without it (the frame checked)."""
    return layers.family_members(layer)


def make_sample_tree(root: Path) -> None:
    write(root / "a.cubin", b"cubin bytes\x00\x01\x02")
    write(root / "empty.bin", b"")
    write(root / "bin" / "tool.so", b"\x7fELF fake", 0o755)
    write(root / "bin" / "sub" / "deep.ptx", b".version 8.0\n" * 50)
    (root / "emptydir").mkdir()
    os.symlink("a.cubin", root / "alias.cubin")
    os.symlink("../a.cubin", root / "bin" / "up.cubin")
    os.symlink("bin/sub", root / "sublink")


# --------------------------------------------------------------------------
# round trip
# --------------------------------------------------------------------------


def test_round_trip_generic_tree(tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_sample_tree(src)
    layer = pack_tree(src, tmp_path / "g.tar.zst")

    assert layer.digest == "sha256:" + hashlib.sha256(layer.path.read_bytes()).hexdigest()
    assert layer.size == layer.path.stat().st_size
    raw = zstandard.ZstdDecompressor().decompressobj().decompress(layer.path.read_bytes())
    assert layer.diff_id == "sha256:" + hashlib.sha256(raw).hexdigest()

    by_path = {f.path: f for f in layer.files}
    assert set(by_path) == {
        "cache/a.cubin",
        "cache/empty.bin",
        "cache/bin/tool.so",
        "cache/bin/sub/deep.ptx",
        "cache/alias.cubin",
        "cache/bin/up.cubin",
        "cache/sublink",
    }
    assert by_path["cache/bin/tool.so"].mode == 0o755
    assert by_path["cache/a.cubin"].mode == 0o644
    assert by_path["cache/bin/up.cubin"].link == "../a.cubin"
    assert by_path["cache/a.cubin"].sha256 == hashlib.sha256(b"cubin bytes\x00\x01\x02").hexdigest()
    assert layer.unpacked_size == sum(f.size for f in layer.files) > 0
    assert layer.skipped == []

    staging = tmp_path / "stage"
    with umask(0o022):
        res = unpack_packed(layer, staging)
    assert res.files == len(layer.files)
    assert res.bytes == layer.unpacked_size
    assert snapshot(staging / "cache") == snapshot(src)
    assert (staging / "cache" / "bin" / "up.cubin").read_bytes() == b"cubin bytes\x00\x01\x02"
    assert (staging / "cache" / "sublink" / "deep.ptx").is_file()


def test_a_large_file_streams_in_order_and_a_full_disk_mid_file_is_an_error(
    tmp_path: Path,
) -> None:
    """Files over 1 MiB are decompressed on one thread and hashed and written on another."""
    # Distinct 128 KiB pieces, so a piece written out of order changes the bytes.
    data = b"".join(hashlib.sha256(bytes([i])).digest() * 4096 for i in range(40))
    src = tmp_path / "src"
    write(src / "big.gch", data)
    layer = pack_tree(src, tmp_path / "g.tar.zst")
    res = unpack_packed(layer, tmp_path / "stage")
    assert res.bytes == len(data) == 40 * 128 << 10
    assert (tmp_path / "stage" / "cache" / "big.gch").read_bytes() == data

    mnt = tmp_path / "small"
    why = mount_tmpfs(mnt, "2m")
    if why is not None:
        pytest.skip(why)
    try:
        with pytest.raises(OSError) as err:
            unpack_packed(layer, mnt / "stage")
        assert err.value.errno == errno.ENOSPC
    finally:
        unmount(mnt)


def test_pack_family_writes_only_the_format_production_restores(tmp_path: Path) -> None:
    """Format 1 is read, never written: a layer without its family's scope cannot be packed."""
    params = inspect.signature(pack_family).parameters
    assert params["scope_key"].default is inspect.Parameter.empty
    assert params["scope"].default is inspect.Parameter.empty
    src = tmp_path / "src"
    make_sample_tree(src)
    located = [Located(GENERIC.components[0], src)]
    with pytest.raises(TypeError):
        pack_family(GENERIC, located, tmp_path / "v1.tar.zst")  # type: ignore[call-arg]
    # What the round trips here pack is what harvest packs: the format-2 frame.
    layer = pack_tree(src, tmp_path / "v2.tar.zst")
    assert next(m.name for m, _ in tar_members(layer)) == "cache"
    assert layers.record(layer).tree() == layer.tree


def test_tar_members_are_normalised(tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_sample_tree(src)
    os.utime(src / "a.cubin", (1_700_000_000, 1_700_000_000))
    layer = pack_tree(src, tmp_path / "g.tar.zst")
    members = tar_members(layer)
    names = [m.name for m, _ in members]
    assert names[0] == "cache"
    assert all(n == "cache" or n.startswith("cache/") for n in names)
    # A directory always precedes what it holds, and siblings come in sorted order.
    siblings: dict[str, list[str]] = {}
    for i, name in enumerate(names):
        parent, _, base = name.rpartition("/")
        if parent:
            assert parent in names[:i]
            siblings.setdefault(parent, []).append(base)
    assert siblings["cache/bin"] == ["sub", "tool.so", "up.cubin"]
    for children in siblings.values():
        assert children == sorted(children)
    for m, _ in layers.tar_members(layer.path):  # the format-2 frame too
        assert (m.uid, m.gid, m.uname, m.gname) == (0, 0, "", "")
        assert m.mtime == 0
        assert m.isreg() or m.isdir() or m.issym()
        if m.isreg():
            assert m.mode in (0o644, 0o755)


def test_modes_are_normalised_to_644_and_755(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write(src / "private", b"p", 0o600)
    write(src / "group_exec", b"g", 0o750)
    write(src / "owner_exec", b"o", 0o700)
    write(src / "readonly", b"r", 0o444)
    layer = pack_tree(src, tmp_path / "m.tar.zst")
    modes = {f.path: f.mode for f in layer.files}
    assert modes == {
        "cache/private": 0o644,
        "cache/group_exec": 0o755,
        "cache/owner_exec": 0o755,
        "cache/readonly": 0o644,
    }
    with umask(0o022):
        unpack_packed(layer, tmp_path / "stage")
    got = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "stage/cache").iterdir()}
    assert got == {"private": 0o644, "group_exec": 0o755, "owner_exec": 0o755, "readonly": 0o644}


def test_pack_skips_escaping_symlinks_and_special_files(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write(src / "ok", b"ok")
    os.symlink("/etc/passwd", src / "abs")
    os.symlink("../outside", src / "up")
    (src / "d").mkdir()
    os.symlink("../../x", src / "d" / "up2")
    os.mkfifo(src / "fifo")
    layer = pack_tree(src, tmp_path / "s.tar.zst")
    assert [f.path for f in layer.files] == ["cache/ok"]
    reasons = {s.path: s.reason for s in layer.skipped}
    assert set(reasons) == {"cache/abs", "cache/up", "cache/d/up2", "cache/fifo"}
    assert "leaves root" in reasons["cache/abs"]
    assert "not a regular file" in reasons["cache/fifo"]
    assert {m.name for m, _ in tar_members(layer)} == {"cache", "cache/ok", "cache/d"}


SEGMENT = st.text(alphabet="abcdefghij0123456789_-", min_size=1, max_size=6)
TREE = st.dictionaries(
    keys=st.lists(SEGMENT, min_size=1, max_size=3).map(tuple),
    values=st.tuples(st.binary(max_size=3000), st.booleans()),
    min_size=1,
    max_size=10,
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=TREE, links=st.lists(st.tuples(st.integers(0, 50), st.integers(0, 50)), max_size=4))
def test_round_trip_property(
    tree: dict[tuple[str, ...], tuple[bytes, bool]], links: list[tuple[int, int]]
) -> None:
    # A file cannot also be a directory: drop keys that prefix another key.
    files = {k: v for k, v in tree.items() if not any(o != k and o[: len(k)] == k for o in tree)}
    with tempfile.TemporaryDirectory() as tmp, umask(0o022):
        base = Path(tmp)
        src = base / "src"
        src.mkdir()
        for parts, (data, executable) in files.items():
            write(src.joinpath(*parts), data, 0o755 if executable else 0o644)
        paths = sorted(files)
        dirs = sorted({p[:-1] for p in paths})
        for n, (ti, di) in enumerate(links):
            target = src.joinpath(*paths[ti % len(paths)])
            where = src.joinpath(*dirs[di % len(dirs)])
            os.symlink(os.path.relpath(target, where), where / f"lnk{n}")

        layer = pack_tree(src, base / "p.tar.zst")
        assert layer.skipped == []
        assert len(layer.files) == len(files) + len(links)
        res = unpack_packed(layer, base / "stage")
        assert res.bytes == sum(len(d) for d, _ in files.values())
        assert snapshot(base / "stage" / "cache") == snapshot(src)
        for parts, (data, _) in files.items():
            assert (base / "stage" / "cache").joinpath(*parts).read_bytes() == data
        for n in range(len(links)):
            for link in (base / "stage" / "cache").rglob(f"lnk{n}"):
                real = Path(os.path.realpath(link))
                assert (base / "stage" / "cache") in real.parents
                assert real.is_file()

        again = pack_tree(src, base / "q.tar.zst")
        assert again.digest == layer.digest


# --------------------------------------------------------------------------
# reproducibility and exclusions
# --------------------------------------------------------------------------


def test_packing_is_reproducible_across_runs_paths_and_mtimes(tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_sample_tree(src)
    one = pack_tree(src, tmp_path / "1.tar.zst")
    two = pack_tree(src, tmp_path / "2.tar.zst")
    assert one.digest == two.digest
    assert one.path.read_bytes() == two.path.read_bytes()
    assert one.diff_id == two.diff_id

    # A copy elsewhere, written in another order, with other mtimes.
    other = tmp_path / "elsewhere" / "deeper" / "copy"
    items = sorted(snapshot(src).items(), reverse=True)
    for rel, info in items:
        target = other / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if info[0] == "dir":
            target.mkdir(exist_ok=True)
        elif info[0] == "link":
            os.symlink(str(info[1]), target)
        else:
            data, mode = info[1], info[2]
            assert isinstance(data, bytes)
            assert isinstance(mode, int)
            write(target, data, mode)
    for n, path in enumerate(sorted(other.rglob("*"))):
        if not path.is_symlink():
            os.utime(path, (1_000_000 + n * 7919, 1_000_000 + n * 7919))
    assert snapshot(other) == snapshot(src)
    three = pack_tree(other, tmp_path / "3.tar.zst")
    assert three.digest == one.digest
    assert three.files == one.files


def test_content_change_changes_digest(tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_sample_tree(src)
    before = pack_tree(src, tmp_path / "1.tar.zst")
    write(src / "a.cubin", b"cubin bytes\x00\x01\x03")
    after = pack_tree(src, tmp_path / "2.tar.zst")
    assert after.digest != before.digest
    write(src / "a.cubin", b"cubin bytes\x00\x01\x03", 0o755)
    mode_changed = pack_tree(src, tmp_path / "3.tar.zst")
    assert mode_changed.digest != after.digest


def test_excluded_names_are_skipped_and_reported(tmp_path: Path) -> None:
    clean = tmp_path / "clean"
    make_sample_tree(clean)
    dirty = tmp_path / "dirty"
    shutil.copytree(clean, dirty, symlinks=True)
    write(dirty / "locks" / "held", b"l")
    write(dirty / "bin" / "lock" / "x", b"l")
    write(dirty / "a.cubin.lock", b"")
    write(dirty / "bin" / "half.tmp", b"partial")
    write(dirty / "tmp.pid_1234_abcd" / "inner.cubin", b"half written")
    (dirty / "bin" / "tmp.pid_99_x").mkdir()

    packed_clean = pack_tree(clean, tmp_path / "c.tar.zst")
    packed_dirty = pack_tree(dirty, tmp_path / "d.tar.zst")
    assert packed_dirty.digest == packed_clean.digest
    assert packed_dirty.files == packed_clean.files
    skipped = {s.path for s in packed_dirty.skipped}
    assert skipped == {
        "cache/locks",
        "cache/bin/lock",
        "cache/a.cubin.lock",
        "cache/bin/half.tmp",
        "cache/tmp.pid_1234_abcd",
        "cache/bin/tmp.pid_99_x",
    }
    assert all(s.reason for s in packed_dirty.skipped)
    names = {m.name for m, _ in tar_members(packed_dirty)}
    assert not any("lock" in n or ".tmp" in n or "tmp.pid_" in n for n in names)


# --------------------------------------------------------------------------
# Triton group-file relocation
# --------------------------------------------------------------------------

KEY = "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo"


def make_triton_tree(root: Path, *, recorded_root: Path | None = None) -> None:
    recorded = str(recorded_root or root)
    write(root / KEY / "k.cubin", b"\x00cubin")
    write(root / KEY / "k.json", b'{"name": "k"}')
    group = {
        "child_paths": {
            "k.cubin": f"{recorded}/{KEY}/k.cubin",
            "k.json": f"{recorded}/{KEY}/k.json",
            "foreign": "/somewhere/else/x.cubin",
        }
    }
    write(root / KEY / "__grp__k.json", json.dumps(group).encode())


def test_triton_group_files_are_stored_with_placeholder_and_relocated(tmp_path: Path) -> None:
    root = tmp_path / "triton-cache"
    make_triton_tree(root)
    layer = pack_tree(root, tmp_path / "t.tar.zst", family=TRITON)
    entries = {f.path: f for f in layer.files}
    grp = f"cache/{KEY}/__grp__k.json"
    assert entries[grp].rewrite is True
    assert entries[f"cache/{KEY}/k.cubin"].rewrite is False
    assert entries[f"cache/{KEY}/k.json"].rewrite is False

    stored = {m.name: data for m, data in tar_members(layer)}[grp]
    assert stored is not None
    assert str(root).encode() not in stored
    assert ROOT_PLACEHOLDER.encode() in stored
    assert entries[grp].sha256 == hashlib.sha256(stored).hexdigest()
    assert entries[grp].size == len(stored)
    children = json.loads(stored)["child_paths"]
    assert children["k.cubin"] == f"{ROOT_PLACEHOLDER}/{KEY}/k.cubin"
    assert children["foreign"] == "/somewhere/else/x.cubin"

    seen: list[str] = []

    def relocate(member: str, data: bytes) -> bytes:
        seen.append(member)
        return TRITON.relocate(data, "/new/root")

    staging = tmp_path / "stage"
    unpack_packed(layer, staging, relocate=relocate)
    assert seen == [grp]
    out = json.loads((staging / grp).read_bytes())["child_paths"]
    assert out == {
        "k.cubin": f"/new/root/{KEY}/k.cubin",
        "k.json": f"/new/root/{KEY}/k.json",
        "foreign": "/somewhere/else/x.cubin",
    }
    assert (staging / "cache" / KEY / "k.cubin").read_bytes() == b"\x00cubin"


def test_triton_caches_at_different_roots_pack_identically(tmp_path: Path) -> None:
    a = tmp_path / "a" / "cache"
    b = tmp_path / "bb" / "other-cache"
    make_triton_tree(a)
    make_triton_tree(b)
    assert (a / KEY / "__grp__k.json").read_bytes() != (b / KEY / "__grp__k.json").read_bytes()
    assert (
        pack_tree(a, tmp_path / "a.tar.zst", family=TRITON).digest
        == pack_tree(b, tmp_path / "b.tar.zst", family=TRITON).digest
    )


def test_triton_root_reached_through_a_symlink_is_normalised(tmp_path: Path) -> None:
    real = tmp_path / "real-cache"
    make_triton_tree(real)  # the group file records the real path
    alias = tmp_path / "alias"
    os.symlink(real, alias)
    layer = pack_tree(alias, tmp_path / "t.tar.zst", family=TRITON)
    stored = {m.name: d for m, d in tar_members(layer)}[f"cache/{KEY}/__grp__k.json"]
    assert stored is not None
    assert str(real).encode() not in stored
    assert json.loads(stored)["child_paths"]["k.cubin"].startswith(ROOT_PLACEHOLDER + "/")


# --------------------------------------------------------------------------
# hostile layers
# --------------------------------------------------------------------------

Member = tuple[tarfile.TarInfo, bytes | None]


def reg(name: str, data: bytes, mode: int = 0o644) -> Member:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    return info, data


def sym(name: str, target: str) -> Member:
    info = tarfile.TarInfo(name)
    info.type = tarfile.SYMTYPE
    info.linkname = target
    info.mode = 0o777
    return info, None


def special(name: str, kind: bytes, linkname: str = "") -> Member:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    info.mode = 0o644
    if kind in (tarfile.CHRTYPE, tarfile.BLKTYPE):
        info.devmajor, info.devminor = 1, 3
    return info, None


def dirm(name: str, mode: int = 0o755) -> Member:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = mode
    return info, None


def entry(name: str, data: bytes = b"", *, link: str | None = None, mode: int = 0o644) -> FileEntry:
    if link is not None:
        return FileEntry(path=name, size=0, sha256=EMPTY_SHA, mode=0o777, link=link)
    return FileEntry(path=name, size=len(data), sha256=hashlib.sha256(data).hexdigest(), mode=mode)


def raw_tar(members: list[Member]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def zst(members: list[Member]) -> bytes:
    return zstandard.ZstdCompressor().compress(raw_tar(members))


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@pytest.fixture
def arena(tmp_path: Path) -> Iterator[Callable[..., UnpackResult]]:
    """An unpack into tmp_path/stage that checks nothing outside staging changed."""
    sentinel = tmp_path / "sentinel.txt"
    sentinel.write_bytes(b"untouched")
    (tmp_path / "outside").mkdir()
    write(tmp_path / "outside" / "victim", b"victim")
    staging = tmp_path / "stage"
    before = snapshot(tmp_path, skip=staging)

    def unpack(
        blob: bytes,
        entries: list[FileEntry],
        *,
        digest: str | None = None,
        size: int | None = None,
        components: frozenset[str] = CACHE,
    ) -> UnpackResult:
        return unpack_layer(
            io.BytesIO(blob),
            digest=digest or sha(blob),
            size=len(blob) if size is None else size,
            entries=entries,
            staging=staging,
            components=components,
        )

    yield unpack
    assert snapshot(tmp_path, skip=staging) == before
    assert sentinel.read_bytes() == b"untouched"
    assert (tmp_path / "outside" / "victim").read_bytes() == b"victim"
    for path in staging.rglob("*") if staging.exists() else ():
        if path.is_symlink():
            assert staging in Path(os.path.realpath(path)).parents


GOOD = reg("cache/good", b"good data")
GOOD_ENTRY = entry("cache/good", b"good data")


def test_baseline_layer_unpacks(arena: Callable[..., UnpackResult], tmp_path: Path) -> None:
    blob = zst([dirm("cache"), GOOD, sym("cache/l", "good")])
    res = arena(blob, [GOOD_ENTRY, entry("cache/l", link="good")])
    assert res == UnpackResult(files=2, bytes=len(b"good data"))
    assert (tmp_path / "stage" / "cache" / "l").read_bytes() == b"good data"


def _unsafe_cases(outside: str) -> list[tuple[str, list[Member], list[FileEntry], str]]:
    evil = b"evil"
    return [
        (
            "absolute",
            [GOOD, reg(f"{outside}/abs", evil)],
            [GOOD_ENTRY, entry(f"{outside}/abs", evil)],
            "absolute",
        ),
        (
            "dotdot",
            [GOOD, reg("cache/../../evil", evil)],
            [GOOD_ENTRY, entry("cache/../../evil", evil)],
            r"\.\.",
        ),
        ("leading-dotdot", [reg("../evil", evil)], [entry("../evil", evil)], r"\.\."),
        ("dot-slash", [reg("./cache/x", evil)], [entry("cache/x", evil)], "'.'"),
        ("backslash", [reg("cache\\..\\..\\x", evil)], [], "forbidden"),
        ("symlink-absolute", [sym("cache/l", outside)], [entry("cache/l", link=outside)], "leaves"),
        (
            "symlink-up",
            [sym("cache/l", "../../outside")],
            [entry("cache/l", link="../../outside")],
            "leaves",
        ),
        (
            "symlink-up-nested",
            [sym("cache/d/l", "../../x")],
            [entry("cache/d/l", link="../../x")],
            "leaves",
        ),
        (
            "symlink-component",
            [sym("cache", outside)],
            [entry("cache", link=outside)],
            "replaces its component",
        ),
        ("symlink-empty", [sym("cache/l", "")], [entry("cache/l", link="")], "leaves"),
        (
            "hardlink",
            [GOOD, special("cache/h", tarfile.LNKTYPE, "cache/good")],
            [GOOD_ENTRY, entry("cache/h")],
            "hard link",
        ),
        (
            "hardlink-outside",
            [special("cache/h", tarfile.LNKTYPE, f"{outside}/victim")],
            [entry("cache/h")],
            "hard link",
        ),
        ("chardev", [special("cache/dev", tarfile.CHRTYPE)], [entry("cache/dev")], "device"),
        ("blockdev", [special("cache/blk", tarfile.BLKTYPE)], [entry("cache/blk")], "device"),
        ("fifo", [special("cache/fifo", tarfile.FIFOTYPE)], [entry("cache/fifo")], "fifo"),
        (
            "setuid",
            [reg("cache/su", evil, 0o4755)],
            [entry("cache/su", evil, mode=0o755)],
            "setuid",
        ),
        (
            "setgid",
            [reg("cache/sg", evil, 0o2755)],
            [entry("cache/sg", evil, mode=0o755)],
            "setgid",
        ),
        ("sticky-dir", [dirm("cache/t", 0o1777)], [], "sticky"),
        ("not-in-manifest", [GOOD, reg("cache/extra", evil)], [GOOD_ENTRY], "not in the manifest"),
        ("duplicate", [GOOD, GOOD], [GOOD_ENTRY], "twice"),
        (
            "duplicate-link",
            [sym("cache/l", "good"), sym("cache/l", "x")],
            [entry("cache/l", link="good")],
            "twice",
        ),
        ("other-component", [reg("other/x", evil)], [entry("other/x", evil)], "outside the layer"),
        (
            "file-over-dir",
            [GOOD, reg("cache/good/x", evil)],
            [GOOD_ENTRY, entry("cache/good/x", evil)],
            "not a directory",
        ),
    ]


UNSAFE_IDS = [c[0] for c in _unsafe_cases("/x")]


@pytest.mark.parametrize("case", UNSAFE_IDS)
def test_unsafe_members_are_refused(
    case: str, arena: Callable[..., UnpackResult], tmp_path: Path
) -> None:
    outside = str(tmp_path / "outside")
    _, members, entries, match = next(c for c in _unsafe_cases(outside) if c[0] == case)
    with pytest.raises(UnsafeArtifactError, match=match):
        arena(zst(members), entries)
    assert not (tmp_path / "outside" / "abs").exists()
    assert not (tmp_path / "evil").exists()


def test_integrity_wrong_layer_digest(arena: Callable[..., UnpackResult]) -> None:
    blob = zst([GOOD])
    with pytest.raises(IntegrityError, match="digest mismatch"):
        arena(blob, [GOOD_ENTRY], digest=sha(blob + b"x"))


def test_integrity_wrong_layer_size(arena: Callable[..., UnpackResult]) -> None:
    blob = zst([GOOD])
    with pytest.raises(IntegrityError, match="bytes"):
        arena(blob, [GOOD_ENTRY], size=len(blob) + 1)


def test_integrity_file_content_mismatch(arena: Callable[..., UnpackResult]) -> None:
    blob = zst([reg("cache/good", b"evil data")])  # same size as b"good data"
    with pytest.raises(IntegrityError, match="sha256"):
        arena(blob, [GOOD_ENTRY])


def test_integrity_rewritten_file_content_mismatch(arena: Callable[..., UnpackResult]) -> None:
    blob = zst([reg("cache/__grp__k.json", b"{}   ")])
    good = entry("cache/__grp__k.json", b'{"a"}')
    with pytest.raises(IntegrityError, match="sha256"):
        arena(blob, [good.model_copy(update={"rewrite": True})])


def test_integrity_file_size_mismatch(arena: Callable[..., UnpackResult]) -> None:
    blob = zst([reg("cache/good", b"good data plus")])
    with pytest.raises(IntegrityError, match="size"):
        arena(blob, [GOOD_ENTRY])


def test_integrity_symlink_target_differs_from_manifest(
    arena: Callable[..., UnpackResult],
) -> None:
    blob = zst([GOOD, sym("cache/l", "good")])
    with pytest.raises(IntegrityError, match="differs"):
        arena(blob, [GOOD_ENTRY, entry("cache/l", link="other")])


def test_integrity_truncated_blob(arena: Callable[..., UnpackResult]) -> None:
    data = os.urandom(300_000)
    blob = zst([reg("cache/big", data)])
    cut = blob[: len(blob) // 2]
    with pytest.raises(IntegrityError):
        arena(cut, [entry("cache/big", data)], digest=sha(blob), size=len(blob))


def test_integrity_truncated_blob_with_matching_descriptor(
    arena: Callable[..., UnpackResult],
) -> None:
    data = os.urandom(300_000)
    cut = zst([reg("cache/big", data)])[:-100]
    with pytest.raises(IntegrityError):
        arena(cut, [entry("cache/big", data)])


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda m: gzip.compress(raw_tar(m)), id="gzip"),
        pytest.param(raw_tar, id="plain-tar"),
        pytest.param(lambda m: b"\x00" * 4096, id="zeros"),
    ],
)
def test_integrity_not_zstd(
    make: Callable[[list[Member]], bytes], arena: Callable[..., UnpackResult]
) -> None:
    blob = make([GOOD])
    with pytest.raises(IntegrityError, match="zstd"):
        arena(blob, [GOOD_ENTRY])


def test_integrity_zstd_but_not_tar(arena: Callable[..., UnpackResult]) -> None:
    blob = zstandard.ZstdCompressor().compress(b"this is not a tar archive " * 100)
    with pytest.raises(IntegrityError):
        arena(blob, [GOOD_ENTRY])


def test_integrity_manifest_entry_missing_from_tar(arena: Callable[..., UnpackResult]) -> None:
    blob = zst([GOOD])
    with pytest.raises(IntegrityError, match="lacks"):
        arena(blob, [GOOD_ENTRY, entry("cache/missing", b"m")])


def test_integrity_manifest_link_missing_from_tar(arena: Callable[..., UnpackResult]) -> None:
    blob = zst([GOOD])
    with pytest.raises(IntegrityError, match="lacks"):
        arena(blob, [GOOD_ENTRY, entry("cache/l", link="good")])


# --------------------------------------------------------------------------
# symlinks and later members
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("members", "entries"),
    [
        pytest.param(
            [dirm("cache/sub"), sym("cache/link", "sub"), reg("cache/link/x", b"through")],
            [entry("cache/link", link="sub"), entry("cache/link/x", b"through")],
            id="link-then-file-listed",
        ),
        pytest.param(
            [sym("cache/link", "sub"), reg("cache/link/x", b"through")],
            [entry("cache/link", link="sub")],
            id="link-then-file-unlisted",
        ),
        pytest.param(
            [reg("cache/link/x", b"through"), sym("cache/link", "sub")],
            [entry("cache/link", link="sub"), entry("cache/link/x", b"through")],
            id="file-then-link",
        ),
        pytest.param(
            [sym("cache/up", "."), sym("cache/link", "up"), reg("cache/link/x", b"through")],
            [
                entry("cache/up", link="."),
                entry("cache/link", link="up"),
                entry("cache/link/x", b"through"),
            ],
            id="chained-links",
        ),
    ],
)
def test_no_write_through_symlink_member(
    members: list[Member],
    entries: list[FileEntry],
    arena: Callable[..., UnpackResult],
    tmp_path: Path,
) -> None:
    staging = tmp_path / "stage"
    # A refusal is one of ours (exit code 5 with a message), never a raw OSError.
    try:
        arena(zst(members), entries)
    except IntegrityError:
        refused = True
    else:
        refused = False
    # Either refused, or the file landed in a real directory inside staging.
    assert not (staging / "cache" / "sub" / "x").exists()
    assert not (staging / "cache" / "x").exists()
    for dirpath, _, filenames in os.walk(staging):
        for name in filenames:
            path = Path(dirpath) / name
            if not path.is_symlink() and path.read_bytes() == b"through":
                assert path == staging / "cache" / "link" / "x"
    if not refused:
        link = staging / "cache" / "link"
        assert not link.is_symlink()
        assert (link / "x").read_bytes() == b"through"


def test_symlink_over_written_dir_is_an_artifactd_error(
    arena: Callable[..., UnpackResult],
) -> None:
    blob = zst([sym("cache/link", "sub"), reg("cache/link/x", b"through")])
    with pytest.raises(UnsafeArtifactError, match="collides"):
        arena(blob, [entry("cache/link", link="sub"), entry("cache/link/x", b"through")])


def test_file_over_directory_member_is_an_artifactd_error(
    arena: Callable[..., UnpackResult],
) -> None:
    blob = zst([dirm("cache/a"), reg("cache/a", b"x")])
    with pytest.raises(UnsafeArtifactError, match="collides"):
        arena(blob, [entry("cache/a", b"x")])


@pytest.mark.parametrize(
    "links",
    [
        pytest.param([("cache/y", "."), ("cache/b", "y/y/../..")], id="dot-link-then-up"),
        pytest.param(
            [("cache/d/e/up", ".."), ("cache/b", "d/e/up/e/up/../../../..")],
            id="parent-link-then-up",
        ),
        pytest.param([("cache/y", "."), ("cache/z", "y/y"), ("cache/b", "z/z/../..")], id="chain"),
    ],
)
def test_symlink_chain_cannot_escape_root(links: list[tuple[str, str]], tmp_path: Path) -> None:
    staging = tmp_path / "stage"
    members = [dirm("cache/d/e")] + [sym(name, target) for name, target in links]
    blob = zst(members)
    with pytest.raises(UnsafeArtifactError, match="outside"):
        unpack_layer(
            io.BytesIO(blob),
            digest=sha(blob),
            size=len(blob),
            entries=[entry(name, link=target) for name, target in links],
            staging=staging,
            components=CACHE,
        )
    assert not (tmp_path / "stage" / "evil").exists()


def test_symlink_chain_that_stays_inside_is_kept(arena: Callable[..., UnpackResult]) -> None:
    links = [
        ("cache/d/up", ".."),
        ("cache/b", "d/up/good"),
        ("cache/y", "."),
        ("cache/c", "y/good"),
    ]
    blob = zst([GOOD, dirm("cache/d")] + [sym(n, t) for n, t in links])
    res = arena(blob, [GOOD_ENTRY] + [entry(n, link=t) for n, t in links])
    assert res.files == 5


def test_unpacked_modes_do_not_depend_on_umask(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write(src / "r", b"r", 0o644)
    write(src / "x", b"x", 0o755)
    write(src / "sub" / "deeper" / "y", b"y", 0o644)
    layer = pack_tree(src, tmp_path / "u.tar.zst")
    with umask(0o077):
        unpack_packed(layer, tmp_path / "stage")
    cache = tmp_path / "stage" / "cache"
    assert stat.S_IMODE((cache / "r").stat().st_mode) == 0o644
    assert stat.S_IMODE((cache / "x").stat().st_mode) == 0o755
    assert stat.S_IMODE((cache / "sub" / "deeper" / "y").stat().st_mode) == 0o644
    for d in (cache, cache / "sub", cache / "sub" / "deeper"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o755


def test_non_utf8_names_are_skipped_not_packed(tmp_path: Path) -> None:
    src = tmp_path / "src"
    write(src / "ok.bin", b"ok")
    with open(os.fsencode(src) + b"/\xff\xfe.bin", "wb") as out:
        out.write(b"bad name")
    layer = pack_tree(src, tmp_path / "n.tar.zst")
    for f in layer.files:
        f.path.encode("utf-8")  # every recorded path must survive JSON serialisation
    assert [f.path for f in layer.files] == ["cache/ok.bin"]
    assert len(layer.skipped) == 1
    layer.skipped[0].path.encode("utf-8")
    assert {m.name for m, _ in tar_members(layer)} == {"cache", "cache/ok.bin"}
