"""Small filesystem helpers shared by the stores and restore."""

from __future__ import annotations

import os
from pathlib import Path


def atomic_write(path: Path, data: bytes, *, mode: int = 0o644, durable: bool = False) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the new one, never a part.

    A temp file in the same directory is written, given ``mode``, then renamed
    over ``path``; on any error the temp file is removed. ``durable`` also
    fsyncs the file before the rename and the directory after it, so the new
    content survives a power cut once this returns (commit points need that).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = write_temp(path.parent, data, mode=mode, durable=durable)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)


def write_temp(
    directory: Path,
    data: bytes,
    *,
    mode: int = 0o644,
    durable: bool = False,
    prefix: str = ".tmp-",
) -> Path:
    """Write ``data`` to a new temp file in ``directory`` and return its path.

    Used to get the bytes of a later rename onto disk first: the rename itself
    needs no space, so it cannot fail for a full disk.
    """
    import tempfile  # with random and shutil: a no-op restore writes nothing

    fd, tmp = tempfile.mkstemp(dir=directory, prefix=prefix)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, mode)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def fsync_dir(directory: Path) -> None:
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


def sync_filesystem(path: Path) -> None:
    """Flush the dirty data of the filesystem holding ``path`` (syncfs(2); sync(2) without it)."""
    import ctypes

    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fn = getattr(ctypes.CDLL(None, use_errno=True), "syncfs", None)
        if fn is None or fn(fd) != 0:
            os.sync()
    finally:
        os.close(fd)
