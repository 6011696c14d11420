"""Restore's mechanism: install a plan into a cache volume, or change nothing.

Shaped like an installer's ``install(source, destination)``: :func:`restore`
takes a plan (:mod:`artifactd.restore.resolve`), the store the plan's layers
come from and the :class:`CacheVolume` to install into, and either installs
every family of the plan or changes nothing and raises an
:class:`ArtifactdError`. Under the volume's lock it repairs what an
interrupted restore left, checks for a no-op, holds every layer record to the
format's rules, checks the env file can be written and the plan fits in the
free space, all before the first download; then it fetches and extracts every
layer into staging and installs them in one transaction
(:meth:`CacheVolume.install`). The policy around it (what a failure means to
the init container) is :mod:`artifactd.restore.policy`.
"""

from __future__ import annotations

import os
import time
from types import MappingProxyType

from artifactd.events import discard
from artifactd.families import get_family
from artifactd.format.unpack import check_layer
from artifactd.fsutil import FOREIGN_DIRTY_MAX, dirty_bytes, sync_filesystem
from artifactd.records import Record
from artifactd.restore import installed
from artifactd.restore.destination import (
    CacheVolume,
    Swap,
    os_error,
    remove_tree,
)
from artifactd.restore.resolve import FamilyPlan, RestorePlan, noop_plan
from artifactd.workers import Flag, Pool, Thread

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from artifactd.events import EventSink
    from artifactd.fsutil import StrPath

    # Types only: building their classes (TypedDict) costs about 1 ms of every
    # restore that installs; the marker is made as dict literals they check.
    from artifactd.restore.markertypes import FamilyMarker, RestoreMarker
    from artifactd.restore.source import RestoreSource


_NO_PHASES: Mapping[str, float] = MappingProxyType({})


class RestoreResult(Record):
    """What :func:`restore` did."""

    plan: RestorePlan
    restored: list[str]
    files: int
    bytes: int
    seconds: float
    noop: bool
    #: What the repair of an interrupted earlier restore did, if there was one.
    recovered: str | None = None
    #: Seconds per phase: ``verify`` (every record checked, space and target),
    #: ``fetch`` (download, verified and extracted into staging as it streams),
    #: ``install`` (the transaction). :func:`run_restore` adds ``lookup``.
    phases: Mapping[str, float] = _NO_PHASES
    #: Compressed bytes read from the store (from a mounted tree: file bytes).
    bytes_fetched: int = 0


# --------------------------------------------------------------------------
# The mechanism
# --------------------------------------------------------------------------


def restore(
    plan: RestorePlan,
    store: RestoreSource,
    volume: CacheVolume | None = None,
    *,
    on_event: EventSink = discard,
    max_bytes: int | None = None,
    max_workers: int = 4,
) -> RestoreResult:
    """Install every family the plan hits into ``volume``, or change nothing and raise.

    ``store`` is where the plan's layers come from: any
    :class:`~artifactd.restore.source.RestoreSource` (a ``StoreSource``, a mounted tree), read
    only through :meth:`~artifactd.restore.source.RestoreSource.stage_layer`.
    ``volume`` defaults to the plan's target and env file. Raises
    :class:`ArtifactdError` subclasses only: filesystem errors on the target
    become :class:`NoSpaceError` or :class:`TargetError`.
    """
    start = time.monotonic()
    if volume is None:
        volume = CacheVolume(plan.target, env_file=plan.env_file)

    phases: dict[str, float] = {}

    def result(restored: list[str], files: int, nbytes: int, *, noop: bool) -> RestoreResult:
        seconds = round(time.monotonic() - start, 3)
        fetched = sum(fp.bytes for fp in plan.hits) if restored else 0
        return RestoreResult(
            plan, restored, files, nbytes, seconds, noop, recovered, dict(phases), fetched
        )

    recovered: str | None = None
    if plan.noop:
        on_event({"stage": "restore", "event": "noop", "target": plan.target})
        return result([], 0, 0, noop=True)
    if not plan.hits:
        return result([], 0, 0, noop=False)
    try:
        with volume.locked():
            recovered = volume.recover()
            if recovered:
                on_event({"stage": "restore", "event": "recovered", "outcome": recovered})
            # Two init containers restoring into one node-local volume: the second
            # waits for the lock, then finds the first one's marker.
            families = [f.family for f in plan.families]
            if noop_plan(
                store,
                plan.fingerprint_hash,
                plan.flat,
                volume,
                families=families,
                trusted=plan.trusted,
            ):
                on_event({"stage": "restore", "event": "noop", "target": plan.target})
                return result([], 0, 0, noop=True)
            files, nbytes = _restore_locked(
                plan,
                store,
                volume,
                on_event=on_event,
                max_bytes=max_bytes,
                max_workers=max_workers,
                phases=phases,
            )
    except OSError as exc:
        raise os_error(exc, f"restoring into {volume.root_dir}") from None
    return result([fp.family for fp in plan.hits], files, nbytes, noop=False)


def _restore_locked(
    plan: RestorePlan,
    store: RestoreSource,
    volume: CacheVolume,
    *,
    on_event: EventSink,
    max_bytes: int | None,
    max_workers: int,
    phases: dict[str, float],
) -> tuple[int, int]:
    t0 = time.monotonic()
    hits = plan.hits
    bounds: dict[str, int] = {}
    for fp in hits:
        assert fp.layer is not None  # noqa: S101 - a hit always carries its layer record
        known = frozenset(c.name for c in get_family(fp.family).components)
        bounds[fp.family] = check_layer(fp.layer, known, prefix=fp.member_prefix)
    volume.check_writable()
    volume.check_space({fp.family: (fp.unpacked, fp.files) for fp in hits}, max_bytes=max_bytes)
    staging = volume.new_staging()
    t1 = time.monotonic()
    phases["verify"] = round(t1 - t0, 4)
    try:
        totals = _stage_all(hits, store, staging, bounds, on_event=on_event, workers=max_workers)
    except BaseException:
        remove_tree(staging)
        raise
    t2 = time.monotonic()
    phases["fetch"] = round(t2 - t1, 4)
    swaps = [
        Swap(fp.family, os.path.join(staging, fp.family, comp), fp.dirs[comp])
        for fp in hits
        for comp in (fp.layer.components if fp.layer else [])
    ]
    marker = _marker(plan)
    marker["restore_seconds"] = round(time.monotonic() - t0, 3)
    volume.write_canaries(_canary_doc(plan))
    installed.write(volume.state_dir, installed.record(hits))
    volume.install(staging, swaps, marker)
    phases["install"] = round(time.monotonic() - t2, 4)
    for fp in hits:
        on_event({"stage": "install", "event": "done", "family": fp.family})
    return sum(t[0] for t in totals), sum(t[1] for t in totals)


def _canary_doc(plan: RestorePlan) -> bytes | None:
    """Return the canary document of a whole artifact's restore, or None (nothing to replay)."""
    if not plan.canaries or plan.canary_artifact is None:
        return None

    # lazy: only an artifact whose build recorded canaries carries them (read by pydantic)
    from artifactd.format.canary import RestoredCanaries  # noqa: PLC0415

    doc = RestoredCanaries(artifact=plan.canary_artifact, canaries=list(plan.canaries))
    return doc.model_dump_json().encode()


def _family_marker(fp: FamilyPlan) -> FamilyMarker:
    assert fp.layer is not None  # noqa: S101 - the caller passes hits with a layer
    return {
        "artifact": fp.artifact or "",
        "tag": fp.tag or "",
        "source": fp.source or "full",
        "layer": fp.layer.digest,
        "scope_key": fp.layer.scope_key,
        "dirs": {c: fp.dirs[c] for c in fp.layer.components},
        "files": fp.files,
        "bytes": fp.unpacked,
    }


def _marker(plan: RestorePlan) -> RestoreMarker:
    marker: RestoreMarker = {
        "schema_version": 1,
        "fingerprint_hash": plan.fingerprint_hash,
        "store": plan.store,
        "match": "full" if plan.match == "full" else "partial",
        "selected": [f.family for f in plan.families],
        "missed": [f.family for f in plan.families if f.verdict == "miss"],
        "families": {fp.family: _family_marker(fp) for fp in plan.hits if fp.layer is not None},
        "restored_at": round(time.time(), 3),
        "env": dict(plan.env),
    }
    for fp in plan.hits:
        if fp.signed_by and fp.family in marker["families"]:
            marker["families"][fp.family]["signed_by"] = fp.signed_by
    return marker


def _stage_all(
    hits: list[FamilyPlan],
    source: RestoreSource,
    staging: str,
    bounds: dict[str, int],
    *,
    on_event: EventSink,
    workers: int,
) -> list[tuple[int, int]]:
    def stage(fp: FamilyPlan) -> tuple[int, int]:
        if fp.layer is None:  # pragma: no cover - hits always carry a layer
            return 0, 0
        fam = get_family(fp.family)
        t0 = time.monotonic()

        def relocate(member: str, data: bytes) -> bytes:
            comp = member.split("/", 1)[0]
            return fam.relocate(data, fp.dirs[comp])

        res = source.stage_layer(
            fp,
            os.path.join(staging, fp.family),
            relocate=relocate,
            keep_mtimes=fam.keep_mtimes,
            max_tar_bytes=bounds[fp.family],
            on_event=on_event,
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

    with _Flusher(staging):
        if len(hits) == 1 or workers <= 1:
            return [stage(fp) for fp in hits]

        with Pool(min(workers, len(hits)), "fetch") as pool:
            return pool.map(stage, hits)


#: How often staging is synced in the background while layers stream in.
FLUSH_EVERY_S = 0.25


class _Flusher:
    """Write staged bytes back to disk while the layers still stream in.

    The install syncs the filesystem before its commit (a marker must never
    describe files the page cache has not written); syncing every
    :data:`FLUSH_EVERY_S` while staging overlaps most of that writeback with
    the download, so the final sync has only the last moments' bytes left.
    Not on a disk another writer keeps busy (more than
    :data:`~artifactd.fsutil.FOREIGN_DIRTY_MAX` dirty when staging starts):
    ``syncfs`` would wait on that writer's pages, and the install then syncs
    its own files one by one (:func:`~artifactd.fsutil.make_durable`).
    """

    def __init__(self, staging: StrPath) -> None:
        self._staging = staging
        self._stop = Flag()
        self._thread = Thread(self._run, "flush")

    def _run(self) -> None:
        dirty = dirty_bytes()
        if dirty is not None and dirty > FOREIGN_DIRTY_MAX:
            return
        while not self._stop.wait(FLUSH_EVERY_S):
            try:
                sync_filesystem(self._staging)
            except OSError:
                return  # the install's own sync reports what matters

    def __enter__(self) -> _Flusher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
