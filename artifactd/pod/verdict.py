"""The "compiled anyway" verdict: whether the engine used what a restore installed.

The one owner of that rule. ``artifactd status``, the ``verify`` gate (each
cell's comparison, :func:`artifactd.build.gate.judge_cell`), the status metrics
(:func:`artifactd.pod.metrics.status_registry`) and the engine-log evidence
(:func:`artifactd.pod.enginelogs.restored_key_dirs`) all decide through the
functions below, so they cannot disagree on the same tree:

* the restore time (:func:`restore_time`): the later of the marker's
  ``restored_at`` and the marker file's own mtime (the file clock restored
  files were stamped with; the marker is written last);
* a file was written since the restore when its mtime is later than that
  (:func:`written_after`); a file as old as the restore is one the restore
  installed;
* the files that count (:func:`written_since`): those the harvest's own walk
  (:func:`artifactd.families.tree.walk_component`) sees under the family's
  restored dirs, so what the family leaves out (locks, temp and staging dirs)
  never counts, and neither do the files the library rewrites when it merely
  loads an entry (:attr:`~artifactd.families.base.Family.load_rewrites`, such
  as vLLM's ``vllm_compile_cache.py``), nor a file the restore installed and
  recorded (:mod:`artifactd.restore.installed`) that is written again with
  exactly the bytes it installed (Inductor's entries, which torch's Mega-Cache
  load rewrites when vLLM loads its artifacts). An entry the harvest would skip as
  invalid (a Triton dir without its group file yet) is entered: a library
  writing it is compiling;
* the verdict (:func:`judge`): ``used`` (restored, nothing counted since),
  ``compiled anyway`` (restored, and a file counted, or the engine's log says
  it compiled: somewhere the restore did not fill), ``not restored``
  (:func:`not_restored`: selected but missed, or no trusted marker).

Why mtimes and not a before-and-after listing: a pod has no listing of what
its init container installed, only the marker, and the gate must judge a cell
exactly as a pod's ``status`` judges the same tree.
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Literal

from artifactd.families.tree import walk_component
from artifactd.fsutil import read_regular

if TYPE_CHECKING:
    from artifactd.families.base import Family
    from artifactd.pod.enginelogs import EngineEvidence

#: Paths of written files kept per family.
MAX_EXAMPLES = 5
#: A family's record of what the restore installed of the files its library
#: rewrites at load: ``"<component>/<relative path>"`` to ``(size, sha256)``
#: (:func:`artifactd.restore.installed.read`).
Recorded = Mapping[str, tuple[int, str]]
_NOTHING: Recorded = {}

Verdict = Literal["used", "compiled anyway", "not restored"]


@dataclass(frozen=True)
class FamilyVerdict:
    """One family's verdict and the evidence for it.

    ``files_written`` counts the files written since the restore,
    ``written_examples`` holds up to :data:`MAX_EXAMPLES` of them (absolute
    paths); ``why`` says in one phrase what decided the verdict; ``engine``
    is what the engine's log said (None without a log, or when it said nothing).
    """

    family: str
    verdict: Verdict
    files_written: int
    written_examples: list[str]
    why: str
    engine: EngineEvidence | None = None

    @property
    def used(self) -> bool:
        """Whether the family was restored and the engine compiled nothing."""
        return self.verdict == "used"


def restore_time(marker_path: Path, restored_at: float) -> float:
    """Return the time files are compared with: ``restored_at`` or the marker's mtime, if later."""
    try:
        stamped = marker_path.stat().st_mtime
    except OSError:
        stamped = 0.0
    return max(restored_at, stamped)


def written_after(st: os.stat_result, cutoff: float) -> bool:
    """Whether a file with this stat was written after the restore at ``cutoff``."""
    return st.st_mtime > cutoff


def wait_past(directory: Path, cutoff: float, limit: float = 3.0) -> None:
    """Return once a file written in ``directory`` gets an mtime later than ``cutoff``.

    File times come from a coarse clock (a kernel tick, whole seconds on some
    file systems): a write in the restore's own tick would look restored. The
    gate waits here before it starts a cell, so whatever the cell writes
    counts. Gives up after ``limit`` seconds, or when ``directory`` is not
    writable (the verdict is then only as fine as the clock).
    """
    probe = directory / ".artifactd-clock"
    deadline = time.monotonic() + limit
    try:
        while True:
            with open(probe, "wb"):
                pass
            if written_after(probe.stat(), cutoff) or time.monotonic() > deadline:
                break
            time.sleep(0.002)
        probe.unlink()
    except OSError:
        return


def judge(
    family: Family,
    dirs: Mapping[str, str],
    cutoff: float,
    engine: EngineEvidence | None = None,
    recorded: Recorded = _NOTHING,
) -> FamilyVerdict:
    """Return the verdict of a family the restore at ``cutoff`` installed into ``dirs``.

    ``dirs`` maps its components to their restored dirs (the marker's);
    ``engine`` is what the engine's log said about it, if read; ``recorded``
    the restore's record of its files rewritten at load.
    """
    written = written_files(family, dirs, cutoff, recorded)
    examples = written[:MAX_EXAMPLES]
    if written:
        why = f"{len(written)} file(s) written under the restored dirs since the restore"
        return FamilyVerdict(family.name, "compiled anyway", len(written), examples, why, engine)
    if engine is not None and engine.compiled:
        why = (
            f"the engine log says it compiled ({engine.misses} miss(es)"
            + (", cache disabled" if engine.cache_disabled else "")
            + ") outside the restored dirs"
        )
        return FamilyVerdict(family.name, "compiled anyway", 0, [], why, engine)
    why = "restored, and nothing written under its dirs since"
    return FamilyVerdict(family.name, "used", 0, [], why, engine)


def not_restored(
    name: str, why: str, engine: EngineEvidence | None = None, written: Sequence[str] = ()
) -> FamilyVerdict:
    """Return the verdict of a family that is not restored (``written``: files found since)."""
    return FamilyVerdict(
        name, "not restored", len(written), list(written[:MAX_EXAMPLES]), why, engine
    )


def written_files(
    family: Family, dirs: Mapping[str, str], cutoff: float, recorded: Recorded = _NOTHING
) -> list[str]:
    """Return the files that count under every component dir in ``dirs`` (sorted by component)."""
    found: list[str] = []
    for component, root in sorted(dirs.items()):
        found.extend(written_since(family, component, Path(root), cutoff, recorded))
    return found


def written_since(
    family: Family, component: str, root: Path, cutoff: float, recorded: Recorded = _NOTHING
) -> list[str]:
    """Return the files under ``root`` that count as written after ``cutoff`` (walk order).

    Walked as the harvest walks (:func:`walk_component`): what the family
    excludes is not entered and never counts, nor are its load rewrites. An
    entry the harvest would skip as invalid (a partial write) is entered, with
    the same exclusions, since a library writing it is compiling. A file
    ``recorded`` holds, written again with the recorded size and sha256, is
    the restored entry reloaded and does not count.
    """
    return [path for path, _ in written_entries(family, component, root, cutoff, recorded)]


def written_entries(
    family: Family, component: str, root: Path, cutoff: float, recorded: Recorded = _NOTHING
) -> list[tuple[str, os.stat_result]]:
    """:func:`written_since`, each file with the ``lstat`` the walk judged it by (its size)."""
    found: list[tuple[str, os.stat_result]] = []
    for entry in walk_component(family, component, root):
        if entry.skip is not None and family.excluded(component, entry.rel, entry.is_dir):
            continue
        if entry.skip is not None and entry.is_dir:
            inside = _inside(family, component, root, entry.rel, cutoff=cutoff, recorded=recorded)
            found.extend(inside)
        elif entry.is_file and _counts(
            family,
            component,
            path=entry.path,
            rel=entry.rel,
            st=entry.st,
            cutoff=cutoff,
            recorded=recorded,
        ):
            found.append((str(entry.path), entry.st))
    return found


def _counts(
    family: Family,
    component: str,
    *,
    path: Path,
    rel: PurePosixPath,
    st: os.stat_result,
    cutoff: float,
    recorded: Recorded,
) -> bool:
    if not written_after(st, cutoff) or rel.name in family.load_rewrites:
        return False
    return not _reloaded(path, st, recorded.get(f"{component}/{rel}"))


def _reloaded(path: Path, st: os.stat_result, installed: tuple[int, str] | None) -> bool:
    """Whether the file at ``path`` holds exactly the bytes the restore recorded for it."""
    if installed is None or st.st_size != installed[0]:
        return False
    try:
        data = read_regular(path, installed[0])
    except OSError:
        return False
    return hashlib.sha256(data).hexdigest() == installed[1]


def _inside(
    family: Family,
    component: str,
    root: Path,
    top: PurePosixPath,
    *,
    cutoff: float,
    recorded: Recorded,
) -> list[tuple[str, os.stat_result]]:
    """Walk an entry the harvest skipped as invalid: every file the family does not exclude."""
    found: list[tuple[str, os.stat_result]] = []
    for dirpath, dirnames, filenames in os.walk(root / top):
        rel_dir = PurePosixPath(Path(dirpath).relative_to(root).as_posix())
        dirnames[:] = sorted(
            d for d in dirnames if not family.excluded(component, rel_dir / d, True)
        )
        for name in sorted(filenames):
            rel = rel_dir / name
            try:
                st = os.lstat(root / rel)
            except OSError:
                continue
            if (
                stat.S_ISREG(st.st_mode)
                and not family.excluded(component, rel, False)
                and _counts(
                    family,
                    component,
                    path=root / rel,
                    rel=rel,
                    st=st,
                    cutoff=cutoff,
                    recorded=recorded,
                )
            ):
                found.append((str(root / rel), st))
    return found


__all__ = [
    "MAX_EXAMPLES",
    "FamilyVerdict",
    "Recorded",
    "Verdict",
    "judge",
    "not_restored",
    "restore_time",
    "wait_past",
    "written_after",
    "written_entries",
    "written_files",
    "written_since",
]
