"""Full and read-only disks for the reliability tests and bench: a tmpfs, filled.

The tests run as root here; where mounting is not permitted, :func:`mount_tmpfs`
says why and the caller skips.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from pathlib import Path


def mount_tmpfs(path: Path, size: str) -> str | None:
    """Mount a tmpfs of ``size`` (``8m``) at ``path``; return why not, or None."""
    path.mkdir(parents=True, exist_ok=True)
    if shutil.which("mount") is None:
        return "no mount(8) on this machine: the tmpfs target cannot be made"
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        return f"mounting a tmpfs is not permitted here (needs root): {proc.stderr.strip()}"
    return None


def unmount(path: Path) -> None:
    """Unmount ``path``, lazily when it is still busy."""
    if subprocess.run(["umount", str(path)], capture_output=True, check=False).returncode:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still write on ``path``'s filesystem."""
    vfs = os.statvfs(path)
    return vfs.f_bavail * vfs.f_frsize


def fill(filler: Path, leave: int = 0) -> None:
    """Grow ``filler`` until only ``leave`` bytes are free (0: until ENOSPC)."""
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        if leave:
            want = free_bytes(filler.parent) - leave
            if want > 0:
                os.posix_fallocate(fd, os.fstat(fd).st_size, want)
            return
        for chunk in (1 << 20, 4096, 1):
            block = b"\0" * chunk
            while True:
                try:
                    if os.write(fd, block) < chunk:
                        break
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
    finally:
        os.close(fd)
