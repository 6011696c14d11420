"""``artifactd status``: whether the engine used what was restored, or compiled anyway.

Read-only. The restore marker (``<target>/.artifactd/restored.json``) is
trusted exactly as a no-op restore trusts it
(:meth:`artifactd.restore.destination.CacheVolume.installed`: no install in progress,
every recorded dir there, the env file as recorded); nothing is locked,
repaired or written.

Per family selected at the restore: ``files_restored`` (the marker's count),
the files written under its restored dirs since the restore, and the verdict
(``used``, ``compiled anyway``, ``not restored``), decided by
:mod:`artifactd.pod.verdict`, the one owner of that rule (the ``verify`` gate and
the metrics apply the same). What a written file means for each library is
:attr:`~artifactd.families.base.Family.written_since_restore`.

With an engine log (:mod:`artifactd.pod.enginelogs`) each family also gets what
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
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from artifactd.families import FAMILIES, get_family
from artifactd.pod.enginelogs import EngineEvidence, LogFacts, evidence, read_log
from artifactd.pod.phases import PhaseTime, restore_phase
from artifactd.pod.verdict import FamilyVerdict, Recorded, judge, not_restored, restore_time
from artifactd.reports import jsonable, versioned
from artifactd.restore import installed
from artifactd.restore.destination import CacheVolume
from artifactd.restore.markertypes import RestoreMarker

if TYPE_CHECKING:
    from artifactd.pod.readiness import Readiness

#: ``status --fail-on-compile``: some family was restored and compiled anyway.
COMPILED_ANYWAY_EXIT = 13
State = Literal["restored", "no marker", "restore in progress", "stale"]


@dataclass(frozen=True)
class FamilyStatus(FamilyVerdict):
    """One family's verdict, with the restore's record.

    The verdict is :class:`~artifactd.pod.verdict.FamilyVerdict`.

    ``files_restored`` is the marker's count of the files installed, ``dirs``
    its restored dirs by component.
    """

    files_restored: int = 0
    dirs: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class TargetStatus:
    """What a target holds and whether the engine used it.

    ``state`` says whether the marker is trusted (``restored``) and, if not,
    ``detail`` why. ``engine_log_error`` is set when the engine log could not
    be read (the status is then made from the files alone). ``phases`` is
    the engine's start, phase by phase (:mod:`artifactd.pod.phases`): the
    restore's from the marker, the rest from the engine log.
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
    phases: list[PhaseTime] = field(default_factory=list)

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
    engine_phases = facts.phases() if facts is not None else []
    common: dict[str, Any] = {
        "target": str(volume.root),
        "env_file": str(volume.env_file),
        "engine_log": None if engine_log is None else str(engine_log),
        "engine_log_error": log_error,
    }
    if marker is None:
        state, detail = _untrusted(volume)
        why = f"no trusted restore marker: {detail}"
        return TargetStatus(
            state=state,
            detail=detail,
            fingerprint_hash=None,
            restored_at=None,
            families=[_not_restored(name, why, facts) for name in sorted(FAMILIES)],
            phases=engine_phases,
            **common,
        )
    cutoff = _cutoff(volume, marker)
    recorded = installed.read(volume.state, marker)
    return TargetStatus(
        state="restored",
        detail=None,
        fingerprint_hash=marker["fingerprint_hash"],
        restored_at=marker["restored_at"],
        families=[
            _family(name, marker, cutoff, facts, recorded.get(name, {}))
            for name in marker["selected"]
        ],
        phases=_with_restore(marker, engine_phases),
        **common,
    )


def _with_restore(marker: RestoreMarker, phases: list[PhaseTime]) -> list[PhaseTime]:
    restore = restore_phase(marker.get("restore_seconds"))
    return phases if restore is None else [restore, *phases]


def _untrusted(volume: CacheVolume) -> tuple[State, str]:
    """Why :meth:`CacheVolume.installed` did not trust the marker (read-only).

    ``os.path.exists``: a path that cannot be looked up (a name too long) is not there.
    """
    if os.path.exists(volume.journal_path):
        return "restore in progress", (
            f"{volume.journal_path} exists: a restore is installing, or was interrupted "
            "(the next restore repairs it)"
        )
    if not os.path.exists(volume.marker_path):
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
    """Return the restore time files are compared with.

    See :func:`artifactd.pod.verdict.restore_time`.
    """
    return restore_time(volume.marker_path, marker["restored_at"])


def _with_record(
    verdict: FamilyVerdict, files_restored: int = 0, dirs: dict[str, str] | None = None
) -> FamilyStatus:
    """Return ``verdict`` with what the marker records of the family."""
    judged = {f.name: getattr(verdict, f.name) for f in fields(FamilyVerdict)}
    return FamilyStatus(**judged, files_restored=files_restored, dirs=dirs or {})


def _not_restored(name: str, why: str, facts: LogFacts | None) -> FamilyStatus:
    engine = evidence(facts, name) if facts is not None else None
    return _with_record(not_restored(name, why, engine))


def _family(
    name: str,
    marker: RestoreMarker,
    cutoff: float,
    facts: LogFacts | None,
    recorded: Recorded,
) -> FamilyStatus:
    record = marker["families"].get(name)
    if record is None:
        why = (
            "missed at the restore: no matching artifact"
            if name in marker["missed"]
            else "not in the restore marker"
        )
        return _not_restored(name, why, facts)

    dirs = dict(record["dirs"])
    engine = evidence(facts, name, dirs=dirs, cutoff=cutoff) if facts is not None else None
    verdict = judge(get_family(name), dirs, cutoff, engine, recorded)
    return _with_record(verdict, record["files"], dirs)


def status_report(status: TargetStatus, ready: Readiness | None = None) -> dict[str, Any]:
    """``status --json``: the target, the restore, and per family its verdict and evidence.

    With ``ready`` (``--engine-url``, ``--prewarm``, ``--ready``) also
    ``"readiness": {"level", "serviceable", "prewarmed", "engine_url",
    "engine", "why_not", "prewarm": null | {"matrix", "cell", "requests",
    "answered", "failures"}}``; always ``"phases": [{"phase", "seconds",
    "source", "outcome", "shapes", "line"}]`` (empty without a marker's record
    or an engine log).

    ``{"schema_version": 1, "target", "env_file", "state", "detail",
    "fingerprint_hash", "restored_at", "engine_log", "engine_log_error",
    "compiled_anyway": [names], "families": [{"family", "verdict",
    "files_restored", "files_written", "written_examples", "why", "dirs",
    "engine": null | {"family", "source", "hits", "misses", "cache_dirs",
    "other_dirs": [{"path", "why", "factors"}], "cache_disabled", "lines"}}]}``.
    """
    body = {**_fields(status), "compiled_anyway": status.compiled_anyway}
    if ready is not None:
        body["readiness"] = {**jsonable(ready), "level": ready.level, "verified": ready.verified}
    return versioned(body)


def _fields(status: TargetStatus) -> dict[str, Any]:
    return {f.name: getattr(status, f.name) for f in fields(status)}


__all__ = [
    "COMPILED_ANYWAY_EXIT",
    "EngineEvidence",
    "FamilyStatus",
    "TargetStatus",
    "status_report",
    "target_status",
]
