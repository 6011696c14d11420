"""Filling the node store with what a restore would pick, and ``artifactd prefetch``.

``restore --node-store oci:PATH`` first makes the node store
(:mod:`artifactd.stores.nodestore`) hold what resolving against the registry
would pick (:func:`fill`): every tag the selection rule may read (the artifact
tagged ``fp-<hash>`` and each family's scope tag,
:func:`artifactd.restore.resolve.wants`) that the registry has. The rule itself
is :mod:`artifactd.restore.resolve`'s: the node store is a store like any other
to it. Blobs are copied verified and only when missing, and a tag is written
only once its blobs are in place. Then the restore runs from the node store,
with no network. Filling happens under the node store's exclusive lock: when
several pods start at once, one fetches and the others wait, then find the tags
there and fetch nothing. With the registry down, a warm node store still
restores; with a cold one, the restore fails open as ever.

A restore then reads the node store through :class:`NodeSource`: each layer
is unpacked once into the node store (:mod:`artifactd.stores.nodetree`) and
served from there into the pod's staging by reflink, hard link or copy, as the
family allows; a tree that fails its check is made again from the verified
blob before it serves.

A restore from a warm node store is a pod start (:mod:`artifactd.cli.fast`):
this module loads no more than reading the node store needs. What only a
fetch does (``tempfile``, the registry, the signatures, the artifact copier)
is imported in the function that does it.
"""

from __future__ import annotations

import errno
import os
import time
from _collections_abc import Mapping  # collections.abc's own: importing it loads collections

from artifactd.errors import ArtifactdError, NoSpaceError, StoreError
from artifactd.events import discard
from artifactd.families import get_family
from artifactd.fingerprint.key import flatten, hashed_view, raw_hash
from artifactd.fsutil import as_path
from artifactd.records import Record
from artifactd.restore.resolve import picks, wants, whole_want
from artifactd.restore.source import StoreSource
from artifactd.stores import open_store
from artifactd.stores.layout import LayoutStore
from artifactd.stores.nodestore import (
    LOCK_TIMEOUT,
    TMP_PREFIX,
    TREES_DIR,
    clear_leftovers,
    node_lock,
    node_root,
    record_use,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence
    from typing import Any

    from artifactd.events import EventSink
    from artifactd.format.unpack import UnpackResult
    from artifactd.fsutil import StrPath
    from artifactd.restore.resolve import FamilyPlan
    from artifactd.stores import Store
    from artifactd.stores.layout import LayoutStore
    from artifactd.stores.mirrors import MirrorSettings


class Lookup(Record):
    """What a restore looks tags up by: the fingerprint's hash, its hashed fields, the families.

    The node store's fill and set-aside name the tags a restore may read from
    these three (:func:`artifactd.restore.resolve.wants`, ``picks``); made
    once per restore or prefetch by :meth:`of`.
    """

    fingerprint_hash: str
    #: The fingerprint's hashed fields, flattened to dotted paths.
    flat: Mapping[str, Any]
    #: The families selected; None for every family.
    families: Sequence[str] | None

    @classmethod
    def of(cls, raw_fingerprint: Mapping[str, Any], families: Sequence[str] | None) -> Lookup:
        """Return the lookup of a probe's plain fingerprint document for ``families``."""
        selected = list(families) if families else None
        return cls(raw_hash(raw_fingerprint), flatten(hashed_view(raw_fingerprint)), selected)


class FillResult:
    """What :func:`fill` found in the node store and what it fetched into it.

    A plain class, not a dataclass: the restore that reads a warm node store
    is a pod start, and ``dataclasses`` (with ``inspect``) costs it milliseconds.
    """

    __slots__ = (
        "bytes_fetched",
        "cleared",
        "error",
        "fetched",
        "node",
        "outcome",
        "seconds",
        "set_aside",
        "tags",
    )

    def __init__(self, node: str, outcome: str) -> None:
        self.node = node
        #: "node": everything wanted was there; "fetched": some came from the registry;
        #: "miss": neither has it; "offline": the registry could not be reached.
        self.outcome = outcome
        self.tags: list[str] = []
        self.fetched: list[str] = []
        self.bytes_fetched = 0
        self.seconds = 0.0
        self.error: str | None = None
        #: Tags whose copy failed verification and were fetched again (:func:`set_aside`).
        self.set_aside: list[str] = []
        #: Temp files and scratch a fill killed mid-write left, removed (:func:`clear_leftovers`).
        self.cleared: list[str] = []

    def _asdict(self) -> dict[str, Any]:
        """Every field by name, in declaration order (as a named tuple's, for ``--json``)."""
        return {name: getattr(self, name) for name in self.__slots__}

    def __repr__(self) -> str:
        return f"FillResult({', '.join(f'{k}={v!r}' for k, v in self._asdict().items())})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FillResult) and self._asdict() == other._asdict()

    __hash__ = None  # type: ignore[assignment]  # mutable: unhashable, as a dataclass is


def fill(
    node: LayoutStore,
    remote: Store | None,
    lookup: Lookup,
    *,
    on_event: EventSink = discard,
    signatures: bool = False,
    refresh: bool = False,
) -> FillResult:
    """Make ``node`` hold what resolving ``lookup`` against ``remote`` would pick.

    With ``refresh`` (after :func:`set_aside`), the remote is asked even when
    the node holds a tag a restore would read: what the node lacks is fetched.

    With ``signatures`` (a restore that verifies), an artifact the node holds
    without its ``.sig`` counts as missing: its signatures are fetched (a node
    store filled before the publisher signed heals at the next restore).
    Call it under :func:`node_lock` (exclusive): it first removes what a
    fill killed mid-write left (:func:`clear_leftovers`). Never raises for the remote:
    an unreachable or failing registry leaves the node store as it was and is
    reported in the result (``offline``), so a warm node store still serves.
    A full node disk raises :class:`NoSpaceError`.
    """
    start = time.monotonic()
    result = FillResult(node=node.ref, outcome="node")
    result.cleared = clear_leftovers(node)
    wanted = _wanted(node, lookup)
    present = [t for t in wanted if node.tag_digest(t) is not None]
    missing = [t for t in wanted if t not in present]
    if signatures:
        missing += [t for t in present if not _signed(node, t)]
    result.tags = present
    # Without the whole artifact the node resolves by family tags, which the
    # registry may have moved on from (a whole artifact published since, a
    # family re-published): a few tag lookups tell, so the node's pick is the
    # registry's. With it, the node already holds the rule's first choice.
    by_families = wanted != [whole_want(lookup.fingerprint_hash).tag]
    if remote is not None and (missing or not present or refresh or by_families):
        try:
            _fetch(node, remote, lookup, result=result, signatures=signatures)
        except NoSpaceError:
            raise  # the node's own disk, not the registry: the caller decides
        except ArtifactdError as exc:
            result.outcome, result.error = "offline", exc.message
            on_event({"stage": "node-store", "event": "offline", "error": exc.message})
        result.tags = [t for t in _wanted(node, lookup) if node.tag_digest(t)]
    if not result.tags:
        result.outcome = "offline" if result.error else "miss"
    elif result.fetched:
        result.outcome = "fetched"
    # What the node picked before a fetch is in use too: gc must not evict,
    # as never used, a family tag this fill just refreshed.
    used = dict.fromkeys([*result.tags, *present])
    record_use(node, [d for t in used if (d := node.tag_digest(t))])
    result.seconds = round(time.monotonic() - start, 3)
    on_event(
        {
            "stage": "node-store",
            "event": result.outcome,
            "tags": len(result.tags),
            "bytes": result.bytes_fetched,
        }
    )
    return result


def restore_tags(lookup: Lookup) -> list[str]:
    """Every tag a restore of ``lookup`` may read: the whole artifact's, the families'."""
    return [w.tag for w in wants(lookup.fingerprint_hash, lookup.flat, lookup.families)]


class VerifiedPins(Mapping[str, str]):
    """The digests the node store last verified for a restore's tags, and their signatures'.

    What a fill wrote was checked on the way in; these pin the tags for a
    registry that cannot answer (:class:`~artifactd.stores.pull.Puller`), so a
    damaged copy is fetched again, by digest, from a mirror while the
    registry is down. Read on first use (a no-op restore reads none), or
    when :meth:`snapshot` says (before a damaged copy is set aside); a tag
    found re-pointed (``unbound``) is not pinned. A signature's or
    attestation's tag (``sha256-<hex>.sig``) of a pinned digest is looked up
    in the node store when asked.
    """

    def __init__(self, node: LayoutStore, lookup: Lookup, *, unbound: Sequence[str] = ()) -> None:
        self._node = node
        self._lookup = lookup
        self._unbound = tuple(unbound)
        self._read: dict[str, str] | None = None

    @property
    def _tags(self) -> dict[str, str]:
        return self.snapshot()

    def snapshot(self) -> dict[str, str]:
        """Read the node store's tags now (once); later reads return the same."""
        if self._read is None:
            self._read = {}
            for tag in restore_tags(self._lookup):
                digest = self._node.tag_digest(tag)
                if digest is not None and tag not in self._unbound:
                    self._read[tag] = digest
        return self._read

    def __getitem__(self, tag: str) -> str:
        if tag in self._tags:
            return self._tags[tag]
        # lazy: asked only while the registry is down; a no-op restore never loads signatures
        from artifactd.trust.signatures import parse_attached_tag  # noqa: PLC0415

        subject = parse_attached_tag(tag)
        if subject is not None and subject[0] in self._tags.values():
            found = self._node.tag_digest(tag)
            if found is not None:
                return found
        raise KeyError(tag)

    def __iter__(self) -> Iterator[str]:
        return iter(self._tags)

    def __len__(self) -> int:
        return len(self._tags)


def _wanted(node: LayoutStore, lookup: Lookup) -> list[str]:
    """Return the tags a restore from the node reads (:func:`artifactd.restore.resolve.picks`)."""
    return [
        w.tag
        for w in picks(StoreSource(node), lookup.fingerprint_hash, lookup.flat, lookup.families)
    ]


def _signed(node: LayoutStore, tag: str) -> bool:
    """Whether the manifest ``tag`` names has a ``.sig`` in the node store."""
    # lazy: fast path: LATER in artifactd/cli/fast.py, never loaded by a no-op restore
    from artifactd.trust.signatures import attached_tag  # noqa: PLC0415

    digest = node.tag_digest(tag)
    return digest is not None and node.tag_digest(attached_tag(digest, "sig")) is not None


def _fetch(
    node: LayoutStore,
    remote: Store,
    lookup: Lookup,
    *,
    result: FillResult,
    signatures: bool = False,
) -> None:
    """Copy from ``remote`` what the node lacks of every tag a restore may read.

    The whole artifact's tag and each selected family's scope tag, as far as
    the registry has them: resolving from the node (:mod:`artifactd.restore.resolve`)
    then picks what resolving against the registry would, whole artifact or
    families, and names a tag there that is bound to something else.
    """
    wanted = wants(lookup.fingerprint_hash, lookup.flat, lookup.families)
    remote_digests = {w.tag: remote.tag_digest(w.tag) for w in wanted}
    tags = [t for t, d in remote_digests.items() if d is not None]
    same = [t for t in tags if node.tag_digest(t) == remote_digests[t]]
    tags = [t for t in tags if t not in same]
    unsigned = [t for t in same if signatures and not _signed(node, t)]
    if tags or unsigned:
        # lazy: fast path: LATER in artifactd/cli/fast.py, never loaded by a no-op restore
        import tempfile  # noqa: PLC0415

        from artifactd.stores.artifacts import copy_artifacts  # noqa: PLC0415
        from artifactd.trust.policy import UNSAFE_NO_VERIFICATION  # noqa: PLC0415
        from artifactd.trust.signatures import copy_attached  # noqa: PLC0415

        fetched: list[str] = []
        try:
            # The scratch is on the node's disk: a kill leaves it to the next fill to remove.
            with tempfile.TemporaryDirectory(prefix=TMP_PREFIX, dir=node.root_dir) as tmp:
                if tags:  # (an empty list would mean "every artifact")
                    # Unverified here, with its signatures: every pod's restore reads
                    # the node store under its own policy, as it would the registry.
                    copied = copy_artifacts(
                        remote, node, tags, as_path(tmp), trust=UNSAFE_NO_VERIFICATION
                    )
                    fetched += copied.tags + copied.attached
                    result.bytes_fetched = copied.bytes_uploaded
                for tag in unsigned:
                    digest = node.tag_digest(tag)
                    if digest is not None:
                        fetched += copy_attached(remote, node, digest, as_path(tmp))
        except (OSError, NoSpaceError) as exc:
            if isinstance(exc, NoSpaceError) or exc.errno in (errno.ENOSPC, errno.EDQUOT):
                why = exc.message if isinstance(exc, NoSpaceError) else exc.strerror
                raise NoSpaceError(
                    f"the node store {node.root_dir} is out of space ({why})",
                    hint="collect it (artifactd gc --store oci:PATH --max-bytes SIZE) "
                    "or give its disk more room",
                ) from None
            raise
        result.fetched = fetched


def prefetch(
    remote_ref: str,
    node_ref: str,
    raw_fingerprint: Mapping[str, Any],
    *,
    families: Sequence[str] | None = None,
    insecure: bool = False,
    timeout: float = LOCK_TIMEOUT,
    on_event: EventSink = discard,
    mirrors: MirrorSettings | None = None,
) -> FillResult:
    """Fill the node store for a fingerprint ahead of the pods (a new release's DaemonSet).

    The same fill a restore makes, without installing anything, that also
    fetches the signatures of what the node holds unsigned (the pods may
    verify; the few KiB are off their critical path). Unlike a restore's, an
    unreachable registry is an error here: a prefetch that fetched nothing
    must not look like success.
    """
    root = node_root(node_ref)
    lookup = Lookup.of(raw_fingerprint, families)
    with node_lock(root, timeout=timeout):
        node = LayoutStore(root, create=True)
        with open_store(remote_ref, insecure=insecure, mirrors=mirrors) as remote:
            result = fill(node, remote, lookup, on_event=on_event, signatures=True)
    if result.outcome == "offline":
        raise StoreError(f"prefetch from {remote_ref} failed: {result.error}")
    return result


class NodeSource(StoreSource):
    """The node store as a restore reads it: each layer from its unpacked tree.

    A layer's tree (:mod:`artifactd.stores.nodetree`) is made from the blob
    the first time a pod restores it (unpacked by the format's extractor,
    every file verified), and from then on served by reflink, hard link
    (``linking`` ``"auto"``, for the files the
    family allows: :meth:`~artifactd.families.base.Family.shares_inode`) or
    copy. A tree that is not what it was made (its blob replaced, a file
    written, truncated, chmodded or gone) is set aside and made again from the
    blob, whose digest the extractor checks (a damaged blob then fails the
    restore as before, and the node store heals it). When no tree can be
    written (a read-only or full node disk), the blob is unpacked into
    staging as from any store.
    """

    def __init__(
        self, node: LayoutStore, *, refused: frozenset[str] = frozenset(), linking: str = "auto"
    ) -> None:
        super().__init__(node, refused=refused)
        self.node = node
        self.linking = linking

    def stage_layer(
        self,
        plan: FamilyPlan,
        staging: StrPath,
        *,
        relocate: Callable[[str, bytes], bytes],
        keep_mtimes: bool,
        max_tar_bytes: int,
        on_event: EventSink,
    ) -> UnpackResult:
        """Serve the planned layer from its tree into ``staging`` (made or re-made first)."""
        layer = plan.layer
        if layer is None:  # pragma: no cover - hits always carry a layer
            return super().stage_layer(
                plan,
                staging,
                relocate=relocate,
                keep_mtimes=keep_mtimes,
                max_tar_bytes=max_tar_bytes,
                on_event=on_event,
            )
        # lazy: fast path: LATER in artifactd/cli/fast.py, never loaded by a no-op restore
        from artifactd.stores.nodetree import (  # noqa: PLC0415
            OtherRecord,
            Stale,
            blob_file,
            blob_identity,
            read_stamp,
            retire,
            serve,
            tree_path,
        )

        shares = get_family(plan.family).shares_inode
        tree = tree_path(self.node.root_dir, layer.digest)
        blob = blob_file(self.node.root_dir, layer.digest)
        for attempt in (1, 2):
            try:
                stamp = read_stamp(tree, layer)
                if stamp.blob != blob_identity(blob):
                    raise Stale("its blob is not the one it was made from")
                served = serve(
                    tree,
                    stamp,
                    layer,
                    staging,
                    shares=shares,
                    relocate=relocate,
                    keep_mtimes=keep_mtimes,
                    linking=self.linking,
                )
            except (Stale, FileNotFoundError) as exc:
                _clear(staging)
                if isinstance(exc, OtherRecord):
                    # The tree serves its own record's pods; this record goes to the
                    # extractor below, which holds it to the layer's own tree document.
                    on_event(
                        {
                            "stage": "node-store",
                            "event": "tree_kept",
                            "family": plan.family,
                            "why": str(exc)[:200],
                        }
                    )
                    break
                if attempt == 1 and os.path.exists(tree):
                    on_event(
                        {
                            "stage": "node-store",
                            "event": "tree_stale",
                            "family": plan.family,
                            "why": str(exc)[:200],
                        }
                    )
                    retire(tree)
                if attempt == 2 or not self._make(plan, keep_mtimes, max_tar_bytes, on_event):
                    break
                continue
            on_event(
                {
                    "stage": "node-store",
                    "event": "served",
                    "family": plan.family,
                    "reflinked": served.reflinked,
                    "linked": served.linked,
                    "copied": served.copied,
                }
            )
            # lazy: fast path: LATER in artifactd/cli/fast.py, never loaded by a no-op restore
            from artifactd.format.unpack import UnpackResult  # noqa: PLC0415

            return UnpackResult(files=served.files, bytes=served.bytes)
        return super().stage_layer(
            plan,
            staging,
            relocate=relocate,
            keep_mtimes=keep_mtimes,
            max_tar_bytes=max_tar_bytes,
            on_event=on_event,
        )

    def _make(
        self, plan: FamilyPlan, keep_mtimes: bool, max_tar_bytes: int, on_event: EventSink
    ) -> bool:
        """Unpack the planned layer's blob into its tree; False when the node store cannot hold it.

        The blob is verified as it is unpacked: a damaged one raises (the
        caller's restore fails on it, and the node store heals it as ever).
        """
        # lazy: fast path: LATER in artifactd/cli/fast.py, never loaded by a no-op restore
        from artifactd.stores.nodetree import (  # noqa: PLC0415
            blob_file,
            blob_identity,
            put_in_place,
            seal,
            tree_path,
        )

        layer = plan.layer
        assert layer is not None  # noqa: S101 - stage_layer checked
        root = self.node.root_dir
        made = os.path.join(root, TREES_DIR, f"{TMP_PREFIX}{os.urandom(6).hex()}")
        try:
            identity = blob_identity(blob_file(root, layer.digest))
            os.makedirs(os.path.dirname(made), exist_ok=True)
            super().stage_layer(
                plan,
                made,
                relocate=_as_stored,
                keep_mtimes=keep_mtimes,
                max_tar_bytes=max_tar_bytes,
                on_event=on_event,
            )
            seal(made, layer, identity, keep_mtimes=keep_mtimes)
            put_in_place(made, tree_path(root, layer.digest))
        except OSError as exc:
            _clear(made)
            on_event(
                {
                    "stage": "node-store",
                    "event": "tree_unwritable",
                    "family": plan.family,
                    "error": (exc.strerror or str(exc))[:200],
                }
            )
            return False
        except BaseException:
            _clear(made)
            raise
        return True


def _as_stored(member: str, data: bytes) -> bytes:
    """Return ``data`` as it is: a tree keeps path-bearing files as stored (rewritten per pod)."""
    del member
    return data


def _clear(path: StrPath) -> None:
    """Remove what a serve or a make left at ``path`` (read-only files and all)."""
    # lazy: only a failed serve or make removes anything
    from artifactd.restore.destination import remove_tree  # noqa: PLC0415

    remove_tree(path)
