"""Restore: find the artifact matching this machine and install it atomically.

Plan, then execute. :func:`plan_restore` resolves, with a few tag lookups and
never a scan, the whole artifact tagged ``fp-<local hash>``, else each
family's ``<family>-<local scope key>`` tag, and says for every family whether
it will hit and why not. :func:`execute` then:

1. extracts every layer into ``<target>/.artifactd/staging-*`` (same
   filesystem), verifying digests and refusing hostile members;
2. swaps each component directory into place (``renameat2(RENAME_EXCHANGE)``
   where the kernel has it, else rename-aside), so a reader sees the old
   directory or the new one, never a mix;
3. writes the completion marker and the env file, each atomically.

A failure before step 2 leaves every existing cache untouched. A second run
whose marker already records the planned layers does nothing.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import shutil
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from artifactd.errors import ArtifactdError, StoreError, UsageError
from artifactd.events import EventSink, discard
from artifactd.families import Family, get_family, select_families
from artifactd.fsutil import atomic_write
from artifactd.oci import FULL_TAG_PREFIX, family_tag, full_tag
from artifactd.probing import scope_key
from artifactd.stores import Store

if TYPE_CHECKING:
    # Only planning a miss or executing needs these; a no-op restore never imports them.
    from artifactd.archive import Readable
    from artifactd.artifacts import Artifact
    from artifactd.diff import FieldDiff
    from artifactd.fingerprint import Fingerprint
    from artifactd.manifest import LayerRecord

STATE_DIR = ".artifactd"
MARKER_NAME = "restored.json"
ENV_FILE_NAME = "artifactd.env"
#: How many whole artifacts a miss reads to name the nearest candidate.
NEAREST_LIMIT = 16

Verdict = Literal["hit", "miss"]


@dataclass
class FamilyPlan:
    """What restore will do for one family."""

    family: str
    verdict: Verdict
    source: Literal["full", "family"] | None = None
    artifact: str | None = None
    layer: LayerRecord | None = None
    dirs: dict[str, str] = field(default_factory=dict)
    reason: str | None = None
    deciding: list[FieldDiff] = field(default_factory=list)
    tag: str | None = None
    files: int = 0
    unpacked: int = 0

    def __post_init__(self) -> None:
        if self.layer is not None:
            self.files = len(self.layer.files)
            self.unpacked = self.layer.unpacked_size

    @property
    def bytes(self) -> int:
        """Compressed bytes to fetch."""
        return self.layer.size if self.layer else 0


@dataclass
class Nearest:
    """The closest artifact in the store when nothing matched exactly."""

    tag: str
    digest: str
    differing: list[FieldDiff]
    artifact: Artifact | None = field(default=None, repr=False)


@dataclass
class RestorePlan:
    """The result of resolution: per-family verdicts and where things will go."""

    store: str
    target: str
    fingerprint_hash: str
    match: Literal["full", "partial", "miss"]
    families: list[FamilyPlan]
    env: dict[str, str]
    env_file: str
    nearest: Nearest | None = None
    error: str | None = None
    noop: bool = False

    @property
    def hits(self) -> list[FamilyPlan]:
        """Families that will be restored."""
        return [f for f in self.families if f.verdict == "hit"]

    @property
    def bytes_to_fetch(self) -> int:
        """Compressed bytes of every layer that will be fetched."""
        return sum(f.bytes for f in self.hits)


@dataclass
class RestoreResult:
    """What :func:`execute` did."""

    plan: RestorePlan
    restored: list[str]
    files: int
    bytes: int
    seconds: float
    noop: bool


# --------------------------------------------------------------------------
# Planning
# --------------------------------------------------------------------------


def _family_dirs(fam: Family, target: Path, user: str | None) -> dict[str, str]:
    return {k: str(v) for k, v in fam.restore_dirs(target, user=user).items()}


def plan_restore(
    store: Store | None,
    local: Fingerprint,
    target: Path,
    *,
    families: Sequence[str] | None = None,
    consumer_user: str | None = None,
    env_file: Path | None = None,
    store_ref: str | None = None,
    store_error: str | None = None,
    check_noop: bool = True,
) -> RestorePlan:
    """Resolve what to restore for ``local`` into ``target``; fetch no layer.

    ``check_noop=False`` skips the marker check, for callers that just made it
    with :func:`quick_noop`.
    """
    target = target.absolute()
    selected = select_families(families)
    ref = store.ref if store is not None else (store_ref or "?")
    plans: list[FamilyPlan] = []
    match: Literal["full", "partial", "miss"] = "miss"
    nearest: Nearest | None = None
    error = store_error
    if store is not None and check_noop:
        quick = quick_noop(
            store, local.hash, local.flatten(), target, families=families, env_file=env_file
        )
        if quick is not None:
            return quick
    if store is not None:
        try:
            plans, match = _resolve(store, local, selected, target, consumer_user)
            if any(p.verdict == "miss" for p in plans) and match != "full":
                # Only a miss lists tags: resolving itself is tag lookups, never a scan.
                nearest = _nearest(store, local)
                _explain_misses(plans, local, nearest)
        except StoreError as exc:
            error = exc.message
            plans = []
    if not plans:
        plans = [
            FamilyPlan(
                fam.name,
                "miss",
                reason=error or "store unavailable",
                dirs=_family_dirs(fam, target, consumer_user),
            )
            for fam in selected
        ]
    env: dict[str, str] = {}
    for fp in plans:
        if fp.verdict == "hit":
            env.update(get_family(fp.family).restore_env(target, user=consumer_user))
    return RestorePlan(
        store=ref,
        target=str(target),
        fingerprint_hash=local.hash,
        match=match,
        families=plans,
        env=env,
        env_file=str(env_file or target / ENV_FILE_NAME),
        nearest=nearest,
        error=error,
    )


def quick_noop(
    store: Store,
    fingerprint_hash: str,
    flat: dict[str, Any],
    target: Path,
    *,
    families: Sequence[str] | None = None,
    env_file: Path | None = None,
) -> RestorePlan | None:
    """Return a no-op plan when the marker shows this exact resolution is installed.

    Takes the fingerprint as its hash and flattened fields (no model needed), and
    costs a few tag lookups and no config parsing: the init container of a
    restarted pod with a warm volume finishes in a fraction of a second.
    """
    target = target.absolute()
    marker = _read_marker(target)
    names = [f.name for f in select_families(families)]
    env_path = env_file or target / ENV_FILE_NAME
    if (
        marker is None
        or marker["fingerprint_hash"] != fingerprint_hash
        or marker["store"] != store.ref
        or marker["selected"] != names
        or not env_path.is_file()
        or any(
            not Path(d).is_dir() for f in marker["families"].values() for d in f["dirs"].values()
        )
        or not _tags_still_resolve(store, marker, fingerprint_hash, flat)
    ):
        return None
    plans = [
        FamilyPlan(
            name,
            "hit",
            fm["source"],
            fm["artifact"],
            None,
            dict(fm["dirs"]),
            tag=fm["tag"],
            files=fm["files"],
            unpacked=fm["bytes"],
        )
        if (fm := marker["families"].get(name)) is not None
        else FamilyPlan(name, "miss", reason="no matching artifact (unchanged since last restore)")
        for name in names
    ]
    return RestorePlan(
        store=store.ref,
        target=str(target),
        fingerprint_hash=fingerprint_hash,
        match=marker["match"],
        families=plans,
        env=dict(marker["env"]),
        env_file=str(env_path),
        noop=True,
    )


def _tags_still_resolve(
    store: Store, marker: dict[str, Any], fingerprint_hash: str, flat: dict[str, Any]
) -> bool:
    """:func:`_tags_unchanged`, where an unreachable store means "resolve again".

    Resolving again reports the store error as a miss and leaves the installed
    caches (and their env file) as they are.
    """
    try:
        return _tags_unchanged(store, marker, fingerprint_hash, flat)
    except StoreError:
        return False


def _tags_unchanged(
    store: Store, marker: dict[str, Any], fingerprint_hash: str, flat: dict[str, Any]
) -> bool:
    """Whether resolving now would pick exactly the manifests the marker records."""
    recorded = marker["families"].values()
    full = store.tag_digest(full_tag(fingerprint_hash))
    if marker["match"] == "full":
        return full is not None and all(f["artifact"] == full for f in recorded)
    if full is not None:
        return False  # a whole artifact appeared since: restore it
    for fam in recorded:
        if store.tag_digest(fam["tag"]) != fam["artifact"]:
            return False
    for name in marker["missed"]:
        fam_def = get_family(name)
        key = scope_key(flat, name, fam_def.scope, fam_def.scope_revision)
        if store.tag_digest(family_tag(name, key)) is not None:
            return False  # a family that missed last time has an artifact now
    return True


def _resolve(
    store: Store,
    local: Fingerprint,
    selected: list[Family],
    target: Path,
    user: str | None,
) -> tuple[list[FamilyPlan], Literal["full", "partial", "miss"]]:
    from artifactd.artifacts import read_artifact

    full = read_artifact(store, full_tag(local.hash))
    plans: list[FamilyPlan] = []
    if full is not None:
        for fam in selected:
            rec = full.config.layer(fam.name)
            dirs = _family_dirs(fam, target, user)
            if rec is None:
                plans.append(
                    FamilyPlan(
                        fam.name,
                        "miss",
                        dirs=dirs,
                        reason="the matching artifact has no such cache",
                    )
                )
            else:
                plans.append(
                    FamilyPlan(
                        fam.name, "hit", "full", full.digest, rec, dirs, tag=full_tag(local.hash)
                    )
                )
        return plans, "full"
    for fam in selected:
        key = local.scope_key(fam.name, fam.scope, fam.scope_revision)
        dirs = _family_dirs(fam, target, user)
        tag = family_tag(fam.name, key)
        art = read_artifact(store, tag)
        rec = art.config.layer(fam.name) if art is not None else None
        if art is None or rec is None:
            plans.append(
                FamilyPlan(
                    fam.name,
                    "miss",
                    dirs=dirs,
                    reason="no artifact in the store has this family's scope",
                )
            )
        else:
            plans.append(FamilyPlan(fam.name, "hit", "family", art.digest, rec, dirs, tag=tag))
    hit = any(p.verdict == "hit" for p in plans)
    return plans, "partial" if hit else "miss"


def _nearest(store: Store, local: Fingerprint) -> Nearest | None:
    """Read up to :data:`NEAREST_LIMIT` whole artifacts and pick the least different."""
    from artifactd.artifacts import read_artifact
    from artifactd.diff import differences

    best: tuple[int, Nearest] | None = None
    here = local.flatten()
    for tag in list(store.iter_tags(FULL_TAG_PREFIX))[:NEAREST_LIMIT]:
        try:
            art = read_artifact(store, tag)
        except ArtifactdError:
            continue
        if art is None:
            continue
        differing = differences(art.config.fingerprint.flatten(), here)
        if best is None or len(differing) < best[0]:
            best = (len(differing), Nearest(tag, art.digest, differing, art))
    return best[1] if best else None


def _explain_misses(plans: list[FamilyPlan], local: Fingerprint, nearest: Nearest | None) -> None:
    from artifactd.diff import family_verdict

    if nearest is None or nearest.artifact is None:
        return
    art = nearest.artifact
    for p in plans:
        if p.verdict != "miss":
            continue
        fam = get_family(p.family)
        if art.config.layer(fam.name) is None:
            continue
        verdict = family_verdict(fam, art.config.fingerprint, local)
        p.deciding = verdict.deciding
        if verdict.deciding:
            names = ", ".join(d.path for d in verdict.deciding)
            p.reason = f"nearest artifact {nearest.tag[:19]}... differs in {names}"


# --------------------------------------------------------------------------
# Execution
# --------------------------------------------------------------------------


LOCK_NAME = "lock"


@contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    """Hold an exclusive flock on ``path`` (one restore into a target at a time)."""
    import fcntl

    with path.open("a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        yield


def _installed(plan: RestorePlan, target: Path) -> bool:
    """Whether the marker already records exactly the layers this plan would install."""
    marker = _read_marker(target)
    if marker is None:
        return False
    for fp in plan.hits:
        rec = marker["families"].get(fp.family)
        if rec is None or fp.layer is None or rec.get("layer") != fp.layer.digest:
            return False
        if any(not Path(d).is_dir() for d in rec["dirs"].values()):
            return False
    return Path(plan.env_file).is_file()


def _clean_leftovers(state: Path) -> None:
    """Remove staging and trash dirs of a restore that crashed (we hold the lock)."""
    for child in state.iterdir():
        if child.is_dir() and child.name.startswith(("staging-", "trash-")):
            shutil.rmtree(child, ignore_errors=True)


_MARKER_KEYS = ("fingerprint_hash", "store", "match", "selected", "missed", "families", "env")
_FAMILY_KEYS = ("artifact", "tag", "source", "layer", "dirs", "files", "bytes")


def _read_marker(target: Path) -> dict[str, Any] | None:
    """Read the marker as plain JSON; anything unexpected means "restore again"."""
    try:
        doc = json.loads((target / STATE_DIR / MARKER_NAME).read_bytes())
    except (OSError, ValueError):
        return None
    ok = (
        isinstance(doc, dict)
        and doc.get("schema_version") == 1
        and all(k in doc for k in _MARKER_KEYS)
        and isinstance(doc["families"], dict)
        and all(
            isinstance(f, dict)
            and all(k in f for k in _FAMILY_KEYS)
            and isinstance(f["dirs"], dict)
            for f in doc["families"].values()
        )
    )
    return doc if ok else None


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


@functools.cache
def _renameat2() -> Any:
    """Return libc's renameat2, or None where libc lacks it (old glibc, musl, macOS)."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)  # the libc this process already loaded
    except OSError:
        return None
    return getattr(libc, "renameat2", None)


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths with renameat2(RENAME_EXCHANGE); False if unsupported."""
    fn = _renameat2()
    if fn is None:
        return False
    rc = fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE)
    return bool(rc == 0)


def _install(staged: Path, dest: Path, trash: Path) -> None:
    """Put ``staged`` at ``dest``; whatever was at ``dest`` ends up under ``trash``."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.is_symlink() or dest.is_file():
        dest.unlink()
    if not dest.exists():
        os.rename(staged, dest)
        return
    aside = trash / os.urandom(8).hex()
    trash.mkdir(parents=True, exist_ok=True)
    if _exchange(staged, dest):
        os.rename(staged, aside)  # ``staged`` now holds the old directory
        return
    os.rename(dest, aside)
    os.rename(staged, dest)


_SAFE_VALUE = re.compile(r"^[A-Za-z0-9_./:@%+=,-]*$")


def render_env_file(env: dict[str, str]) -> str:
    """Render ``KEY=VALUE`` lines (quoted only when needed), for docker/systemd or ``set -a; .``."""
    lines = ["# Written by artifactd restore. Load with: set -a; . THIS_FILE; set +a"]
    for key in sorted(env):
        value = env[key]
        if "\n" in value:
            raise UsageError(f"env value for {key} contains a newline")
        lines.append(f"{key}={value if _SAFE_VALUE.match(value) else shlex.quote(value)}")
    return "\n".join(lines) + "\n"


def execute(
    plan: RestorePlan,
    store: Store,
    *,
    on_event: EventSink = discard,
    max_workers: int = 4,
) -> RestoreResult:
    """Fetch, verify, stage and install every family the plan hits."""
    start = time.monotonic()
    target = Path(plan.target)
    if plan.noop:
        on_event({"stage": "restore", "event": "noop", "target": plan.target})
        return RestoreResult(plan, [], 0, 0, round(time.monotonic() - start, 3), noop=True)
    hits = plan.hits
    if not hits:
        return RestoreResult(plan, [], 0, 0, round(time.monotonic() - start, 3), noop=False)
    state = target / STATE_DIR
    state.mkdir(parents=True, exist_ok=True)
    with _exclusive(state / LOCK_NAME):
        # Two init containers restoring into one node-local volume: the second
        # waits here, then finds the first one's marker and does nothing.
        if _installed(plan, target):
            on_event({"stage": "restore", "event": "noop", "target": plan.target})
            return RestoreResult(plan, [], 0, 0, round(time.monotonic() - start, 3), noop=True)
        _clean_leftovers(state)
        return _execute_locked(
            plan, store, state, start=start, on_event=on_event, max_workers=max_workers
        )


def _execute_locked(
    plan: RestorePlan,
    store: Store,
    state: Path,
    *,
    start: float,
    on_event: EventSink,
    max_workers: int,
) -> RestoreResult:
    hits = plan.hits
    run_id = os.urandom(6).hex()
    staging = state / f"staging-{run_id}"
    trash = state / f"trash-{run_id}"
    try:
        totals = _stage_all(hits, store, staging, on_event, max_workers)
        for fp in hits:
            for comp in fp.layer.components if fp.layer else []:
                _install(staging / fp.family / comp, Path(fp.dirs[comp]), trash)
            on_event({"stage": "install", "event": "done", "family": fp.family})
        from artifactd.marker import FamilyMarker, RestoreMarker

        marker = RestoreMarker(
            fingerprint_hash=plan.fingerprint_hash,
            store=plan.store,
            match="full" if plan.match == "full" else "partial",
            selected=[f.family for f in plan.families],
            missed=[f.family for f in plan.families if f.verdict == "miss"],
            families={
                fp.family: FamilyMarker(
                    artifact=fp.artifact or "",
                    tag=fp.tag or "",
                    source=fp.source or "full",
                    layer=fp.layer.digest if fp.layer else "",
                    scope_key=fp.layer.scope_key if fp.layer else "",
                    dirs={c: fp.dirs[c] for c in (fp.layer.components if fp.layer else [])},
                    files=fp.files,
                    bytes=fp.unpacked,
                )
                for fp in hits
            },
            restored_at=round(time.time(), 3),
            env=plan.env,
        )
        atomic_write(
            state / MARKER_NAME, json.dumps(marker.model_dump(mode="json"), indent=2).encode()
        )
        atomic_write(Path(plan.env_file), render_env_file(plan.env).encode())
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(trash, ignore_errors=True)
    files = sum(t[0] for t in totals)
    nbytes = sum(t[1] for t in totals)
    return RestoreResult(
        plan, [fp.family for fp in hits], files, nbytes, round(time.monotonic() - start, 3), False
    )


class _Progress:
    """Count bytes read from a layer stream; emit a throttled ``progress`` event."""

    interval_s = 0.25

    def __init__(self, source: Readable, family: str, total: int, on_event: EventSink) -> None:
        self._source = source
        self._family = family
        self._total = total
        self._on_event = on_event
        self._done = 0
        self._last = time.monotonic()

    def read(self, n: int = -1, /) -> bytes:
        data = self._source.read(n)
        self._done += len(data)
        now = time.monotonic()
        if now - self._last >= self.interval_s:
            self._last = now
            self._on_event(
                {
                    "stage": "fetch",
                    "event": "progress",
                    "family": self._family,
                    "bytes": self._done,
                    "total": self._total,
                }
            )
        return data


def _stage_all(
    hits: list[FamilyPlan],
    store: Store,
    staging: Path,
    on_event: EventSink,
    max_workers: int,
) -> list[tuple[int, int]]:
    from artifactd.archive import unpack_layer  # zstd and tarfile: only when there is work

    def stage(fp: FamilyPlan) -> tuple[int, int]:
        layer = fp.layer
        if layer is None:  # pragma: no cover - hits always carry a layer
            return 0, 0
        fam = get_family(fp.family)
        t0 = time.monotonic()

        def relocate(member: str, data: bytes) -> bytes:
            comp = member.split("/", 1)[0]
            return fam.relocate(data, fp.dirs[comp])

        with store.open_blob(layer.digest, layer.size) as blob:
            res = unpack_layer(
                _Progress(blob, fp.family, layer.size, on_event),
                digest=layer.digest,
                size=layer.size,
                entries=layer.files,
                staging=staging / fp.family,
                components=frozenset(layer.components),
                relocate=relocate,
                keep_mtimes=fam.keep_mtimes,
            )
        on_event(
            {
                "stage": "fetch",
                "event": "done",
                "family": fp.family,
                "files": res.files,
                "bytes": res.bytes,
                "elapsed_ms": round((time.monotonic() - t0) * 1000, 1),
            }
        )
        return res.files, res.bytes

    if len(hits) == 1 or max_workers <= 1:
        return [stage(fp) for fp in hits]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(max_workers, len(hits))) as pool:
        return list(pool.map(stage, hits))
