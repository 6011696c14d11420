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
