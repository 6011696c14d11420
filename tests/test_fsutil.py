"""The filesystem helpers' hints: they never wait and never fail the caller."""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from artifactd import fsutil


def test_start_writeback_asks_libc_and_tolerates_what_cannot_be_written_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "f"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(fd, os.urandom(1 << 20))
        fsutil.start_writeback(fd, 0, 1 << 20)  # real: libc's sync_file_range
        assert fsutil._SYNC_FILE_RANGE and fsutil._SYNC_FILE_RANGE[0] is not None
    finally:
        os.close(fd)
    assert path.stat().st_size == 1 << 20
    read, write = os.pipe()  # ESPIPE: a hint lost, not an error
    try:
        fsutil.start_writeback(write, 0, 10)
    finally:
        os.close(read)
        os.close(write)
    monkeypatch.setattr(fsutil, "_SYNC_FILE_RANGE", [None])  # a libc without it
    fsutil.start_writeback(0, 0, 1)


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet="/.ab", max_size=12))
def test_path_text_is_what_pathlib_writes(path: str) -> None:
    assert fsutil.path_text(path) == str(PurePosixPath(path))


MEMINFO = b"""MemTotal:       24554112 kB
MemFree:         1021236 kB
Dirty:             81920 kB
Writeback:          2048 kB
WritebackTmp:          0 kB
"""


def test_dirty_bytes_sums_dirty_and_writeback_and_refuses_what_it_cannot_read() -> None:
    assert fsutil.parse_dirty(MEMINFO) == (81920 + 2048) << 10
    assert fsutil.parse_dirty(MEMINFO.replace(b"Writeback:", b"Writebock:")) is None
    assert fsutil.parse_dirty(MEMINFO.replace(b"2048 kB", b"2048 MB")) is None
    assert fsutil.parse_dirty(MEMINFO.replace(b"81920", b"-81920")) is None
    assert fsutil.parse_dirty(b"") is None
    real = fsutil.dirty_bytes()  # this machine's: Linux always has both lines
    assert real is not None and real >= 0


def _tree(root: Path) -> tuple[set[tuple[int, int]], Path]:
    """A staged tree: files, nested directories, a symlink out of it; return what it holds."""
    (root / "a" / "b").mkdir(parents=True)
    for rel in ("f1", "a/f2", "a/b/f3"):
        (root / rel).write_bytes(rel.encode())
    outside = root.parent / "outside"
    outside.write_bytes(b"not ours")
    (root / "a" / "out").symlink_to(outside)
    (root / "a" / "b" / "dirlink").symlink_to(root.parent)
    held = {
        (p.stat().st_dev, p.stat().st_ino) for p in [root, *root.rglob("*")] if not p.is_symlink()
    }
    return held, outside


def test_a_busy_disk_makes_a_tree_durable_file_by_file_and_a_quiet_one_with_one_syncfs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer's gigabytes in the page cache must not hold a restore's commit."""
    held, outside = _tree(tmp_path / "staging")
    synced: list[tuple[int, int]] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        st = os.fstat(fd)
        synced.append((st.st_dev, st.st_ino))
        real_fsync(fd)

    syncfs: list[str] = []
    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(fsutil, "sync_filesystem", lambda path: syncfs.append(str(path)))
    written, files = 3 << 20, 3
    allowance = fsutil.FOREIGN_DIRTY_MAX + files * fsutil.FSYNC_COST_BYTES
    # Quiet: little dirty besides what the restore wrote: one syncfs, no per-file work.
    monkeypatch.setattr(fsutil, "dirty_bytes", lambda: written + allowance)
    assert fsutil.make_durable(tmp_path / "staging", written, files) == "syncfs"
    assert syncfs == [str(tmp_path / "staging")] and synced == []
    # A tree of many files may wait for more of others' data: its fsyncs cost too.
    syncfs.clear()
    monkeypatch.setattr(fsutil, "dirty_bytes", lambda: written + allowance + 1)
    assert fsutil.make_durable(tmp_path / "staging", written, files + 1) == "syncfs"
    assert synced == []
    # Busy: every file and directory of the tree, each once, nothing the symlinks lead to.
    syncfs.clear()
    assert fsutil.make_durable(tmp_path / "staging", written, files) == "fsync"
    assert sorted(synced) == sorted(held) and syncfs == []
    assert (outside.stat().st_dev, outside.stat().st_ino) not in synced
    # Unknown (no /proc): the syncfs, which is always right.
    monkeypatch.setattr(fsutil, "dirty_bytes", lambda: None)
    assert fsutil.make_durable(tmp_path / "staging", written, files) == "syncfs"


def test_an_fsync_that_fails_fails_the_durable_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _tree(tmp_path / "staging")

    def failing_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="Input/output"):
        fsutil.fsync_tree(tmp_path / "staging")


def test_rmtree_removes_a_deep_tree_and_never_follows_a_link(tmp_path: Path) -> None:
    """shutil.rmtree's safe walk without shutil: links are unlinked, never walked through."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep")
    tree = tmp_path / "tree"
    deep = tree.joinpath(*["d"] * 300)  # deeper than a recursive walk would like
    deep.mkdir(parents=True)
    (deep / "f.bin").write_bytes(b"x")
    (tree / "a").mkdir()
    (tree / "a" / "g.bin").write_bytes(b"y")
    (tree / "a" / "to-outside").symlink_to(outside)
    (tree / "a" / "dangling").symlink_to(tmp_path / "nowhere")
    os.mkfifo(tree / "fifo")
    fsutil.rmtree(tree)
    assert not tree.exists() and not tree.is_symlink()
    assert (outside / "keep.txt").read_text() == "keep"  # the link went, not what it names
    fsutil.rmtree(tree)  # nothing there: nothing to do, no error
    (tmp_path / "file").write_bytes(b"f")
    fsutil.rmtree(tmp_path / "file")  # a file is not a directory tree: left alone
    assert (tmp_path / "file").exists()
