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

import ctypes
import ctypes.util
import functools
import json
import os
import re
import shlex
import shutil
import tempfile
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from artifactd.archive import unpack_layer
from artifactd.artifacts import Artifact, read_artifact
from artifactd.diff import FieldDiff, family_verdict
from artifactd.errors import ArtifactdError, StoreError, UsageError
from artifactd.events import EventSink, discard
from artifactd.families import Family, get_family, select_families
from artifactd.fingerprint import Fingerprint
from artifactd.manifest import LayerRecord
from artifactd.oci import FULL_TAG_PREFIX, family_tag, full_tag
from artifactd.stores import Store

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


class FamilyMarker(BaseModel):
    """Marker record of one installed family."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    artifact: str
    layer: str
    scope_key: str
    dirs: dict[str, str]


class RestoreMarker(BaseModel):
    """``<target>/.artifactd/restored.json``: written last, after every rename."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    schema_version: Literal[1] = 1
    fingerprint_hash: str
    store: str
    families: dict[str, FamilyMarker]
    restored_at: float
    env: dict[str, str]


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
) -> RestorePlan:
    """Resolve what to restore for ``local`` into ``target``; fetch no layer."""
    target = target.absolute()
    selected = select_families(families)
    ref = store.ref if store is not None else (store_ref or "?")
    plans: list[FamilyPlan] = []
    match: Literal["full", "partial", "miss"] = "miss"
    nearest: Nearest | None = None
    error = store_error
    if store is not None:
        try:
            plans, match = _resolve(store, local, selected, target, consumer_user)
            if match != "full":
                nearest = _nearest(store, local)
                _explain_misses(plans, local, nearest, store)
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
    plan = RestorePlan(
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
    plan.noop = _marker_matches(plan)
    return plan


def _resolve(
    store: Store,
    local: Fingerprint,
    selected: list[Family],
    target: Path,
    user: str | None,
) -> tuple[list[FamilyPlan], Literal["full", "partial", "miss"]]:
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
                plans.append(FamilyPlan(fam.name, "hit", "full", full.digest, rec, dirs))
        return plans, "full"
    for fam in selected:
        key = local.scope_key(fam.name, fam.scope, fam.scope_revision)
        dirs = _family_dirs(fam, target, user)
        art = read_artifact(store, family_tag(fam.name, key))
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
            plans.append(FamilyPlan(fam.name, "hit", "family", art.digest, rec, dirs))
    hit = any(p.verdict == "hit" for p in plans)
    return plans, "partial" if hit else "miss"


def _nearest(store: Store, local: Fingerprint) -> Nearest | None:
    """Read up to :data:`NEAREST_LIMIT` whole artifacts and pick the least different."""
    best: tuple[int, Nearest] | None = None
    for tag in list(store.iter_tags(FULL_TAG_PREFIX))[:NEAREST_LIMIT]:
        try:
            art = read_artifact(store, tag)
        except ArtifactdError:
            continue
        if art is None:
            continue
        a, b = art.config.fingerprint.flatten(), local.flatten()
        differing = [
            FieldDiff(k, a.get(k), b.get(k))
            for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k)
        ]
        if best is None or len(differing) < best[0]:
            best = (len(differing), Nearest(tag, art.digest, differing))
    return best[1] if best else None


def _explain_misses(
    plans: list[FamilyPlan], local: Fingerprint, nearest: Nearest | None, store: Store
) -> None:
    if nearest is None:
        return
    art: Artifact | None = read_artifact(store, nearest.digest)
    if art is None:
        return
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


def _read_marker(target: Path) -> RestoreMarker | None:
    path = target / STATE_DIR / MARKER_NAME
    try:
        return RestoreMarker.model_validate_json(path.read_bytes())
    except (OSError, ValidationError):
        return None


def _marker_matches(plan: RestorePlan) -> bool:
    if not plan.hits:
        return False
    marker = _read_marker(Path(plan.target))
    if marker is None:
        return False
    for fp in plan.hits:
        rec = marker.families.get(fp.family)
        if rec is None or fp.layer is None or rec.layer != fp.layer.digest:
            return False
        if any(not Path(d).is_dir() for d in rec.dirs.values()):
            return False
    return Path(plan.env_file).is_file()


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


@functools.cache
def _renameat2() -> Any:
    """Return libc's renameat2, or None where libc lacks it (old glibc, musl, macOS)."""
    name = ctypes.util.find_library("c")
    if not name:
        return None
    return getattr(ctypes.CDLL(name, use_errno=True), "renameat2", None)


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
    aside = trash / uuid.uuid4().hex
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


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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
    run_id = uuid.uuid4().hex[:12]
    staging = state / f"staging-{run_id}"
    trash = state / f"trash-{run_id}"
    try:
        totals = _stage_all(hits, store, staging, on_event, max_workers)
        for fp in hits:
            for comp in fp.layer.components if fp.layer else []:
                _install(staging / fp.family / comp, Path(fp.dirs[comp]), trash)
            on_event({"stage": "install", "event": "done", "family": fp.family})
        marker = RestoreMarker(
            fingerprint_hash=plan.fingerprint_hash,
            store=plan.store,
            families={
                fp.family: FamilyMarker(
                    artifact=fp.artifact or "",
                    layer=fp.layer.digest if fp.layer else "",
                    scope_key=fp.layer.scope_key if fp.layer else "",
                    dirs={c: fp.dirs[c] for c in (fp.layer.components if fp.layer else [])},
                )
                for fp in hits
            },
            restored_at=round(time.time(), 3),
            env=plan.env,
        )
        _atomic_write(state / MARKER_NAME, json.dumps(marker.model_dump(mode="json"), indent=2))
        _atomic_write(Path(plan.env_file), render_env_file(plan.env))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(trash, ignore_errors=True)
    files = sum(t[0] for t in totals)
    nbytes = sum(t[1] for t in totals)
    return RestoreResult(
        plan, [fp.family for fp in hits], files, nbytes, round(time.monotonic() - start, 3), False
    )


def _stage_all(
    hits: list[FamilyPlan],
    store: Store,
    staging: Path,
    on_event: EventSink,
    max_workers: int,
) -> list[tuple[int, int]]:
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
                blob,
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
    with ThreadPoolExecutor(max_workers=min(max_workers, len(hits))) as pool:
        return list(pool.map(stage, hits))
