"""``artifactd status``: whether the engine used what was restored, or compiled anyway.

Read-only. The restore marker (``<target>/.artifactd/restored.json``) is
trusted exactly as a no-op restore trusts it
(:meth:`artifactd.destination.CacheVolume.installed`: no install in progress,
every recorded dir there, the env file as recorded); nothing is locked,
repaired or written.

Per family selected at the restore:

* ``files_restored``: the marker's count;
* ``files_written``: files under the family's installed dirs whose mtime is
  later than the restore, found by the harvest's own walk
  (:func:`artifactd.families.tree.walk_component`), so what the family leaves
  out (locks, temp and staging dirs) never counts, and neither do the files a
  library rewrites when it merely loads an entry
  (:attr:`~artifactd.families.base.Family.load_rewrites`). What a written file
  means for each library is :attr:`~artifactd.families.base.Family.written_since_restore`.
  An entry the library is still writing (a Triton dir without its group file
  yet) counts: a compile is under way. The restore time is the later of the
  marker's ``restored_at`` and the marker file's own mtime (the file clock
  restored files were stamped with);
* the verdict: ``used`` (restored, nothing written since), ``compiled anyway``
  (restored, and files written since, or the engine's log says it compiled:
  it compiled somewhere the restore did not fill), ``not restored`` (selected
  but missed, not in the marker, or no trusted marker at all).

With an engine log (:mod:`artifactd.enginelogs`) each family also gets what
the engine said.

Exit codes: a status is always 0, whatever it finds, so a readiness probe never
flaps on a restore in progress or a miss (a miss is the fail-open policy:
the engine compiles as before). With ``--fail-on-compile`` it is
:data:`COMPILED_ANYWAY_EXIT` (13) when any family is ``compiled anyway``, and
still 0 for ``not restored``: the verdict only moves from ``used`` to
``compiled anyway`` as files appear, never back, until the next restore.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Literal

from artifactd.destination import CacheVolume
from artifactd.enginelogs import EngineEvidence, LogFacts, evidence, read_log
from artifactd.marker import RestoreMarker

if TYPE_CHECKING:
    from artifactd.families.base import Family

#: ``status --fail-on-compile``: some family was restored and compiled anyway.
COMPILED_ANYWAY_EXIT = 13
#: Paths of written files listed per family.
MAX_EXAMPLES = 5

Verdict = Literal["used", "compiled anyway", "not restored"]
State = Literal["restored", "no marker", "restore in progress", "stale"]


@dataclass(frozen=True)
class FamilyStatus:
    """One family's verdict and the evidence for it.

    ``written_examples`` holds up to :data:`MAX_EXAMPLES` absolute paths;
    ``why`` says in one phrase what decided the verdict; ``engine`` is what
    the engine's log said (None without a log, or when it said nothing).
    """

    family: str
    verdict: Verdict
    files_restored: int
    files_written: int
    written_examples: list[str]
    why: str
    dirs: dict[str, str] = field(default_factory=dict)
    engine: EngineEvidence | None = None


@dataclass(frozen=True)
class TargetStatus:
    """What a target holds and whether the engine used it.

    ``state`` says whether the marker is trusted (``restored``) and, if not,
    ``detail`` why. ``engine_log_error`` is set when the engine log could not
    be read (the status is then made from the files alone).
    """

    target: str
    env_file: str
    state: State
    detail: str | None
    fingerprint_hash: str | None
    restored_at: float | None
    families: list[FamilyStatus]
    engine_log: str | None = None
    engine_log_error: str | None = None

    @property
    def compiled_anyway(self) -> list[str]:
        """Families that were restored and compiled anyway."""
        return [f.family for f in self.families if f.verdict == "compiled anyway"]

    def exit_code(self, *, fail_on_compile: bool) -> int:
        """0, or :data:`COMPILED_ANYWAY_EXIT` with ``fail_on_compile`` and a family compiled."""
        return COMPILED_ANYWAY_EXIT if fail_on_compile and self.compiled_anyway else 0


def target_status(
    target: Path, *, env_file: Path | None = None, engine_log: str | Path | None = None
) -> TargetStatus:
    """Tell, for the restore into ``target``, which families the engine used (changes nothing).

    ``env_file`` is where that restore wrote its env file (default
    TARGET/artifactd.env); ``engine_log`` an engine log to read (``-``:
    standard input). An unreadable log is reported in the result, not raised.
    """
    volume = CacheVolume(target, env_file=env_file)
    facts: LogFacts | None = None
    log_error = None
    if engine_log is not None:
        try:
            facts = read_log(engine_log)
        except OSError as exc:
            log_error = f"cannot read {engine_log}: {exc.strerror or exc}"
    marker = volume.installed()
    common: dict[str, Any] = {
        "target": str(volume.root),
        "env_file": str(volume.env_file),
        "engine_log": None if engine_log is None else str(engine_log),
        "engine_log_error": log_error,
    }
    if marker is None:
        from artifactd.families import FAMILIES

        state, detail = _untrusted(volume)
        why = f"no trusted restore marker: {detail}"
        return TargetStatus(
            state=state,
            detail=detail,
            fingerprint_hash=None,
            restored_at=None,
            families=[_not_restored(name, why, facts) for name in sorted(FAMILIES)],
            **common,
        )
    cutoff = _cutoff(volume, marker)
    return TargetStatus(
        state="restored",
        detail=None,
        fingerprint_hash=marker["fingerprint_hash"],
        restored_at=marker["restored_at"],
        families=[_family(name, marker, cutoff, facts) for name in marker["selected"]],
        **common,
    )


def _untrusted(volume: CacheVolume) -> tuple[State, str]:
    """Why :meth:`CacheVolume.installed` did not trust the marker (read-only)."""
    if volume.journal_path.exists():
        return "restore in progress", (
            f"{volume.journal_path} exists: a restore is installing, or was interrupted "
            "(the next restore repairs it)"
        )
    if not volume.marker_path.exists():
        return "no marker", f"{volume.marker_path} does not exist: nothing was restored here"
    marker = volume.read_marker()
    if marker is None:
        return "stale", f"{volume.marker_path} is not a restore marker this artifactd reads"
    for fam in marker["families"].values():
        for d in fam["dirs"].values():
            if not os.path.isdir(d) or os.path.islink(d):
                return "stale", f"{d}, which the marker records, is not a directory"
    return "stale", (
        f"the env file {volume.env_file} does not hold what the marker records "
        "(edited, or another --env-file)"
    )


def _cutoff(volume: CacheVolume, marker: RestoreMarker) -> float:
    """Return the restore time files are compared with (see the module doc)."""
    try:
        stamped = volume.marker_path.stat().st_mtime
    except OSError:
        stamped = 0.0
    return max(marker["restored_at"], stamped)


def _not_restored(name: str, why: str, facts: LogFacts | None) -> FamilyStatus:
    engine = evidence(facts, name) if facts is not None else None
    return FamilyStatus(name, "not restored", 0, 0, [], why, {}, engine)


def _family(
    name: str, marker: RestoreMarker, cutoff: float, facts: LogFacts | None
) -> FamilyStatus:
    recorded = marker["families"].get(name)
    if recorded is None:
        why = (
            "missed at the restore: no matching artifact"
            if name in marker["missed"]
            else "not in the restore marker"
        )
        return _not_restored(name, why, facts)
    from artifactd.families import get_family

    family = get_family(name)
    dirs = dict(recorded["dirs"])
    written: list[str] = []
    count = 0
    for component, root in sorted(dirs.items()):
        for path in written_since(family, component, Path(root), cutoff):
            count += 1
            if len(written) < MAX_EXAMPLES:
                written.append(path)
    engine = evidence(facts, name, dirs=dirs, cutoff=cutoff) if facts is not None else None
    if count:
        verdict: Verdict = "compiled anyway"
        why = f"{count} file(s) written under the restored dirs since the restore"
    elif engine is not None and engine.compiled:
        verdict = "compiled anyway"
        why = (
            f"the engine log says it compiled ({engine.misses} miss(es)"
            + (", cache disabled" if engine.cache_disabled else "")
            + ") outside the restored dirs"
        )
    else:
        verdict = "used"
        why = "restored, and nothing written under its dirs since"
    return FamilyStatus(name, verdict, recorded["files"], count, written, why, dirs, engine)


def written_since(family: Family, component: str, root: Path, cutoff: float) -> list[str]:
    """Return the files under ``root`` written after ``cutoff`` (absolute paths, walk order).

    Walked as the harvest walks (:func:`walk_component`): what the family
    excludes is not entered and never counts, nor are its load rewrites. An
    entry the harvest would skip as invalid (a partial write) is entered, with
    the same exclusions, since a library writing it is compiling.
    """
    from artifactd.families.tree import walk_component

    found: list[str] = []
    for entry in walk_component(family, component, root):
        if entry.skip is not None and family.excluded(component, entry.rel, entry.is_dir):
            continue
        if entry.skip is not None and entry.is_dir:
            found.extend(_inside(family, component, root, entry.rel, cutoff))
        elif entry.is_file and _counts(family, entry.rel, entry.st, cutoff):
            found.append(str(entry.path))
    return found


def _counts(family: Family, rel: PurePosixPath, st: os.stat_result, cutoff: float) -> bool:
    return st.st_mtime > cutoff and rel.name not in family.load_rewrites


def _inside(
    family: Family, component: str, root: Path, top: PurePosixPath, cutoff: float
) -> list[str]:
    """Walk an entry the harvest skipped as invalid: every file the family does not exclude."""
    found: list[str] = []
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
                and _counts(family, rel, st, cutoff)
            ):
                found.append(str(root / rel))
    return found


def status_report(status: TargetStatus) -> dict[str, Any]:
    """``status --json``: the target, the restore, and per family its verdict and evidence.

    ``{"schema_version": 1, "target", "env_file", "state", "detail",
    "fingerprint_hash", "restored_at", "engine_log", "engine_log_error",
    "compiled_anyway": [names], "families": [{"family", "verdict",
    "files_restored", "files_written", "written_examples", "why", "dirs",
    "engine": null | {"family", "source", "hits", "misses", "cache_dirs",
    "other_dirs": [{"path", "why", "factors"}], "cache_disabled", "lines"}}]}``.
    """
    from artifactd.reports import versioned

    return versioned({**_fields(status), "compiled_anyway": status.compiled_anyway})


def _fields(status: TargetStatus) -> dict[str, Any]:
    import dataclasses

    return {f.name: getattr(status, f.name) for f in dataclasses.fields(status)}


__all__ = [
    "COMPILED_ANYWAY_EXIT",
    "EngineEvidence",
    "FamilyStatus",
    "TargetStatus",
    "status_report",
    "target_status",
    "written_since",
]
