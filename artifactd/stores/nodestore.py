"""The node-local tier: an OCI layout on the node's disk, between its pods and the registry.

A node's pods share it (``restore --node-store oci:PATH``, a hostPath on the
node's NVMe). This module is the tier itself: where it lives
(:func:`node_root`), its lock (:func:`node_lock`), what fills killed mid-write
left (:func:`clear_leftovers`), copies set aside (:func:`set_aside`), when each
artifact was last used and the collector (:func:`gc`). Filling it with what a
restore would pick is the restore stage's (:mod:`artifactd.restore.nodefill`):
a store knows nothing of restores. Filling happens under the node store's
exclusive lock; the restore that follows holds it shared, so :func:`gc` (which
takes it exclusive) never removes what a restore in progress reads.

Each fill records, per manifest it resolved to, when it was last used
(``.artifactd-last-used.json`` in the layout). :func:`gc` evicts the least
recently used artifacts (a tag, then every blob no remaining tag references)
until the store is under ``max_bytes`` and its filesystem has ``min_free``
percent free; ``artifactd prefetch`` fills a node ahead of a release.

The node store heals. A copy that fails verification when a restore reads it
(a flipped byte, a truncated or deleted blob: the restore's digests catch it)
is set aside (:func:`set_aside`: its damaged blobs and its tags removed) and
fetched again by the fill that follows, in the same restore. A fill killed
mid-write leaves temp files (``.tmp-*``) that the next fill removes, and a
full node disk is a :class:`~artifactd.errors.NoSpaceError`, never a crash.

Beside each layer's blob, the node store keeps the layer unpacked once
(``unpacked/<hex>/``, :mod:`artifactd.stores.nodetree`), from which restores
take their files by reflink, hard link or copy; a tree goes when gc removes
its blob, and a tree a restore was making when it was killed goes with the
other leftovers.

A node quarantines what failed its canary (:func:`quarantine`: ``status
--canary --node-store``): the artifact's manifest digest and its layer digests
are recorded in ``.artifactd-quarantine.json``, and from then on a restore from
this node store passes over every manifest that is one of them or holds one of
those layers (a family tag of the same build included), ``node-features`` stops
advertising them, and ``artifactd quarantine ls|rm`` lists and releases them.

A restore from a warm node store is a pod start (:mod:`artifactd.cli.fast`):
this module loads no more than reading the node store needs. What only a
repair or a gc does is imported in the function that does it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time

from artifactd.errors import (
    ArtifactdError,
    NoSpaceError,
    NotFoundError,
    StoreError,
    TargetError,
    UsageError,
)
from artifactd.events import discard
from artifactd.fsutil import atomic_write, read_regular
from artifactd.hashing import copy_hashed
from artifactd.jsontext import dumps, loads
from artifactd.records import Record
from artifactd.stores.layout import MAX_INDEX_BYTES

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from types import TracebackType

    from artifactd.events import EventSink
    from artifactd.fsutil import StrPath
    from artifactd.stores.layout import LayoutStore

#: The node store's lock: exclusive to fill or collect, shared while a restore reads.
LOCK_NAME = ".artifactd-node.lock"
#: When each manifest was last resolved to by a restore or prefetch on this node.
USAGE_NAME = ".artifactd-last-used.json"
#: How fine the last-use record is, in seconds: a use this soon after the
#: recorded one is not written again (:func:`record_use`).
USE_RESOLUTION_S = 60.0
#: How many artifacts gc has evicted from this node store in all (a counter for the metrics).
GC_STATS_NAME = ".artifactd-gc-stats.json"
#: How long a restore waits for another pod's fill, at most (seconds).
LOCK_TIMEOUT = 600.0
#: What the layout's writers name a file before renaming it into place (and a fill its scratch).
TMP_PREFIX = ".tmp-"
#: Where the node store keeps each layer unpacked (:mod:`artifactd.stores.nodetree`).
TREES_DIR = "unpacked"
#: How a restore may take files from them (``--node-link``): ``auto`` (reflink, else a hard
#: link where the family allows, else a copy) or ``copy`` (reflink, else a copy).
LINKINGS = ("auto", "copy")
#: The artifacts this node refuses to serve (a failed canary), with their layers and why.
QUARANTINE_NAME = ".artifactd-quarantine.json"
#: Most artifacts a node keeps quarantined (the oldest are released past it).
MAX_QUARANTINED = 1024
#: Largest quarantine record read, in bytes.
MAX_QUARANTINE_BYTES = 4 << 20


class Quarantined(Record):
    """One quarantined artifact: its manifest digest, its layers, since when and why."""

    digest: str
    layers: list[str]
    since: float
    why: str


def read_quarantine(root: StrPath) -> dict[str, Quarantined]:
    """Return the node's quarantine by manifest digest; empty when missing or unreadable.

    Read as a regular file of at most :data:`MAX_QUARANTINE_BYTES`, never waited on.
    """
    try:
        doc = loads(read_regular(os.path.join(root, QUARANTINE_NAME), MAX_QUARANTINE_BYTES))
    except (OSError, ValueError):
        return {}
    out: dict[str, Quarantined] = {}
    for digest, entry in doc.items() if isinstance(doc, dict) else []:
        if not isinstance(entry, dict) or not isinstance(digest, str):
            continue
        layers = entry.get("layers")
        since, why = entry.get("since"), entry.get("why")
        out[digest] = Quarantined(
            digest,
            [x for x in layers if isinstance(x, str)] if isinstance(layers, list) else [],
            float(since) if isinstance(since, (int, float)) else 0.0,
            why[:1000] if isinstance(why, str) else "",
        )
    return out


def refused_digests(root: StrPath) -> frozenset[str]:
    """Every manifest and layer digest the node's quarantine names."""
    return frozenset(d for q in read_quarantine(root).values() for d in (q.digest, *q.layers))


def _write_quarantine(root: StrPath, entries: dict[str, Quarantined]) -> None:
    kept = sorted(entries.values(), key=lambda q: q.since)[-MAX_QUARANTINED:]
    doc = {q.digest: {"layers": q.layers, "since": q.since, "why": q.why} for q in kept}
    data = dumps(doc, sort_keys=True).encode()
    atomic_write(os.path.join(root, QUARANTINE_NAME), data, durable=True)


def quarantine(root: StrPath, digest: str, layers: Sequence[str], why: str) -> Quarantined:
    """Quarantine the artifact ``digest`` (and its ``layers``) on this node; return the record.

    Under the node store's exclusive lock; a node store that cannot be made or
    written is a :class:`TargetError`.
    """
    entry = Quarantined(digest, sorted(set(layers)), round(time.time(), 3), why[:1000])
    try:
        os.makedirs(root, exist_ok=True)
        with node_lock(root):
            entries = read_quarantine(root)
            entries[digest] = entry
            _write_quarantine(root, entries)
    except OSError as exc:
        raise TargetError(
            f"cannot quarantine {digest} in the node store {root}: {exc.strerror or exc}",
            hint="the node store must be writable by the pod (a hostPath)",
        ) from None
    return entry


def release(root: StrPath, digest: str) -> bool:
    """Take ``digest`` out of the node's quarantine; return whether it was there."""
    try:
        with node_lock(root):
            entries = read_quarantine(root)
            found = entries.pop(digest, None) is not None
            if found:
                _write_quarantine(root, entries)
    except OSError as exc:
        raise TargetError(
            f"cannot change the quarantine of the node store {root}: {exc.strerror or exc}",
            hint="the node store must be writable",
        ) from None
    return found


def node_root(ref: str) -> str:
    """Return the directory of a node store reference: only a local OCI layout, ``oci:PATH``."""
    if not ref.startswith("oci:") or not ref[4:]:
        raise UsageError(
            f"node store {ref!r} must be a local OCI layout, oci:PATH",
            hint="a hostPath on the node's disk, e.g. --node-store oci:/var/lib/artifactd/store",
        )
    return ref[4:]


def node_lock(root: StrPath, *, shared: bool = False, timeout: float = LOCK_TIMEOUT) -> NodeLock:
    """Hold the node store's lock (exclusive, or ``shared``) for a ``with`` block; wait ``timeout``.

    A node store that cannot be made or locked (a file where its directory
    belongs, no permission, a full disk) is a :class:`TargetError` (a full
    disk: :class:`NoSpaceError`), as one that stays locked is.
    """
    return NodeLock(root, shared=shared, timeout=timeout)


class NodeLock:
    """The node store's lock for a ``with`` block (see :func:`node_lock`).

    A class, not a generator under ``contextlib``: a no-op restore from the node
    store takes it, and ``contextlib`` is off a pod start's first modules.
    """

    def __init__(self, root: StrPath, *, shared: bool, timeout: float) -> None:
        self._root = root
        self._shared = shared
        self._timeout = timeout
        self._fd: int | None = None

    def __enter__(self) -> None:
        root = self._root
        try:
            os.makedirs(root, exist_ok=True)
            fd = os.open(os.path.join(root, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            detail = f"the node store {os.fspath(root)} cannot be used ({exc.strerror or exc})"
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise NoSpaceError(
                    f"{detail}: out of space",
                    hint="collect it (artifactd gc) or give its disk more room",
                ) from None
            raise TargetError(
                detail,
                hint="point --node-store at a directory (made if missing) this user can write",
            ) from None
        mode = fcntl.LOCK_SH if self._shared else fcntl.LOCK_EX
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    raise TargetError(
                        f"the node store {os.fspath(root)} stayed locked for {self._timeout:.0f} s",
                        hint="another pod is filling it, or a gc is running; retry",
                    ) from None
                time.sleep(0.05)
            except BaseException:
                os.close(fd)
                raise
        self._fd = fd

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing releases the lock
            self._fd = None


def clear_leftovers(node: LayoutStore) -> list[str]:
    """Remove the temp files and scratch directories that fills killed mid-write left.

    Only under the exclusive lock, where no other fill or restore is writing:
    every ``.tmp-*`` in the layout's root, its blob directory and its unpacked
    layers (a tree a restore was making, or one it set aside) is then a dead
    writer's. Returns the names removed.
    """
    removed: list[str] = []
    root = node.root_dir
    for directory in (root, os.path.join(root, "blobs", "sha256"), os.path.join(root, TREES_DIR)):
        try:
            entries = list(os.scandir(directory))
        except FileNotFoundError:
            continue
        for entry in entries:
            if not entry.name.startswith(TMP_PREFIX):
                continue
            if entry.is_dir(follow_symlinks=False):
                # lazy: fast path: LATER in artifactd/cli/fast.py, never loaded by a no-op restore
                import shutil  # noqa: PLC0415

                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                try:  # noqa: SIM105 - contextlib is off a pod start's first modules
                    os.unlink(entry.path)
                except FileNotFoundError:
                    pass
            removed.append(entry.name)
    return removed


def set_aside(node: LayoutStore, tags: Sequence[str]) -> list[str]:
    """Remove from the node store every copy of what ``tags`` name that fails verification.

    For a restore whose read of the node store failed (corrupt, missing,
    re-pointed): each tagged manifest, its config and its layers are hashed
    against their digests and sizes. A blob that does not match is deleted
    and every tag naming its manifest removed, so the next :func:`fill`
    fetches them again (a fill skips a tag the node already holds). Call it
    under the exclusive lock. Returns the tags removed.
    """
    # lazy: fast path: LATER in artifactd/cli/fast.py, never loaded by a no-op restore
    from artifactd.format.imagemanifest import ImageManifest  # noqa: PLC0415

    on_disk = node.blob_digests()
    damaged: set[str] = set()
    for tag in tags:
        digest = node.tag_digest(tag)
        if digest is None:
            continue
        try:
            ref = node.get_manifest(digest)
            if ref is None:
                raise NotFoundError(f"{node.ref} has no manifest {digest}")
            manifest = ImageManifest.from_bytes(ref.data, source=f"{node.ref}@{digest}")
        except ArtifactdError:
            node.remove_blob(digest)
            damaged.add(digest)
            continue
        for desc in [manifest.config, *manifest.layers]:
            if on_disk.get(desc.digest) is None or not _intact(node, desc.digest, desc.size):
                node.remove_blob(desc.digest)
                damaged.add(digest)
    every = node.tag_digests()
    return node.remove_tags([t for t, d in every.items() if d in damaged])


def _intact(node: LayoutStore, digest: str, size: int) -> bool:
    """Whether the node's blob ``digest`` holds exactly ``size`` bytes that hash to it."""
    try:
        with node.open_blob(digest, size) as blob:
            return copy_hashed(blob, limit=size).matches(digest, size)
    except ArtifactdError:
        return False


def record_use(node: LayoutStore, digests: Sequence[str], now: float | None = None) -> None:
    """Record that these manifests were just resolved to (for :func:`gc`'s LRU order).

    Kept to :data:`USE_RESOLUTION_S`: when every one of ``digests`` was
    recorded as used less than that long ago (and not in the future), the
    record is left as it is. A node whose pods restart in a loop then writes
    it once a minute, not at every start; gc's order is only coarser by that.
    """
    if not digests:
        return
    usage = read_usage(node.root_dir)
    clock = time.time() if now is None else now
    if all(0.0 <= clock - usage.get(d, float("-inf")) < USE_RESOLUTION_S for d in digests):
        return
    stamp = round(clock, 3)
    for digest in digests:
        usage[digest] = stamp
    atomic_write(os.path.join(node.root_dir, USAGE_NAME), dumps(usage, sort_keys=True).encode())


def read_usage(root: StrPath) -> dict[str, float]:
    """Return the last-use record (manifest digest -> time); empty when missing or unreadable."""
    try:
        # One entry a manifest: the index's own limit bounds it too.
        doc = loads(read_regular(os.path.join(root, USAGE_NAME), MAX_INDEX_BYTES))
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict):
        return {}
    return {k: float(v) for k, v in doc.items() if isinstance(v, (int, float))}


# --------------------------------------------------------------------------
# Garbage collection
# --------------------------------------------------------------------------


class Evicted(Record):
    """One tag gc removed, and when its manifest was last used."""

    tag: str
    digest: str
    last_used: float | None


class GcResult(Record):
    """What :func:`gc` removed (or, with ``dry_run``, would remove)."""

    store: str
    dry_run: bool
    bytes_before: int
    bytes_after: int
    freed: int
    evicted: list[Evicted]
    blobs_removed: int
    free_pct_after: float
    #: Why it stopped short of the targets, if it did.
    note: str | None = None
    #: Artifacts evicted from this store by every gc so far, this one included.
    evictions_total: int = 0


def gc(
    node: LayoutStore,
    *,
    max_bytes: int | None = None,
    min_free_pct: float | None = None,
    dry_run: bool = False,
    timeout: float = LOCK_TIMEOUT,
    on_event: EventSink = discard,
) -> GcResult:
    """Evict least recently used artifacts until the store fits ``max_bytes`` and ``min_free_pct``.

    Under the node store's exclusive lock (so no restore is reading it): tags
    are evicted oldest use first (an artifact never recorded counts as
    oldest, then by tag); after each, the blobs no remaining tag references
    are what it frees. Never removes a blob a remaining tag references.
    ``max_bytes`` 0 empties the store; a negative target or one outside
    0-100 percent is a :class:`UsageError` (it would evict everything).
    """
    if max_bytes is not None and max_bytes < 0:
        raise UsageError(f"gc --max-bytes must be 0 or more, not {max_bytes}")
    if min_free_pct is not None and not 0 <= min_free_pct <= 100:
        raise UsageError(f"gc --min-free must be a percentage (0-100), not {min_free_pct}")
    with node_lock(node.root_dir, timeout=timeout):
        return _collect(node, max_bytes, min_free_pct, dry_run, on_event)


def _collect(
    node: LayoutStore,
    max_bytes: int | None,
    min_free_pct: float | None,
    dry_run: bool,
    on_event: EventSink,
) -> GcResult:
    # lazy: fast path: LATER in artifactd/cli/fast.py, never loaded by a no-op restore
    from artifactd.trust.signatures import parse_attached_tag  # noqa: PLC0415

    blobs = node.blob_digests()
    before = sum(blobs.values())
    usage = read_usage(node.root_dir)
    every = node.tag_digests()
    # Signatures and attestations are not evicted on their own (they would go
    # first: nothing records their use); they live as long as their subject.
    attached = {t: s[0] for t in every if (s := parse_attached_tag(t)) is not None}
    tags = {t: d for t, d in every.items() if t not in attached}
    order = sorted(tags, key=lambda t: (usage.get(tags[t], 0.0), t))
    kept = dict(tags)
    evicted: list[Evicted] = []
    size = before
    stat = os.statvfs(node.root_dir)
    free = stat.f_bavail * stat.f_frsize
    total = stat.f_blocks * stat.f_frsize or 1

    def satisfied(size: int, free: int) -> bool:
        fits = max_bytes is None or size <= max_bytes
        roomy = min_free_pct is None or 100.0 * free / total >= min_free_pct
        return fits and roomy

    free_before = free
    for tag in order:
        if satisfied(size, free):
            break
        digest = kept.pop(tag)
        referenced = _referenced(node, _live(kept, attached, every))
        size = before - sum(n for d, n in blobs.items() if d not in referenced)
        free = free_before + (before - size)
        evicted.append(Evicted(tag, digest, usage.get(digest)))
    referenced = _referenced(node, _live(kept, attached, every))
    unreferenced = [d for d in blobs if d not in referenced]
    orphans = [t for t, subject in attached.items() if subject not in set(kept.values())]
    if not dry_run and (evicted or orphans):
        node.remove_tags([e.tag for e in evicted] + orphans)
        for digest in unreferenced:
            node.remove_blob(digest)
        _prune_trees(node.root_dir, [d for d in blobs if d in referenced])
        live = {d for d in tags.values() if d in set(kept.values())}
        usage = {d: t for d, t in usage.items() if d in live}
        atomic_write(os.path.join(node.root_dir, USAGE_NAME), dumps(usage, sort_keys=True).encode())
    evictions = read_evictions(node.root_dir) + (0 if dry_run else len(evicted))
    if not dry_run and evicted:
        # Kept across runs so that the exported counter only grows: Prometheus'
        # increase() then sees every eviction, not one gc's count.
        stats = dumps({"evictions": evictions}).encode()
        atomic_write(os.path.join(node.root_dir, GC_STATS_NAME), stats)
    note = (
        None if satisfied(size, free) else "every artifact was evicted and the targets still fail"
    )
    result = GcResult(
        store=node.ref,
        dry_run=dry_run,
        bytes_before=before,
        bytes_after=size,
        freed=before - size,
        evicted=evicted,
        blobs_removed=len(unreferenced) if evicted else 0,
        free_pct_after=round(100.0 * free / total, 2),
        note=note if evicted or not satisfied(size, free) else None,
        evictions_total=evictions,
    )
    on_event({"stage": "gc", "event": "done", "freed": result.freed, "evicted": len(evicted)})
    return result


def _prune_trees(root: StrPath, keep: Sequence[str]) -> list[str]:
    """Remove every unpacked layer whose blob is not in ``keep`` (digests): a tree goes with it.

    Under the exclusive lock (gc): no restore is reading a tree. Returns the names removed.
    """
    base = os.path.join(root, TREES_DIR)
    wanted = {d.partition(":")[2] for d in keep}
    try:
        names = os.listdir(base)
    except OSError:
        return []
    removed = [n for n in names if n not in wanted or n.startswith(TMP_PREFIX)]
    if removed:
        # lazy: fast path: LATER in artifactd/cli/fast.py, never loaded by a no-op restore
        import shutil  # noqa: PLC0415

        for name in removed:
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)
    return removed


def read_evictions(root: StrPath) -> int:
    """Return how many artifacts gc has evicted from the node store at ``root`` (0 unrecorded)."""
    try:
        doc = loads(read_regular(os.path.join(root, GC_STATS_NAME), 4096))
    except (OSError, ValueError):
        return 0
    count = doc.get("evictions") if isinstance(doc, dict) else None
    return count if isinstance(count, int) and count >= 0 else 0


def _live(kept: dict[str, str], attached: dict[str, str], every: dict[str, str]) -> set[str]:
    """Return the manifests still tagged: the kept ones, their signatures and attestations."""
    subjects = set(kept.values())
    return subjects | {every[t] for t, subject in attached.items() if subject in subjects}


def _referenced(node: LayoutStore, manifests: set[str]) -> set[str]:
    """Every blob the given manifests reference: themselves, their configs and layers."""
    # lazy: fast path: LATER in artifactd/cli/fast.py, never loaded by a no-op restore
    from artifactd.format.imagemanifest import ImageManifest  # noqa: PLC0415

    out: set[str] = set()
    for digest in manifests:
        ref = node.get_manifest(digest)
        if ref is None:
            continue
        out.add(digest)
        try:
            manifest = ImageManifest.from_bytes(ref.data, source=f"{node.ref}@{digest}")
        except ArtifactdError:
            continue  # not ours: keep what we can name, never guess
        out.add(manifest.config.digest)
        out.update(d.digest for d in manifest.layers)
    return out


def store_bytes(node: LayoutStore) -> int:
    """Return the bytes of every blob in the node store."""
    try:
        return sum(node.blob_digests().values())
    except OSError as exc:
        raise StoreError(f"cannot read {node.ref}: {exc}") from exc
