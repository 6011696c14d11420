"""Registry retention: which artifacts a store keeps, deleting the rest, and what it holds.

:func:`plan` reads every tag and the manifest it names (never a config or a
layer) and decides, per manifest, keep or delete with a reason:

* a manifest a ``--keep-tag`` pattern names, or that a *promoted* tag names
  (any tag outside artifactd's scheme: ``fp-<hash>``, ``<family>-<scope key>``,
  ``run-<id>-cell-<n>``, ``sha256-<hex>.sig|.att``, ``delta-*``,
  ``candidate-*``), is kept, and so are the single-family manifests that
  carry one of a promoted whole artifact's layers;
* the ``keep_last`` newest artifacts of each group are kept: one group per
  family for single-family artifacts, one for whole (``fp-``) artifacts; fan-out
  cells count by run (``run-<id>-cell-*``), and a run is kept or deleted whole,
  since a merge needs every cell. With a trust policy (``--verify-key``), the artifacts it
  verifies rank ahead of the others, so what no key vouched for never pushes
  out what one did;
* an artifact younger than ``grace_s`` is kept, whatever else holds: a push
  that is under way during the prune (its age comes from its own manifest);
* with ``older_than_days``, an artifact younger than that is kept;
* *submissions*, a delta (``kind: delta``) and a candidate that no tag but
  its ``candidate-*`` names (absorbed, not promoted), are never ranked and
  never promote or hold anything: each is kept within the grace and while
  younger than ``older_than_days`` (default :data:`DEFAULT_SUBMISSION_DAYS`),
  and deleted after, or when its age is unknown;
* a *superseded* manifest, one that only ``superseded-<time>-<hex>`` tags name
  (a registry store tags a manifest so before re-pointing a tag away from it:
  the distribution API lists tags, never untagged manifests), is deleted once
  the grace since that time is over (and, with ``older_than_days``, that many
  days), never ranked;
* a signature or attestation goes with its artifact, never alone;
* anything that is not an artifactd artifact is kept.

Age is the ``org.opencontainers.image.created`` annotation that publish stamps
on each manifest (:func:`~artifactd.stores.artifacts.creation_time`), never
the registry's modification time, which the distribution API does not
expose. A time more than :data:`MAX_CLOCK_SKEW_S` in the future is no age at
all (anyone who may push can stamp 2999): like an artifact without one
(published before artifactd stamped one), it ranks after every known age and
is kept, except with ``older_than_days=0`` and ``grace_s=0`` together, which
say that every artifact is old enough.

:func:`apply` deletes through the store: ``DELETE /v2/<repo>/manifests/<digest>``
on a registry (its blobs are then the registry's own garbage collection's:
:data:`REGISTRY_GC`, which the plan spells out), index entries and then
unreferenced blobs in a local layout. :func:`usage` (``artifactd du``) counts
bytes per family and per fingerprint, and those only superseded manifests hold.
"""

from __future__ import annotations

import calendar
import fnmatch
import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from artifactd.errors import IntegrityError, TrustError, UsageError
from artifactd.events import EventSink, discard
from artifactd.format.imagemanifest import ImageManifest
from artifactd.format.oci import (
    ANN_CREATED,
    ANN_FAMILY,
    ANN_FINGERPRINT,
    ANN_KIND,
    ANN_SCOPE_KEY,
    CANDIDATE_TAG_PREFIX,
    DELTA_TAG_PREFIX,
    DOCKER_LIST_MEDIA_TYPE,
    INDEX_MEDIA_TYPE,
    SUPERSEDED_TIME_FORMAT,
    family_tag,
    full_tag,
    parse_superseded_tag,
)
from artifactd.stores.base import Store
from artifactd.stores.layout import LayoutStore

if TYPE_CHECKING:
    from artifactd.trust.policy import Basis

#: How long a just-pushed artifact is safe from a prune (``--grace``).
DEFAULT_GRACE_S = 600
#: How many artifacts of each group a prune keeps (``--keep-last``).
DEFAULT_KEEP_LAST = 3
#: How far in the future a creation time may lie and still be an age (seconds):
#: a publisher's clock a little ahead. A later one is an unknown age.
MAX_CLOCK_SKEW_S = 300
#: How long a submission (a delta, an unpromoted candidate) is kept without
#: ``--older-than`` (days): time for ``absorb`` and ``verify --candidate`` to read it.
DEFAULT_SUBMISSION_DAYS = 7.0
#: The kinds ranked by age in groups (``--keep-last``), and the submissions,
#: which are kept for a time only.
_RANKED = ("full", "family", "cell")
_SUBMISSIONS = ("delta", "candidate")
#: The commands that free a registry's blobs once manifests are deleted, run
#: on the registry's host with it stopped or read-only: Debian's
#: ``docker-registry`` package (distribution 2.x), then distribution 3's binary.
#: ``CONFIG`` is the registry's own configuration file.
REGISTRY_CONFIG = "/etc/docker/registry/config.yml"
REGISTRY_GC = (
    f"docker-registry garbage-collect {{untagged}}{REGISTRY_CONFIG}",
    "registry garbage-collect {untagged}CONFIG",
)
#: ``--delete-untagged`` also removes manifests no tag names, such as those left
#: by re-pointed tags before artifactd recorded them; it is only suggested for a
#: repository without an image index, whose untagged children distribution's
#: collector deletes too (distribution issue 3004).
DELETE_UNTAGGED = "--delete-untagged "
_CELL_TAG = re.compile(r"^run-(.+)-cell-[0-9]+$")
_ATTACHED = re.compile(r"^sha256-([0-9a-f]{64})\.(sig|att)$")


@dataclass(frozen=True)
class Manifest:
    """One manifest of the store, with every tag naming it and what it is."""

    digest: str
    tags: list[str]
    #: ``full``, ``family``, ``cell``, ``delta``, ``candidate`` (a whole artifact
    #: only ``candidate-*`` tags name), ``signature``, ``attestation``,
    #: ``superseded`` (only ``superseded-*`` tags name it: tags that named it
    #: were re-pointed) or ``other``.
    kind: str
    family: str | None
    fingerprint: str | None
    created: str | None
    #: Seconds since ``created``, at planning time; None when unknown.
    age_s: float | None
    #: Distinct bytes it references: itself, its config and its layers.
    bytes: int
    #: The artifact a signature or attestation is about.
    subject: str | None = None
    #: digest -> size of every blob it references (itself included).
    blobs: dict[str, int] = field(default_factory=dict, repr=False)
    #: Its layers' digests -> (family, scope key), from their annotations.
    layers: dict[str, tuple[str, str]] = field(default_factory=dict, repr=False)
    #: An image index (or Docker manifest list): its children may be untagged.
    index: bool = False


@dataclass(frozen=True)
class Decision:
    """What a prune does with one manifest, and why."""

    digest: str
    tags: list[str]
    kind: str
    family: str | None
    created: str | None
    age_s: float | None
    bytes: int
    #: ``keep`` or ``delete``.
    decision: str
    reason: str


@dataclass
class PrunePlan:
    """The decisions of a prune, as a dry run prints them and :func:`apply` carries out."""

    store: str
    keep_last: int
    older_than_days: float | None
    grace_s: float
    keep_tags: list[str]
    decisions: list[Decision]
    #: The tags that go with the deleted manifests, sorted.
    delete_tags: list[str]
    #: Bytes of the blobs only deleted manifests reference (freed once blobs are collected).
    bytes_freed: int
    dry_run: bool = True
    #: What to run afterwards on a registry's host to free its blobs: Debian's
    #: ``docker-registry``, then distribution 3's ``registry`` (none for a layout).
    gc_hints: list[str] = field(default_factory=list)
    #: Filled by :func:`apply`: the manifests deleted, and those left because a
    #: tag outside the plan named them by then.
    deleted: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    #: Filled by :func:`apply` on a local layout: blobs removed, and their bytes.
    blobs_removed: int = 0
    bytes_removed: int = 0


def inventory(store: Store, *, now: float | None = None) -> list[Manifest]:
    """Read every tag of ``store`` and the manifest it names; one entry per manifest digest."""
    now = time.time() if now is None else now
    found: dict[str, tuple[list[str], bytes]] = {}
    for tag in store.list_tags():
        ref = store.get_manifest(tag)
        if ref is None:  # untagged since the listing
            continue
        found.setdefault(ref.digest, ([], ref.data))[0].append(tag)
    return [_describe(digest, sorted(tags), data, now) for digest, (tags, data) in found.items()]


def _describe(digest: str, tags: list[str], data: bytes, now: float) -> Manifest:
    """Classify one manifest from its own bytes and its tags.

    A manifest that only ``superseded-*`` tags name is ``superseded``,
    whatever it holds, and its age is the time its last tag moved away (a pod
    that resolved the tag just before may be pulling it by digest).
    """
    m = _what(digest, tags, data, now)
    stamps = [s[0] for t in tags if (s := parse_superseded_tag(t))]
    if not stamps or len(stamps) < len(tags):
        return m
    return replace(m, kind="superseded", age_s=_age(max(stamps), now, SUPERSEDED_TIME_FORMAT))


def _what(digest: str, tags: list[str], data: bytes, now: float) -> Manifest:
    """Classify one manifest from its own bytes (and its tags, for signatures and candidates)."""
    blobs = {digest: len(data)}
    try:
        manifest = ImageManifest.from_bytes(data, source=digest)
    except IntegrityError:
        return Manifest(
            digest,
            tags,
            "other",
            None,
            None,
            None,
            None,
            len(data),
            blobs=blobs,
            index=_is_index(data),
        )
    for desc in [manifest.config, *manifest.layers]:
        blobs[desc.digest] = desc.size
    size = sum(blobs.values())
    attached = [m for t in tags if (m := _ATTACHED.match(t))]
    if attached and len(attached) == len(tags):
        kind = "signature" if attached[0].group(2) == "sig" else "attestation"
        subject = f"sha256:{attached[0].group(1)}"
        return Manifest(
            digest, tags, kind, None, None, None, None, size, subject=subject, blobs=blobs
        )
    notes = manifest.annotations or {}
    if not manifest.is_artifactd or notes.get(ANN_KIND) not in (*_RANKED, "delta"):
        return Manifest(digest, tags, "other", None, None, None, None, size, blobs=blobs)
    layers = {
        d.digest: (
            (d.annotations or {}).get(ANN_FAMILY, ""),
            (d.annotations or {}).get(ANN_SCOPE_KEY, ""),
        )
        for d in manifest.layers
    }
    kind = notes[ANN_KIND]
    if kind == "full" and all(t.startswith(CANDIDATE_TAG_PREFIX) for t in tags):
        kind = "candidate"  # absorbed, not yet promoted: a submission
    family = next(iter(layers.values()), ("", ""))[0] or None if kind == "family" else None
    created = notes.get(ANN_CREATED)
    return Manifest(
        digest,
        tags,
        kind,
        family,
        notes.get(ANN_FINGERPRINT),
        created,
        _age(created, now),
        size,
        blobs=blobs,
        layers=layers,
    )


def _is_index(data: bytes) -> bool:
    """Whether manifest bytes declare an image index or a Docker manifest list."""
    try:
        media_type = json.loads(data).get("mediaType")
    except (ValueError, AttributeError):
        return False
    return media_type in (INDEX_MEDIA_TYPE, DOCKER_LIST_MEDIA_TYPE)


def _age(created: str | None, now: float, form: str = "%Y-%m-%dT%H:%M:%SZ") -> float | None:
    """Seconds since a UTC time as publish writes it (``form``); None when unknown.

    Unknown: absent, unreadable, or more than :data:`MAX_CLOCK_SKEW_S` in the
    future (a manifest stamped 2999 is not the newest, whoever pushed it).
    """
    if not created:
        return None
    try:
        when = calendar.timegm(time.strptime(created, form))
    except (ValueError, OverflowError):
        return None
    if when > now + MAX_CLOCK_SKEW_S:
        return None
    return max(0.0, now - when)


def _scheme_tags(m: Manifest) -> set[str]:
    """Return the tags artifactd's own scheme gives ``m`` (any other tag on it is a promotion).

    A ``candidate-*`` or ``delta-*`` tag is a submission's, never a promotion.
    """
    own = {t for t in m.tags if _CELL_TAG.match(t)} if m.kind == "cell" else set()
    own |= {t for t in m.tags if parse_superseded_tag(t)}
    own |= {t for t in m.tags if t.startswith((CANDIDATE_TAG_PREFIX, DELTA_TAG_PREFIX))}
    if m.fingerprint:
        own.add(full_tag(m.fingerprint))
    for family, scope in m.layers.values() if m.kind == "family" else []:
        if family and scope:
            own.add(family_tag(family, scope))
    return own


@dataclass(frozen=True)
class Rules:
    """What a prune keeps: the command's options."""

    keep_last: int = DEFAULT_KEEP_LAST
    older_than_days: float | None = None
    grace_s: float = DEFAULT_GRACE_S
    keep_tags: tuple[str, ...] = ()
    #: Under a :class:`~artifactd.trust.policy.TrustPolicy`, the artifacts it
    #: verifies rank ahead of the rest in ``keep_last``: what no key vouched for
    #: never pushes out what one did. :data:`~artifactd.trust.policy.UNSAFE_NO_VERIFICATION`
    #: ranks by age alone. Required: no prune ranks without saying which.
    trust: Basis = field(kw_only=True)

    def check(self) -> Rules:
        """Return the rules, or raise :class:`UsageError` for a negative one."""
        # lazy: `artifactd prune --help` loads this module for its defaults, and
        # --help loads no trust code (tests/test_startup.py)
        from artifactd.trust.policy import checked_basis  # noqa: PLC0415

        checked_basis(self.trust, "Rules")
        for name, value in (
            ("--keep-last", self.keep_last),
            ("--older-than", self.older_than_days or 0),
            ("--grace", self.grace_s),
        ):
            if value < 0:
                raise UsageError(f"{name} must be 0 or more, not {value}")
        return self


Reasons = dict[str, tuple[str, str]]


def plan(store: Store, rules: Rules, *, now: float | None = None) -> PrunePlan:
    """Decide what a prune of ``store`` keeps and deletes (see the module doc); change nothing."""
    rules = rules.check()
    manifests = inventory(store, now=now)
    reasons, promoted_layers = _pinned(manifests, rules.keep_tags)
    groups: dict[str, list[Manifest]] = {}
    for m in manifests:
        if m.kind in _RANKED:
            group = f"family {m.family}" if m.kind == "family" else m.kind
            groups.setdefault(group, []).append(m)
        elif m.kind in _SUBMISSIONS and m.digest not in reasons:
            reasons[m.digest] = _submission(m, rules)
        elif m.kind == "superseded" and m.digest not in reasons:
            reasons[m.digest] = _superseded(m, rules)
    for group, members in groups.items():
        if group == "cell":
            reasons.update(_by_run(store, members, reasons, promoted_layers, rules))
            continue
        for rank, m in enumerate(_ranked(store, members, rules.trust)):
            if m.digest not in reasons:
                holder = next((promoted_layers[d] for d in m.layers if d in promoted_layers), None)
                reasons[m.digest] = _by_age(m, rank, group, holder, rules)
    deleted = {d for d, (what, _) in reasons.items() if what == "delete"}
    for m in manifests:
        if m.subject is None:
            continue
        if m.subject in deleted:
            reasons[m.digest] = ("delete", f"its artifact {m.subject[:19]} is deleted")
        else:
            reasons[m.digest] = ("keep", "its artifact is kept (or is not tagged here)")
    return _finish(store, manifests, reasons, rules)


def _ranked(store: Store, members: Sequence[Manifest], trust: Basis) -> list[Manifest]:
    """Return one group's artifacts newest first; with ``trust``, those it verifies first.

    An unknown age (none stamped, unreadable, or in the future) ranks after
    every known one: it is never "the newest".
    """
    # lazy: as in Rules.check
    from artifactd.trust.policy import TrustPolicy  # noqa: PLC0415

    vouched: set[str] = set()
    if isinstance(trust, TrustPolicy):
        for m in members:
            try:
                trust.check(store, m.digest)
            except TrustError:
                continue
            vouched.add(m.digest)
    return sorted(
        members,
        key=lambda m: (m.digest not in vouched, m.age_s is None, m.age_s or 0.0, m.digest),
    )


def _submission(m: Manifest, rules: Rules) -> tuple[str, str]:
    """Decide a delta or an unpromoted candidate: kept for a time, never ranked.

    Within the grace, or younger than ``--older-than`` (default
    :data:`DEFAULT_SUBMISSION_DAYS`), it stays; after that, or without a
    known age (publish always stamps one), it goes.
    """
    days = DEFAULT_SUBMISSION_DAYS if rules.older_than_days is None else rules.older_than_days
    if m.age_s is None:
        return "delete", f"a {m.kind} with no valid creation time ({m.created or 'none'})"
    if m.age_s < rules.grace_s:
        return "keep", f"within the {rules.grace_s:.0f} s grace (a recent push)"
    if m.age_s < days * 86400:
        return "keep", f"a {m.kind} younger than {days:g} days"
    return "delete", f"a {m.kind} older than {days:g} days"


def _superseded(m: Manifest, rules: Rules) -> tuple[str, str]:
    """Decide a manifest whose tags were re-pointed: no tag reaches it, so it is never ranked.

    It stays within the grace of the time its tag moved (a pod that resolved
    the tag just before may still be pulling it by digest) and, with
    ``--older-than``, while younger than that; it goes after.
    """
    if m.age_s is None:
        return "keep", "superseded at an unreadable or future time (unknown age)"
    if m.age_s < rules.grace_s:
        return "keep", f"superseded within the {rules.grace_s:.0f} s grace"
    days = rules.older_than_days
    if days is not None and m.age_s < days * 86400:
        return "keep", f"superseded less than {days:g} days ago"
    return "delete", "superseded: every tag that named it was re-pointed"


def _by_run(
    store: Store,
    cells: Sequence[Manifest],
    reasons: Reasons,
    promoted_layers: dict[str, str],
    rules: Rules,
) -> Reasons:
    """Decide fan-out cells a run at a time: ``--keep-last`` counts runs, never cells.

    A run is as new as its newest cell (with a trust policy, a run with a
    vouched cell ranks first). A run goes whole or stays whole: one cell kept
    (pinned, in the grace, of unknown age) keeps every cell of its run, since
    a merge needs them all.
    """
    runs: dict[str, list[Manifest]] = {}
    for m in _ranked(store, cells, rules.trust):
        run = next((g.group(1) for t in m.tags if (g := _CELL_TAG.match(t))), m.digest)
        runs.setdefault(run, []).append(m)
    out: Reasons = {}
    for rank, (run, members) in enumerate(runs.items()):
        decided = {
            m.digest: reasons.get(m.digest)
            or _by_age(
                m,
                rank,
                "cell runs",
                next((promoted_layers[d] for d in m.layers if d in promoted_layers), None),
                rules,
            )
            for m in members
        }
        kept = next((why for what, why in decided.values() if what == "keep"), None)
        for digest, (what, why) in decided.items():
            whole = kept is not None and what == "delete"
            out[digest] = ("keep", f"run {run} stays whole ({kept})") if whole else (what, why)
    return out


def _pinned(
    manifests: Sequence[Manifest], keep_tags: Sequence[str]
) -> tuple[Reasons, dict[str, str]]:
    """Keep what --keep-tag names, what is promoted, and what is not artifactd's.

    Returns those reasons, and the layers of the whole artifacts kept (layer
    digest -> the tag that keeps it), whose single-family manifests stay too.
    """
    reasons: Reasons = {}
    layers: dict[str, str] = {}
    for m in manifests:
        pinned = [t for t in m.tags if any(fnmatch.fnmatchcase(t, p) for p in keep_tags)]
        promoted = (
            sorted(set(m.tags) - _scheme_tags(m)) if m.kind in (*_RANKED, *_SUBMISSIONS) else []
        )
        if pinned:
            reasons[m.digest] = ("keep", f"--keep-tag matches {pinned[0]}")
        elif m.kind == "other":
            reasons[m.digest] = ("keep", "not an artifactd artifact")
        elif promoted:
            reasons[m.digest] = ("keep", f"promoted as {promoted[0]}")
        else:
            continue
        if m.kind in ("full", "cell"):
            for layer in m.layers:
                layers.setdefault(layer, (pinned or promoted or m.tags)[0])
    return reasons, layers


def _by_age(
    m: Manifest, rank: int, group: str, holder: str | None, rules: Rules
) -> tuple[str, str]:
    """Decide one artifact nothing pins, ``rank`` places from the newest of its group."""
    days = rules.older_than_days
    every_old = days == 0 and rules.grace_s == 0
    if holder is not None:
        return "keep", f"carries a layer of {holder}"
    if rank < rules.keep_last:
        return "keep", f"among the {rules.keep_last} newest of {group}"
    if m.age_s is None:
        if not every_old:
            return "keep", (
                f"creation time {m.created[:40]!r} unreadable or in the future (unknown age)"
                if m.created
                else "no creation time (published before it was recorded)"
            )
    elif m.age_s < rules.grace_s:
        return "keep", f"within the {rules.grace_s:.0f} s grace (a recent push)"
    elif days is not None and m.age_s < days * 86400:
        return "keep", f"younger than {days:g} days"
    why = f"not among the {rules.keep_last} newest of {group}"
    return "delete", why if days is None else f"{why}, older than {days:g} days"


def _finish(
    store: Store, manifests: Sequence[Manifest], reasons: Reasons, rules: Rules
) -> PrunePlan:
    """Assemble the plan: decisions in tag order, the tags deleted, the bytes freed."""
    decisions = [
        Decision(
            m.digest,
            m.tags,
            m.kind,
            m.family,
            m.created,
            m.age_s,
            m.bytes,
            *reasons.get(m.digest, ("keep", "")),
        )
        for m in sorted(manifests, key=lambda m: m.tags[0])
    ]
    gone = {d.digest for d in decisions if d.decision == "delete"}
    live: set[str] = set()
    for m in manifests:
        if m.digest not in gone:
            live |= set(m.blobs)
    freed = {
        b: n for m in manifests if m.digest in gone for b, n in m.blobs.items() if b not in live
    }
    layout = isinstance(store, LayoutStore)
    untagged = "" if any(m.index for m in manifests) else DELETE_UNTAGGED
    return PrunePlan(
        store=store.ref,
        keep_last=rules.keep_last,
        older_than_days=rules.older_than_days,
        grace_s=rules.grace_s,
        keep_tags=list(rules.keep_tags),
        decisions=decisions,
        delete_tags=sorted(t for d in decisions if d.decision == "delete" for t in d.tags),
        bytes_freed=sum(freed.values()),
        gc_hints=[] if layout else [hint.format(untagged=untagged) for hint in REGISTRY_GC],
    )


def apply(
    store: Store, pruned: PrunePlan, *, on_event: EventSink = discard, now: float | None = None
) -> PrunePlan:
    """Delete what ``pruned`` decided, through ``store``; return the plan with what was done.

    Tags are read again first: a manifest that a tag outside the plan names
    by now (promoted during the prune) is left, and so are its signatures.
    An identical artifact published again meanwhile under its own tags is not
    seen (same digest, same tags, same creation time): that push is lost.
    Artifacts go before their signatures, so a failure half-way never leaves
    an artifact that lost its signature. On a local layout, blobs nothing
    references any more are then removed, under the index lock, those
    younger than the grace excepted (see
    :meth:`~artifactd.stores.layout.LayoutStore.sweep_blobs`).
    """
    planned = {d.digest: set(d.tags) for d in pruned.decisions}
    doomed = [d for d in pruned.decisions if d.decision == "delete"]
    now_tags: dict[str, set[str]] = {}
    for tag, digest in store.tag_digests().items():
        now_tags.setdefault(digest, set()).add(tag)
    subjects = {d.digest: _ATTACHED.match(d.tags[0]) for d in doomed}
    left: set[str] = set()
    order = sorted(doomed, key=lambda d: subjects[d.digest] is not None)
    for d in order:
        match = subjects[d.digest]
        subject = f"sha256:{match.group(1)}" if match else None
        extra = now_tags.get(d.digest, set()) - planned[d.digest]
        if extra or (subject is not None and subject in left):
            left.add(d.digest)
            pruned.skipped.append(d.digest)
            continue
        store.delete_manifest(d.digest)
        pruned.deleted.append(d.digest)
        on_event({"stage": "prune", "event": "deleted", "digest": d.digest, "tags": d.tags})
    if isinstance(store, LayoutStore):
        removed = store.sweep_blobs(
            min_age_s=pruned.grace_s, now=time.time() if now is None else now
        )
        pruned.blobs_removed = len(removed)
        pruned.bytes_removed = sum(removed.values())
    pruned.dry_run = False
    return pruned


@dataclass(frozen=True)
class Usage:
    """Bytes one family or one fingerprint takes in a store (each blob counted once)."""

    bytes: int
    blobs: int
    tags: list[str]


@dataclass
class DuReport:
    """What ``artifactd du`` prints: bytes per family, per fingerprint and in all."""

    store: str
    #: Every blob a tag reaches (manifests, configs, layers, signatures), each once.
    total_bytes: int
    families: dict[str, Usage]
    fingerprints: dict[str, Usage]
    #: Bytes of signatures, attestations and foreign manifests.
    other_bytes: int
    #: A local layout's blobs that no tag reaches (None for a registry, which does not say).
    unreferenced_bytes: int | None
    #: Bytes only superseded manifests (re-pointed tags) reach: what a prune
    #: frees once their grace is over. Not in ``families`` or ``fingerprints``.
    superseded_bytes: int = 0


def usage(store: Store) -> DuReport:
    """Count the bytes ``store`` holds per family (their layers) and per fingerprint.

    A fingerprint's bytes are every blob of the manifests stamped with it
    (whole, single-family and cell artifacts, with their configs); blobs two
    artifacts share count for each of them, and once in ``total_bytes``.
    """
    manifests = inventory(store)
    every: dict[str, int] = {}
    fam: dict[str, tuple[dict[str, int], set[str]]] = {}
    fps: dict[str, tuple[dict[str, int], set[str]]] = {}
    other: dict[str, int] = {}
    superseded: dict[str, int] = {}
    for m in manifests:
        every.update(m.blobs)
        if m.kind == "superseded":
            superseded.update(m.blobs)
            continue
        if m.fingerprint:
            blobs, tags = fps.setdefault(m.fingerprint, ({}, set()))
            blobs.update(m.blobs)
            tags.update(m.tags)
        else:
            other.update(m.blobs)
        for layer, (family, _) in m.layers.items():
            blobs, tags = fam.setdefault(family or "?", ({}, set()))
            blobs[layer] = m.blobs[layer]
            tags.update(m.tags)
    live = {d for m in manifests if m.kind != "superseded" for d in m.blobs}
    unreferenced = None
    if isinstance(store, LayoutStore):
        unreferenced = sum(n for d, n in store.blob_digests().items() if d not in every)

    def tally(table: dict[str, tuple[dict[str, int], set[str]]]) -> dict[str, Usage]:
        return {k: Usage(sum(b.values()), len(b), sorted(t)) for k, (b, t) in sorted(table.items())}

    return DuReport(
        store=store.ref,
        total_bytes=sum(every.values()),
        families=tally(fam),
        fingerprints=tally(fps),
        other_bytes=sum(other.values()),
        unreferenced_bytes=unreferenced,
        superseded_bytes=sum(n for d, n in superseded.items() if d not in live),
    )
