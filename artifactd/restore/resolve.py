"""Resolve: which artifact each family of a restore comes from, and whether it already is.

Plan, then execute. :func:`plan_restore` resolves, with a few tag lookups and
never a scan, the whole artifact tagged ``fp-<local hash>``, else each
family's ``<family>-<local scope key>`` tag, and says for every family whether
it will hit and why not; it fetches no layer and writes nothing.
:func:`noop_plan` is the one no-op check: the target's marker (trusted only
through :meth:`CacheVolume.installed <artifactd.restore.destination.CacheVolume.installed>`)
records the resolution that looking up the tags again would give. It reads no
config and builds no pydantic model, so a restarted pod with a warm volume
answers in a fraction of a second. :mod:`artifactd.restore.install` executes plans.

This module alone owns the selection rule, for every source (a
:class:`~artifactd.restore.source.RestoreSource`: a registry, a local or baked OCI
layout, the node store, a mounted tree): :func:`whole_want` and
:func:`family_want` name the tags, :func:`picks` is the rule as tag lookups
tell it (what the node store fills), :func:`plan_restore` the rule with every
artifact read and bound (the one place a plan is built), and :func:`noop_plan`
asks whether the rule would pick what the marker records. A source only
answers lookups, reads and layer extraction.

A tag is not evidence: whoever can push can point ``fp-<hash>`` or a family
tag at any manifest, signed or not. :func:`unbound` is the one check that an
artifact is for what the pod resolved, made on every source with what the
artifact's own content says; under a signature policy that content is signed.
"""

from __future__ import annotations

import os
from types import MappingProxyType

from artifactd.errors import StoreError
from artifactd.families import get_family, select_families, select_names
from artifactd.fingerprint.key import scope_key
from artifactd.format.oci import FULL_TAG_PREFIX, family_tag, full_tag
from artifactd.records import Record
from artifactd.restore.destination import CacheVolume
from artifactd.restore.source import Want

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any, Literal

    # Only planning a miss or executing needs these; a no-op restore never imports them.
    from artifactd.families import Family
    from artifactd.fingerprint.declare import ToMatch
    from artifactd.fingerprint.diff import FieldDiff, ScopeMatch
    from artifactd.fingerprint.model import Fingerprint
    from artifactd.format.canary import Canary
    from artifactd.format.views import FingerprintView, LayerView
    from artifactd.fsutil import StrPath
    from artifactd.restore.markertypes import RestoreMarker
    from artifactd.restore.source import Found, RestoreSource
    from artifactd.stores.artifacts import Artifact
    from artifactd.trust.policy import Basis

#: How many whole artifacts a miss reads, at most, to find the closest one.
SAMPLE_SIZE = 16
#: Why a family misses on a full match: the artifact was built without it.
ABSENT_FROM_ARTIFACT = "the matching artifact has no such cache"

#: The empty mapping a field defaults to (shared, so never to be mutated).
_NONE: Mapping[str, Any] = MappingProxyType({})


class FamilyPlan(Record):
    """What restore will do for one family (:meth:`hit` fills in a hit's sizes)."""

    family: str
    verdict: ScopeMatch
    source: Literal["full", "family"] | None = None
    artifact: str | None = None
    layer: LayerView | None = None
    dirs: Mapping[str, str] = _NONE
    reason: str | None = None
    deciding: Sequence[FieldDiff] = ()
    tag: str | None = None
    files: int = 0
    unpacked: int = 0
    #: The artifact's format version: 2 puts the layer's members under ``<family>/``.
    version: int = 1
    #: The key that signed the manifest, when the restore verified signatures.
    signed_by: str | None = None

    @classmethod
    def hit(
        cls,
        family: str,
        source: Literal["full", "family"],
        artifact: str,
        layer: LayerView,
        *,
        dirs: Mapping[str, str],
        tag: str,
        version: int,
        signed_by: str | None = None,
    ) -> FamilyPlan:
        """Return a hit from ``layer`` of ``artifact``, with the layer's file count and size."""
        return cls(
            family,
            "hit",
            source,
            artifact,
            layer,
            dirs,
            tag=tag,
            files=len(layer.files),
            unpacked=layer.unpacked_size,
            version=version,
            signed_by=signed_by,
        )

    @property
    def member_prefix(self) -> str | None:
        """The directory the layer's members sit under (format 2), or None."""
        return self.family if self.version >= 2 else None

    @property
    def bytes(self) -> int:
        """Compressed bytes to fetch."""
        return self.layer.size if self.layer else 0


class ClosestSampled(Record):
    """The closest of the artifacts a miss read, a hint for the operator.

    Not the nearest in the store: a miss reads at most :data:`SAMPLE_SIZE`
    artifacts (``compared`` of them), in tag order, which is the order of
    fingerprint hashes and so arbitrary; reading every artifact of a large
    registry at each pod start would cost more than the hint is worth.
    ``diff`` compares any two exactly.
    """

    tag: str
    digest: str
    differing: Sequence[FieldDiff]
    compared: int = 1
    artifact: Artifact | None = None
    #: The flags this machine would declare to match it, and the probed fields
    #: no flag may change (:func:`~artifactd.fingerprint.declare.to_match`).
    to_match: ToMatch | None = None

    @property
    def json_hidden(self) -> tuple[str, ...]:
        """Fields ``--json`` leaves out: the whole artifact read."""
        return ("artifact",)


class RestorePlan(Record):
    """The result of resolution: per-family hits and misses and where things will go."""

    store: str
    target: str
    fingerprint_hash: str
    match: Literal["full", "partial", "miss"]
    families: Sequence[FamilyPlan]
    env: Mapping[str, str]
    env_file: str
    #: The local fingerprint, flattened (scope keys of families that missed).
    flat: Mapping[str, Any] = _NONE
    nearest: ClosestSampled | None = None
    error: str | None = None
    noop: bool = False
    #: The key ids every manifest had to be signed by (``--verify-key``), or None.
    trusted: Sequence[str] | None = None
    #: Each tag resolution looked up and passed over, with why: its artifact is
    #: for something else (:func:`unbound`). Never installed; ``--require`` fails on it.
    unbound: Mapping[str, str] = _NONE
    #: A whole artifact's canaries (its serve cells recorded them), and its digest:
    #: the restore writes them beside its marker for ``status --canary``.
    canaries: Sequence[Canary] = ()
    canary_artifact: str | None = None

    @property
    def json_hidden(self) -> tuple[str, ...]:
        """Fields ``--json`` leaves out: the flattened fingerprint, the canaries."""
        return ("flat", "canaries")

    @property
    def hits(self) -> list[FamilyPlan]:
        """Families that will be restored."""
        return [f for f in self.families if f.verdict == "hit"]

    @property
    def bytes_to_fetch(self) -> int:
        """Compressed bytes of every layer that will be fetched."""
        return sum(f.bytes for f in self.hits)


def _family_dirs(fam: Family, target: str, user: str | None) -> dict[str, str]:
    return fam.restore_paths(target, user=user)


def unbound(tag: str, kind: str, claimed: str | None, wanted: str) -> str | None:
    """Why the artifact ``tag`` names is not for what the pod resolved; None when it is.

    The one binding check, for every source. ``claimed`` is what the
    artifact's own content says it is for: the config's fingerprint hash
    behind a whole-artifact tag ``fp-<hash>``, the scope key of the family's
    record behind a family tag ``<family>-<scope key>`` (None: it holds no
    such family); ``wanted`` is the hash or scope key the pod resolved, the
    one in ``tag``. ``kind`` is the config's: one cell's part of a fan-out
    build, or a pod's delta, is never restored, whatever it claims. The content read is pinned
    by the manifest's digest (the config blob's is in it), so under
    ``--verify-key`` the claim is signed; the tag never is.
    """
    whole = tag.startswith(FULL_TAG_PREFIX)
    if kind == "cell":
        return f"{tag} names one cell's part of a fan-out build, which is never restored"
    if kind == "delta":
        return f"{tag} names a pod's contributed delta, which is never restored (absorb reads it)"
    if claimed == wanted:
        return None
    if claimed is None:
        return f"{tag} names an artifact that holds no {tag.rsplit('-', 1)[0]} cache"
    what = "fingerprint" if whole else "scope"
    return (
        f"{tag} names an artifact built for another {what} ({claimed[:12]}..., "
        f"not {wanted[:12]}...): a tag re-pointed or mis-published, never installed"
    )


def whole_want(fingerprint_hash: str) -> Want:
    """Return the tag of the whole artifact built for ``fingerprint_hash``: ``fp-<hash>``."""
    return Want(full_tag(fingerprint_hash), None, fingerprint_hash)


def family_want(family: str, flat: Mapping[str, Any]) -> Want:
    """Return ``family``'s scope tag for the fingerprint ``flat``: ``<family>-<scope key>``."""
    fam = get_family(family)
    key = scope_key(flat, family, fam.scope, fam.scope_revision)
    return Want(family_tag(family, key), family, key)


def wants(
    fingerprint_hash: str, flat: Mapping[str, Any], families: Sequence[str] | None
) -> list[Want]:
    """Return every tag the rule may read, in its order: the whole artifact's, each family's."""
    return [whole_want(fingerprint_hash), *(family_want(n, flat) for n in select_names(families))]


def picks(
    source: RestoreSource,
    fingerprint_hash: str,
    flat: Mapping[str, Any],
    families: Sequence[str] | None,
) -> list[Want]:
    """Return the tags the rule reads as lookups tell it: the whole artifact's, else the families'.

    The whole artifact's tag if ``source`` has it, else each selected
    family's scope tag (whether each is there or not).

    Reads no artifact, so binding is not checked here: :func:`plan_restore` does.
    """
    whole = whole_want(fingerprint_hash)
    if source.current(whole) is not None:
        return [whole]
    return [family_want(n, flat) for n in select_names(families)]


def plan_restore(
    store: RestoreSource | None,
    local: FingerprintView,
    target: StrPath,
    *,
    trust: Basis,
    families: Sequence[str] | None = None,
    consumer_user: str | None = None,
    env_file: StrPath | None = None,
    store_ref: str | None = None,
    store_error: str | None = None,
) -> RestorePlan:
    """Resolve what to restore for ``local`` into ``target``; fetch no layer, write nothing.

    ``store`` is any :class:`~artifactd.restore.source.RestoreSource`: a store
    (through :class:`~artifactd.restore.source.StoreSource`) or a mounted tree,
    resolved by the same rule. ``trust`` is required: under a
    :class:`~artifactd.trust.policy.TrustPolicy`, every manifest resolution
    picks must be signed by one of its keys (checked before its config is
    read): an unsigned or wrongly signed one raises
    :class:`~artifactd.errors.TrustError`, so nothing is installed from any of
    them. Only :data:`~artifactd.trust.policy.UNSAFE_NO_VERIFICATION` installs
    unverified; anything else (``None`` included) is a :class:`TypeError`.
    An unreachable store (``store`` None with ``store_error``, or a
    :class:`StoreError` while resolving) makes every family a miss that names
    the error. An artifact that is there but unreadable (corrupt, not ours,
    schema-invalid) raises its :class:`ArtifactdError`: the caller's policy
    decides what that means.
    """
    # lazy: planning is past the no-op check; a no-op restore never loads the policy module
    from artifactd.trust.policy import TrustPolicy, checked_basis  # noqa: PLC0415

    trust = checked_basis(trust, "plan_restore")
    target = os.path.abspath(target)
    selected = select_families(families)
    ref = store.ref if store is not None else (store_ref or "?")
    plans: list[FamilyPlan] = []
    match: Literal["full", "partial", "miss"] = "miss"
    nearest: ClosestSampled | None = None
    error = store_error
    passed: dict[str, str] = {}
    whole: Found | None = None
    if store is not None:
        try:
            plans, match, passed, whole = _resolve(
                store, local, selected, target, consumer_user, trust=trust
            )
            if any(p.verdict == "miss" for p in plans) and match != "full":
                # Only a miss lists tags: resolving itself is tag lookups, never a scan.
                model = _model(local)
                nearest = _closest_sampled(store, model)
                plans = _explain_misses(plans, model, nearest, keep=list(passed.values()))
        except StoreError as exc:
            if not exc.kind == "unreachable":
                raise
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
        target=target,
        fingerprint_hash=local.hash,
        match=match,
        families=plans,
        env=env,
        env_file=CacheVolume(target).env_path if env_file is None else os.path.abspath(env_file),
        flat=local.flatten(),
        nearest=nearest,
        error=error,
        trusted=trust.key_ids if isinstance(trust, TrustPolicy) else None,
        unbound=passed,
        canaries=whole.canaries if whole is not None else (),
        canary_artifact=whole.digest if whole is not None else None,
    )


def noop_plan(
    store: RestoreSource,
    fingerprint_hash: str,
    flat: Mapping[str, Any],
    volume: CacheVolume,
    *,
    families: Sequence[str] | None = None,
    trusted: Sequence[str] | None = None,
) -> RestorePlan | None:
    """Return a no-op plan when the target already holds what resolving would pick.

    With ``trusted`` (the key ids of a verification policy), only an install
    whose every family was verified by one of those keys is a no-op: caches
    restored without verification, or under a key since removed, are
    resolved (and verified) again.

    The one no-op check, made before planning and again under the target's
    lock. It trusts the marker only through :meth:`CacheVolume.installed` (no
    install in progress, every directory there, the env file as recorded),
    then asks the source whether the same tags still name the same artifacts
    (:func:`_marker_current`): a few tag lookups, no config parsing. An
    unreachable store means "resolve again", which reports the miss and
    leaves the installed caches alone.
    """
    marker = volume.installed()
    names = select_names(families)
    if (
        marker is None
        or marker["fingerprint_hash"] != fingerprint_hash
        or marker["store"] != store.ref
        or marker["selected"] != names
    ):
        return None
    if trusted is not None and not all(
        f.get("signed_by") in trusted for f in marker["families"].values()
    ):
        return None
    try:
        if not _marker_current(store, marker, fingerprint_hash, flat):
            return None
    except StoreError:
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
        target=volume.root_dir,
        fingerprint_hash=fingerprint_hash,
        match=marker["match"],
        families=plans,
        env=dict(marker["env"]),
        env_file=volume.env_path,
        flat=flat,
        noop=True,
        trusted=list(trusted) if trusted is not None else None,
    )


def _marker_current(
    source: RestoreSource, marker: RestoreMarker, fingerprint_hash: str, flat: Mapping[str, Any]
) -> bool:
    """Whether resolving now would pick exactly the artifacts the marker records.

    The rule of :func:`_resolve`, asked with tag lookups only. A full match
    needs only the whole artifact's tag (and imports no family).
    """
    recorded = marker["families"].values()
    whole = source.current(whole_want(fingerprint_hash))
    if marker["match"] == "full":
        return whole is not None and all(f["artifact"] == whole.digest for f in recorded)
    if whole is not None:
        return False  # a whole artifact appeared since: resolve it
    for name, fam in marker["families"].items():
        want = family_want(name, flat)
        if unbound(want.tag, "family", fam["scope_key"], want.key):
            return False  # a marker written by a release that did not check binding
        now = source.current(want)
        if now is None or now.digest != fam["artifact"]:
            return False
    for name in marker["missed"]:
        want = family_want(name, flat)
        now = source.current(want)
        if now is not None and (
            now.claimed is None or not unbound(want.tag, "family", now.claimed, want.key)
        ):
            return False  # a family that missed last time may have an artifact now
    return True


def _resolve(
    source: RestoreSource,
    local: FingerprintView,
    selected: list[Family],
    target: str,
    user: str | None,
    *,
    trust: Basis,
) -> tuple[list[FamilyPlan], Literal["full", "partial", "miss"], dict[str, str], Found | None]:
    """Apply the selection rule: the whole artifact's tag, else each family's scope tag.

    Every artifact read is held to :func:`unbound`; one that is not for the
    pod is passed over (and named, in the returned mapping of tag -> why).
    The last item is the whole artifact picked, if any.
    """
    whole = whole_want(local.hash)
    full = source.find(whole, trust=trust)
    passed: dict[str, str] = {}
    if full is not None and (
        why := unbound(whole.tag, full.kind, full.fingerprint_hash, whole.key)
    ):
        passed[whole.tag] = why
        full = None
    plans: list[FamilyPlan] = []
    flat = local.flatten()
    for fam in selected:
        dirs = _family_dirs(fam, target, user)
        if full is not None:
            rec = full.records.get(fam.name)
            if rec is None:
                plans.append(FamilyPlan(fam.name, "miss", dirs=dirs, reason=ABSENT_FROM_ARTIFACT))
            else:
                plans.append(_hit(fam.name, "full", full, rec, dirs))
            continue
        want = family_want(fam.name, flat)
        art = source.find(want, trust=trust)
        rec = art.records.get(fam.name) if art is not None else None
        why = None
        deciding: Sequence[FieldDiff] = ()
        if art is not None:
            why = unbound(want.tag, art.kind, rec.scope_key if rec else None, want.key)
        if why and rec is not None and art is not None and art.kind not in ("cell", "delta"):
            # lazy: fast path: LATER in artifactd/cli/fast.py, never loaded by a no-op restore
            from artifactd.fingerprint.diff import differences  # noqa: PLC0415

            deciding = differences(rec.scope, local.select(fam.scope))
            names = ", ".join(d.path for d in deciding) or "its scope revision"
            why = f"{why}; it differs in {names}"
        if why:
            passed[want.tag] = why
        if art is None or rec is None or why:
            reason = why or f"no artifact in {source.ref} has this family's scope"
            plans.append(FamilyPlan(fam.name, "miss", dirs=dirs, reason=reason, deciding=deciding))
        else:
            plans.append(_hit(fam.name, "family", art, rec, dirs))
    if full is not None:
        return plans, "full", passed, full
    hit = any(p.verdict == "hit" for p in plans)
    return plans, "partial" if hit else "miss", passed, None


def _hit(
    family: str,
    source: Literal["full", "family"],
    found: Found,
    rec: LayerView,
    dirs: Mapping[str, str],
) -> FamilyPlan:
    return FamilyPlan.hit(
        family,
        source,
        found.digest,
        rec,
        dirs=dirs,
        tag=found.tag,
        version=found.version,
        signed_by=found.signed_by,
    )


def _model(local: FingerprintView) -> Fingerprint:
    """Return ``local`` as the pydantic model, to explain a miss (hits never need it)."""
    # lazy: only a miss explains itself with the model
    from artifactd.fingerprint.model import Fingerprint  # noqa: PLC0415

    if isinstance(local, Fingerprint):
        return local
    return Fingerprint.model_validate(local.document())


def _closest_sampled(source: RestoreSource, local: Fingerprint) -> ClosestSampled | None:
    """Read up to :data:`SAMPLE_SIZE` whole artifacts and pick the least different."""
    # lazy: fast path: LATER in artifactd/cli/fast.py, never loaded by a no-op restore
    from artifactd.fingerprint.declare import to_match  # noqa: PLC0415
    from artifactd.fingerprint.diff import differences  # noqa: PLC0415

    best: tuple[int, ClosestSampled] | None = None
    compared = 0
    here = local.flatten()
    for tag, art in source.sample(SAMPLE_SIZE):
        differing = differences(art.config.fingerprint.flatten(), here)
        if best is None or len(differing) < best[0]:
            best = (len(differing), ClosestSampled(tag, art.digest, differing, 0, art))
        compared += 1
    if best is None:
        return None
    closest = best[1]
    found = closest.artifact
    settle = to_match(found.config.fingerprint, local) if found is not None else None
    return closest._replace(compared=compared, to_match=settle)


def _explain_misses(
    plans: list[FamilyPlan],
    local: Fingerprint,
    nearest: ClosestSampled | None,
    *,
    keep: Sequence[str] = (),
) -> list[FamilyPlan]:
    """Return ``plans`` with each miss the closest artifact explains: its deciding fields.

    A miss whose reason is in ``keep`` (a tag passed over as unbound) keeps it.
    """
    # lazy: fast path: LATER in artifactd/cli/fast.py, never loaded by a no-op restore
    from artifactd.fingerprint.diff import family_match  # noqa: PLC0415

    if nearest is None or nearest.artifact is None:
        return plans
    art = nearest.artifact
    out = []
    for plan in plans:
        explained = plan
        if (
            plan.verdict == "miss"
            and plan.reason not in keep
            and art.config.layer(plan.family) is not None
        ):
            compared = family_match(get_family(plan.family), art.config.fingerprint, local)
            explained = plan._replace(deciding=compared.deciding)
            if compared.deciding:
                names = ", ".join(d.path for d in compared.deciding)
                why = f"closest artifact read {nearest.tag[:19]}... differs in {names}"
                explained = explained._replace(reason=why)
        out.append(explained)
    return out
