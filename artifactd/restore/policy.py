"""Restore's policy: the init container's whole job, and what every failure means.

:func:`run_restore` takes probe data in and gives a :class:`RestoreOutcome`
out, never an exception for anything an artifact, a store or the target can
do. Every such failure (unreachable, not found, corrupt, hostile,
schema-invalid, no space, target not writable, and any unexpected error)
leaves the target untouched and is reported with its class; the outcome's exit
code is 0 unless ``require`` is set, then the failure's documented code (a
miss: 6; a tag passed over because its artifact is for something else, even
when other families hit: 5, ``corrupt``, nothing installed). The mechanism it
drives is :mod:`artifactd.restore.install`, imported only when there is
something to install: a no-op restore (:mod:`artifactd.cli.fast`) never loads
it, nor the node store's, the registry's or the signatures' modules, which the
functions here import where they are needed.
"""

from __future__ import annotations

import os
import time

from artifactd.errors import (
    ArtifactdError,
    CacheMissError,
    ConfigError,
    IntegrityError,
    NotFoundError,
    StoreError,
    UnboundError,
    UsageError,
)
from artifactd.events import discard
from artifactd.fingerprint.key import flatten, hashed_view, raw_hash
from artifactd.fsutil import as_path
from artifactd.records import Record
from artifactd.restore.destination import CacheVolume, no_hook, os_error
from artifactd.restore.envfile import check_env_text
from artifactd.restore.resolve import RestorePlan, noop_plan, plan_restore, whole_want
from artifactd.restore.source import StoreSource
from artifactd.stores import default_store, open_store
from artifactd.stores.layout import LayoutStore

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any, Literal, TypeAlias

    from artifactd.events import EventSink
    from artifactd.format.views import FingerprintView
    from artifactd.fsutil import StrPath
    from artifactd.restore.destination import StepHook
    from artifactd.restore.install import RestoreResult
    from artifactd.restore.nodefill import FillResult, Lookup
    from artifactd.restore.predict import Prediction, PredictOptions
    from artifactd.restore.source import RestoreSource
    from artifactd.stores.layout import LayoutStore
    from artifactd.stores.mirrors import MirrorSettings


class RestoreRequest(Record):
    """Everything the init container is told (flags or ``ARTIFACTD_*`` variables).

    ``store`` None means the default: the store baked into this image for this
    fingerprint, if there is one, else the local one (:func:`default_store`),
    unless ``from_dir`` names a directory to restore from.
    """

    store: str | None
    target: StrPath
    families: Sequence[str] | None = None
    #: An unpacked artifact or image to restore from instead of a store
    #: (:mod:`artifactd.restore.mounted`).
    from_dir: StrPath | None = None
    #: An artifact whose fingerprint gives the software fields (the init image's case).
    software_from: str | None = None
    #: ``oci:PATH`` on the node's disk: restore from it, fetching into it what it lacks.
    node_store: str | None = None
    consumer_user: str | None = None
    env_file: StrPath | None = None
    require: bool = False
    dry_run: bool = False
    insecure: bool = False
    #: ``--mirror`` URLs, ``--hosts-dir``, ``--registries-conf``: where pulls find mirrors
    #: (:mod:`artifactd.stores.mirrors`; unset: their ``ARTIFACTD_*`` variables, else defaults).
    mirrors: Sequence[str] = ()
    hosts_dir: StrPath | None = None
    registries_conf: StrPath | None = None
    max_bytes: int | None = None
    lock_timeout: float | None = None
    #: Key specs (``--verify-key``): install only manifests one of these keys signed.
    verify_keys: Sequence[str] = ()
    #: Manifest and layer digests never installed (a node store's quarantine).
    refused: frozenset[str] = frozenset()
    #: How files come from the node store's unpacked layers (``--node-link``):
    #: ``auto`` (reflink, else hard link where the family allows, else copy) or
    #: ``copy`` (reflink, else copy: a pod never shares the node store's inode).
    node_link: str = "auto"
    #: Set by the node store's own restore: the node store's root, read through its
    #: unpacked layers (:class:`~artifactd.restore.nodefill.NodeSource`).
    node_trees: StrPath | None = None
    #: ``--predict``: predict the engine's own hit from the plan before any layer is fetched.
    predict: PredictOptions | None = None


class Failure(Record):
    """Why a restore changed nothing: the error's class, message and advice."""

    kind: str
    message: str
    hint: str | None
    exit_code: int
    error: BaseException


if TYPE_CHECKING:
    Status: TypeAlias = Literal["restored", "noop", "miss", "failed", "dry_run"]


class RestoreOutcome(Record):
    """What :func:`run_restore` did, and the exit code the policy gives it."""

    status: Status
    plan: RestorePlan
    result: RestoreResult | None
    failure: Failure | None
    exit_code: int
    #: With ``--node-store``: what the node store held, and what was fetched into it.
    node: FillResult | None = None
    #: With ``--predict``: the engine's own hit, predicted before any layer was fetched.
    prediction: Prediction | None = None

    @property
    def cache_hit(self) -> bool:
        """Whether the target holds restored caches for this machine now."""
        return self.status in ("restored", "noop")


def failure_of(exc: BaseException) -> Failure:
    """Classify any exception a restore can meet into a :class:`Failure`."""
    if isinstance(exc, OSError):
        exc = os_error(exc, "restore")
    if isinstance(exc, ArtifactdError):
        return Failure(exc.kind, exc.message, exc.hint, exc.exit_code, exc)
    return Failure(
        "internal",
        f"unexpected {type(exc).__name__}: {str(exc)[:200]}",
        "this is a bug in artifactd; set ARTIFACTD_TRACEBACK=1 and report the traceback",
        1,
        exc,
    )


def run_restore(
    request: RestoreRequest,
    raw_fingerprint: dict[str, Any],
    *,
    on_event: EventSink = discard,
    step_hook: StepHook = no_hook,
) -> RestoreOutcome:
    """Restore for the init container: resolve, install, and apply the failure policy.

    ``raw_fingerprint`` is the probe's plain document
    (:func:`artifactd.fingerprint.probe.probe_raw`), so a no-op answers without
    building a model. Raises only for the caller's own mistakes
    (:class:`UsageError`, :class:`ConfigError`); everything else becomes the outcome's failure.
    """
    # Checked before anything is created: each ends up in the env file.
    check_env_text(os.path.abspath(request.target), "--target")
    if request.consumer_user is not None:
        check_env_text(request.consumer_user, "--consumer-user")
    if request.software_from is not None:
        try:
            raw_fingerprint = _adopt_software(raw_fingerprint, request)
        except (UsageError, ConfigError):
            raise
        except ArtifactdError as exc:
            volume = CacheVolume(request.target, env_file=request.env_file)
            return _failed(_unresolved(request, raw_fingerprint, volume, exc), exc, request.require)
    if request.node_store is not None:
        return _via_node_store(request, raw_fingerprint, on_event=on_event, step_hook=step_hook)
    return _run(request, raw_fingerprint, on_event=on_event, step_hook=step_hook)


def _via_node_store(
    request: RestoreRequest,
    raw_fingerprint: dict[str, Any],
    *,
    on_event: EventSink,
    step_hook: StepHook,
) -> RestoreOutcome:
    """Fill the node store from the registry (one pod per node fetches), then restore from it.

    A node store that cannot be used (its lock held past the timeout, its disk
    unwritable or full) is passed over: the restore goes straight to the
    registry. A copy in it that fails the restore's checks (damaged: corrupt
    or missing bytes; or a tag there re-pointed at an artifact for something
    else) is set aside and fetched again from the registry, and the restore
    from the node store is tried once more, so the pod still starts warm and
    the next pod on the node reads the repaired copy.
    """
    # lazy: the node store's modules load only with --node-store, not on a plain no-op restore
    from artifactd.restore.nodefill import Lookup, VerifiedPins  # noqa: PLC0415
    from artifactd.stores.layout import LayoutStore  # noqa: PLC0415
    from artifactd.stores.nodestore import (  # noqa: PLC0415
        LINKINGS,
        LOCK_TIMEOUT,
        node_lock,
        node_root,
        refused_digests,
    )

    assert request.node_store is not None  # noqa: S101 - the caller checked
    if request.from_dir is not None:
        raise UsageError("--from-dir and --node-store name two sources", hint="pass one of them")
    root = node_root(request.node_store)
    if request.node_link not in LINKINGS:
        raise UsageError(
            f"--node-link {request.node_link!r} is not a way to take the node store's files",
            hint="auto (reflink, else hard link where the family allows, else copy) or copy",
        )
    lookup = Lookup.of(raw_fingerprint, request.families)
    request = _with_source(request, lookup.fingerprint_hash)._replace(node_store=None)
    assert request.store is not None  # noqa: S101 - _with_source set the default
    timeout = request.lock_timeout if request.lock_timeout is not None else LOCK_TIMEOUT

    def fill_node(damaged: RestoreOutcome | None = None) -> FillResult:
        with node_lock(root, timeout=timeout):
            node = LayoutStore(root, create=True)
            # Read before a damaged copy is set aside: they answer if the registry cannot.
            unbound = list(damaged.plan.unbound) if damaged is not None else []
            pins = VerifiedPins(node, lookup, unbound=unbound)
            dropped = []
            if damaged is not None:
                pins.snapshot()
                dropped = _set_aside(node, damaged, lookup, on_event)
            result = _fill(
                node,
                request,
                lookup,
                on_event=on_event,
                refresh=damaged is not None,
                pins=pins,
            )
            result.set_aside = dropped
            return result

    def from_node() -> RestoreOutcome:
        with node_lock(root, shared=True, timeout=timeout):
            # What failed a canary on this node is never served to its pods again.
            direct = request._replace(
                store=f"oci:{root}", refused=refused_digests(root), node_trees=root
            )
            return _run(direct, raw_fingerprint, on_event=on_event, step_hook=step_hook)

    try:
        filled = fill_node()
        outcome = from_node()
        if _damaged(outcome):
            outcome = _again(filled, fill_node(outcome), from_node)
    except (UsageError, ConfigError):
        raise
    except (ArtifactdError, OSError) as exc:
        on_event({"stage": "node-store", "event": "bypassed", "error": str(exc)[:200]})
        return _run(request, raw_fingerprint, on_event=on_event, step_hook=step_hook)
    failure = outcome.failure
    if failure is not None and (
        failure.kind == "untrusted"
        or (_damaged(outcome) and not isinstance(failure.error, UnboundError))
    ):
        # The node store is a cache: what it holds unverified (filled before the
        # publisher signed, or tampered with on the node) or could not repair
        # (the registry down) is no reason to miss. The registry's copy gets
        # the same checks.
        on_event({"stage": "node-store", "event": "bypassed", "error": failure.message})
        return _run(request, raw_fingerprint, on_event=on_event, step_hook=step_hook)
    if outcome.result is not None:  # the fill is part of finding what to restore
        seconds = outcome.result.phases.get("lookup", 0.0) + filled.seconds
        phases = {**outcome.result.phases, "lookup": round(seconds, 4)}
        outcome = outcome._replace(result=outcome.result._replace(phases=phases))
    return outcome._replace(node=filled)


def _again(
    filled: FillResult, again: FillResult, from_node: Callable[[], RestoreOutcome]
) -> RestoreOutcome:
    """Restore from the node store again after a repairing fill (``again``, merged into ``filled``).

    Raises :class:`StoreError` when the repair fetched nothing and the node
    store no longer serves: the registry, asked directly, reports why.
    """
    filled.fetched += again.fetched
    filled.bytes_fetched += again.bytes_fetched
    filled.set_aside = again.set_aside
    filled.cleared += again.cleared
    filled.seconds = round(filled.seconds + again.seconds, 3)
    if again.fetched:
        filled.outcome = "fetched"
    outcome = from_node()  # what the node still holds may serve (a family tag)
    if not again.fetched and not outcome.cache_hit:
        raise StoreError(again.error or "the registry had nothing to repair the node store with")
    return outcome


def _fill(
    node: LayoutStore,
    request: RestoreRequest,
    lookup: Lookup,
    *,
    on_event: EventSink,
    refresh: bool = False,
    pins: Mapping[str, str] | None = None,
) -> FillResult:
    """Fill the node store from the request's registry (nothing when it cannot be opened)."""
    # lazy: the node store's modules load only with --node-store, not on a plain no-op restore
    from artifactd.restore.nodefill import fill  # noqa: PLC0415

    assert request.store is not None  # noqa: S101 - _via_node_store set it
    try:
        remote = open_store(
            request.store,
            insecure=request.insecure,
            mirrors=_mirror_settings(request, request.store),
            pins=pins,
        )
    except (UsageError, ConfigError):
        raise
    except ArtifactdError:
        # Unreachable: the node store serves what it has.
        return fill(node, None, lookup, on_event=on_event)
    with remote:
        return fill(
            node,
            remote,
            lookup,
            on_event=on_event,
            signatures=bool(request.verify_keys),  # a verifying restore needs the signatures too
            refresh=refresh,
        )


def _damaged(outcome: RestoreOutcome) -> bool:
    """Whether a restore from the node store failed on its copy: bytes, or a re-pointed tag."""
    if outcome.plan.unbound:
        return True
    failure = outcome.failure
    return failure is not None and isinstance(failure.error, (IntegrityError, NotFoundError))


def _set_aside(
    node: LayoutStore, damaged: RestoreOutcome, lookup: Lookup, on_event: EventSink
) -> list[str]:
    """Drop from the node store what the failed restore read: damaged copies, re-pointed tags."""
    # lazy: the node store's modules load only with --node-store, not on a plain no-op restore
    from artifactd.restore.nodefill import restore_tags  # noqa: PLC0415
    from artifactd.stores.nodestore import set_aside  # noqa: PLC0415

    # A tag re-pointed on the node is dropped whole; the fill copies the registry's.
    dropped = node.remove_tags(list(damaged.plan.unbound))
    dropped += set_aside(node, restore_tags(lookup))
    failure = damaged.failure
    why = failure.message if failure else "; ".join(damaged.plan.unbound.values())
    on_event({"stage": "node-store", "event": "set_aside", "tags": dropped, "error": why[:200]})
    return dropped


def _run(
    request: RestoreRequest,
    raw_fingerprint: dict[str, Any],
    *,
    on_event: EventSink,
    step_hook: StepHook,
) -> RestoreOutcome:
    """:func:`run_restore` once the fingerprint is final."""
    started = time.monotonic()
    fp_hash = raw_hash(raw_fingerprint)
    request = _with_source(request, fp_hash)
    kwargs: dict[str, Any] = {"env_file": request.env_file, "step_hook": step_hook}
    if request.lock_timeout is not None:
        kwargs["lock_timeout"] = request.lock_timeout
    volume = CacheVolume(request.target, **kwargs)
    fams = list(request.families) if request.families else None
    plan: RestorePlan | None = None
    prediction: Prediction | None = None
    trusted = None
    if request.verify_keys:
        # lazy: only --verify-key reads keys; a plain no-op restore does not load trust
        from artifactd.trust.keys import verification_key_ids  # noqa: PLC0415

        trusted = verification_key_ids(request.verify_keys)  # PEM only: a no-op stays light
    try:
        try:
            store = _open_source(request, fp_hash)
        except (UsageError, ConfigError):
            raise
        except ArtifactdError as exc:
            plan = _unresolved(request, raw_fingerprint, volume, exc)
            return _failed(plan, exc, request.require)
        with store:
            flat = flatten(hashed_view(raw_fingerprint))
            quick = noop_plan(store, fp_hash, flat, volume, families=fams, trusted=trusted)
            if quick is not None:
                if not request.dry_run:
                    volume.tidy()  # a restore killed after its commit left the old trees
                    on_event({"stage": "restore", "event": "noop", "target": quick.target})
                status: Status = "dry_run" if request.dry_run else "noop"
                return _predicted(RestoreOutcome(status, quick, None, None, 0), request, on_event)
            plan = _plan(store, raw_fingerprint, volume, request)
            lookup = round(time.monotonic() - started, 4)
            if plan.error is not None:  # the store became unreachable while resolving
                return _failed(plan, StoreError(plan.error), request.require)
            stop = _before_install(plan, request, on_event)
            prediction = stop.prediction
            if stop.status != "restored":
                return stop
            # lazy: fast path: LATER in artifactd/cli/fast.py, never loaded by a no-op restore
            from artifactd.restore.install import restore  # noqa: PLC0415

            result = restore(plan, store, volume, on_event=on_event, max_bytes=request.max_bytes)
            result = result._replace(phases={"lookup": lookup, **result.phases})
    except (UsageError, ConfigError):
        raise
    except Exception as exc:  # the fail-open policy: nothing escapes as a crash
        if plan is None:
            plan = _unresolved(request, raw_fingerprint, volume, exc)
        return _failed(plan, exc, request.require)._replace(prediction=prediction)
    status = "noop" if result.noop else "restored"
    return RestoreOutcome(status, plan, result, None, 0, prediction=prediction)


def _before_install(
    plan: RestorePlan, request: RestoreRequest, on_event: EventSink
) -> RestoreOutcome:
    """Decide what a resolved plan comes to before any fetch; ``restored``: go on and install.

    With ``--predict`` the prediction is made here, from the plan (the
    artifact's config), before any layer is fetched; ``--require-hit`` stops
    a restore whose engine will not hit.
    """
    ahead = _predicted(RestoreOutcome("restored", plan, None, None, 0), request, on_event)
    if ahead.failure is not None:
        return ahead
    if request.dry_run:
        return ahead._replace(status="dry_run")
    if not plan.hits or (plan.unbound and request.require):
        return _miss(plan, request.require)._replace(prediction=ahead.prediction)
    return ahead


def _predicted(
    outcome: RestoreOutcome, request: RestoreRequest, on_event: EventSink
) -> RestoreOutcome:
    """Return ``outcome`` with the engine's hit predicted from its plan (with ``--predict``).

    Under ``--require-hit`` a prediction other than a hit refuses: nothing is
    (or was newly) installed, and the exit code is 17.
    """
    if request.predict is None:
        return outcome
    # lazy: only --predict loads the prediction (and the engine's side of it)
    from artifactd.restore.predict import miss_error, predict_restore  # noqa: PLC0415

    prediction = predict_restore(outcome.plan, request.predict.inputs, events=on_event)
    if request.predict.require_hit and prediction.outcome != "hit":
        failure = failure_of(miss_error(prediction))
        return RestoreOutcome(
            "failed", outcome.plan, None, failure, failure.exit_code, prediction=prediction
        )
    return outcome._replace(prediction=prediction)


def _mirror_settings(request: RestoreRequest, ref: str | None = None) -> MirrorSettings | None:
    """Where every pull of this restore finds its mirrors (None for a local layout ``ref``).

    A layout has no mirrors: the no-op restore from one loads nothing of them.
    """
    if ref is not None and ref.startswith("oci:"):
        return None
    # lazy: fast path: LATER in artifactd/cli/fast.py, never loaded by a no-op restore
    from artifactd.stores.mirrors import MirrorSettings  # noqa: PLC0415

    return MirrorSettings.from_environ(
        urls=request.mirrors,
        hosts_dir=None if request.hosts_dir is None else os.fspath(request.hosts_dir),
        registries_conf=None
        if request.registries_conf is None
        else os.fspath(request.registries_conf),
    )


def _adopt_software(raw: dict[str, Any], request: RestoreRequest) -> dict[str, Any]:
    """Return ``raw`` with the software fields of the artifact ``software_from`` names."""
    # lazy: fast path: LATER in artifactd/cli/fast.py, never loaded by a no-op restore
    from artifactd.stores.artifacts import adopt_software_from  # noqa: PLC0415

    assert request.software_from is not None  # noqa: S101 - the caller checked
    return adopt_software_from(
        raw,
        request.software_from,
        store=request.store,
        verify_keys=request.verify_keys,
        insecure=request.insecure,
        mirrors=_mirror_settings(request, request.software_from),
    )


def local_fingerprint(raw: dict[str, Any]) -> FingerprintView:
    """Return this machine's fingerprint from its probe: read light, else by the model.

    The light reader (:func:`artifactd.format.light.fingerprint_of`) accepts
    what the model accepts with the same values; anything else (a ``--set``
    value the model converts, or refuses with its message) goes to
    :func:`artifactd.fingerprint.model.from_raw`.
    """
    # lazy: fast path: LATER in artifactd/cli/fast.py, never loaded by a no-op restore
    from artifactd.format.light import fingerprint_of  # noqa: PLC0415

    found = fingerprint_of(raw)
    if found is not None:
        return found
    # lazy: pydantic loads only for a probe the light reader leaves to it
    from artifactd.fingerprint.model import from_raw  # noqa: PLC0415

    return from_raw(raw)


def _with_source(request: RestoreRequest, fp_hash: str) -> RestoreRequest:
    """Check the request names one source at most; fill in the default store when it names none."""
    if request.from_dir is not None and request.store is not None:
        raise UsageError(
            "--from-dir and --store name two sources to restore from",
            hint="pass one of them",
        )
    if request.store is None and request.from_dir is None:
        return request._replace(store=default_store(fp_hash))
    return request


def _plan(
    store: RestoreSource, raw: dict[str, Any], volume: CacheVolume, request: RestoreRequest
) -> RestorePlan:
    """Resolve the request against its source (:func:`artifactd.restore.resolve.plan_restore`)."""
    fams = list(request.families) if request.families else None
    local = local_fingerprint(raw)
    options: dict[str, Any] = {
        "families": fams,
        "consumer_user": request.consumer_user,
        "env_file": volume.env_path,
    }
    # lazy: fast path: LATER in artifactd/cli/fast.py, never loaded by a no-op restore
    from artifactd.trust.policy import verification  # noqa: PLC0415

    trust = verification(request.verify_keys)  # UNSAFE_NO_VERIFICATION when no key is given
    return plan_restore(store, local, volume.root_dir, trust=trust, **options)


def _open_source(request: RestoreRequest, fp_hash: str) -> RestoreSource:
    """Open the source the request names: its store, or what its ``from_dir`` holds."""
    ref = request.store
    if request.from_dir is not None:
        # lazy: fast path: LATER in artifactd/cli/fast.py, never loaded by a no-op restore
        from artifactd.restore.mounted import open_dir  # noqa: PLC0415

        found = open_dir(as_path(request.from_dir), fp_hash)
        if not isinstance(found, str):
            return found
        ref = found
    assert ref is not None  # noqa: S101 - run_restore set the default
    pins: dict[str, str] = {}
    if "@sha256:" in ref and not ref.startswith("oci:"):
        # A pinned artifact: its tag is still asked of the registry; the pin answers
        # only when the registry cannot (down), and is bound like any artifact.
        # lazy: only a pinned registry store reads it (format.oci is LIGHT anyway)
        from artifactd.format.oci import check_digest  # noqa: PLC0415

        ref, _, digest = ref.partition("@")
        pins[whole_want(fp_hash).tag] = check_digest(digest)
    if request.node_trees is not None:
        # lazy: the node store's modules load only with --node-store, not on a plain no-op restore
        from artifactd.restore.nodefill import NodeSource  # noqa: PLC0415

        node = LayoutStore(request.node_trees, ref=ref)
        return NodeSource(node, refused=request.refused, linking=request.node_link)
    store = open_store(
        ref, insecure=request.insecure, mirrors=_mirror_settings(request, ref), pins=pins
    )
    return StoreSource(store, refused=request.refused)


def _unresolved(
    request: RestoreRequest, raw: dict[str, Any], volume: CacheVolume, exc: BaseException
) -> RestorePlan:
    # lazy: fast path: LATER in artifactd/cli/fast.py, never loaded by a no-op restore
    from artifactd.trust.policy import UNSAFE_NO_VERIFICATION  # noqa: PLC0415

    return plan_restore(
        None,
        local_fingerprint(raw),
        volume.root_dir,
        # No source, nothing resolved, nothing to verify: every family is a miss.
        trust=UNSAFE_NO_VERIFICATION,
        families=list(request.families) if request.families else None,
        consumer_user=request.consumer_user,
        env_file=volume.env_path,
        store_ref=request.store or f"dir:{request.from_dir}",
        store_error=failure_of(exc).message,
    )


def _failed(plan: RestorePlan, exc: BaseException, require: bool) -> RestoreOutcome:
    failure = failure_of(exc)
    plan = plan._replace(error=failure.message)
    return RestoreOutcome("failed", plan, None, failure, failure.exit_code if require else 0)


def _unbound_error(plan: RestorePlan) -> UnboundError:
    """Return the failure of a ``--require`` restore that met an artifact tagged for another."""
    reasons = list(plan.unbound.values())
    more = f" (and {len(reasons) - 1} more)" if len(reasons) > 1 else ""
    return UnboundError(
        f"{reasons[0]}{more}; nothing installed",
        hint="the store's tag names an artifact built for another machine or model: re-tag "
        "or re-publish it from CI (`artifactd inspect STORE:TAG` shows what it was built for)",
    )


def _miss(plan: RestorePlan, require: bool) -> RestoreOutcome:
    """Return the outcome of a plan with nothing to install, or one ``--require`` refuses.

    Under ``--require`` a plan that passed over an artifact tagged for
    something else fails as corrupt, even when other families hit: the
    tag is evidence of tampering or a publishing mistake.
    """
    if require and plan.unbound:
        return _failed(plan, _unbound_error(plan), True)
    if not require:
        return RestoreOutcome("miss", plan, None, None, 0)
    exc = CacheMissError(
        f"no artifact in {plan.store} matches this machine",
        hint="see the per-family reasons above; `artifactd diff` explains field by field",
    )
    return RestoreOutcome("miss", plan, None, failure_of(exc), exc.exit_code)
