"""torch.compile Mega-Cache: path-independent compiled graphs, saved and loaded in-process.

``torch.compiler.save_cache_artifacts()`` returns the bytes of everything the
process compiled since it started; ``load_cache_artifacts(bytes)`` writes them
into the CURRENT Inductor cache dir of another process. Nothing in them names
a path, so they survive any relocation. Same torch, Triton and GPU required
(the inductor family's scope). On the CPU they carry the graphs but not the C++
kernel ``.so`` files, so the inductor family ships its cache dir as well.

Warm-up side, at the end of the warm-up process::

    from artifactd import megacache
    megacache.save()          # writes $ARTIFACTD_MEGACACHE_DIR/megacache-<pid>.bin

Engine side, early in the serving process (before the first torch.compile)::

    from artifactd import megacache
    megacache.load()          # loads every *.bin in $ARTIFACTD_MEGACACHE_DIR

The inductor family harvests that directory as its ``megacache`` component and
restore points ``ARTIFACTD_MEGACACHE_DIR`` at the restored copy.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from artifactd.constants import ENV_MEGACACHE_DIR, current_environ
from artifactd.errors import UsageError
from artifactd.fsutil import atomic_write

SUFFIX = ".bin"


@dataclass(frozen=True)
class LoadResult:
    """What :func:`load` loaded."""

    files: int
    bytes: int


def _directory(environ: Mapping[str, str], directory: Path | None) -> Path:
    if directory is not None:
        return directory
    value = environ.get(ENV_MEGACACHE_DIR)
    if not value:
        raise UsageError(
            f"{ENV_MEGACACHE_DIR} is not set",
            hint="pass a directory, or set it (restore writes it into the env file)",
        )
    return Path(value)


def save(directory: Path | None = None, *, environ: Mapping[str, str] | None = None) -> Path | None:
    """Save this process's Mega-Cache artifacts; return the file, or None if nothing compiled.

    Call it at the end of a warm-up, in the process that compiled.
    """
    # lazy: torch is optional (the warmup extra); warm-ups and engines import this module
    import torch._dynamo  # noqa: PLC0415
    import torch.compiler  # noqa: PLC0415

    target = _directory(current_environ() if environ is None else environ, directory)
    result = torch.compiler.save_cache_artifacts()
    if result is None:
        return None
    data, _info = result
    final = target / f"megacache-{os.getpid()}{SUFFIX}"
    atomic_write(final, data)
    return final


def load(directory: Path | None = None, *, environ: Mapping[str, str] | None = None) -> LoadResult:
    """Load every saved Mega-Cache file into this process's Inductor cache.

    Call it early in the engine process, before the first torch.compile. A
    missing directory loads nothing (a restore that missed).
    """
    target = _directory(current_environ() if environ is None else environ, directory)
    if not target.is_dir():
        return LoadResult(0, 0)
    # lazy: torch is optional (the warmup extra); warm-ups and engines import this module
    import torch.compiler  # noqa: PLC0415

    files = nbytes = 0
    for path in sorted(target.glob(f"*{SUFFIX}")):
        if path.name.startswith(".tmp-"):
            continue
        data = path.read_bytes()
        torch.compiler.load_cache_artifacts(data)
        files += 1
        nbytes += len(data)
    return LoadResult(files, nbytes)
