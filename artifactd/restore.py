"""Restore: install a plan into a cache volume, and the policy around every failure.

Two entry points, shaped like an installer's ``install(source, destination)``:

* :func:`restore` is the mechanism. It takes a plan (:mod:`artifactd.resolve`),
  the store the plan's layers come from and the :class:`CacheVolume` to
  install into, and either installs every family of the plan or changes
  nothing and raises an :class:`ArtifactdError`. Under the volume's lock it
  repairs what an interrupted restore left, checks for a no-op, holds every
  layer record to the format's rules, checks the env file can be written and
  the plan fits in the free space, all before the first download; then it
  fetches and extracts every layer into staging and installs them in one
  transaction (:meth:`CacheVolume.install`).
* :func:`run_restore` is the init container's whole job and holds the
  failure policy: probe data in, a :class:`RestoreOutcome` out, never an
  exception for anything an artifact, a store or the target can do. Every
  such failure (unreachable, not found, corrupt, hostile, schema-invalid, no
  space, target not writable, and any unexpected error) leaves the target
  untouched and is reported with its class; the outcome's exit code is 0
  unless ``require`` is set, then the failure's documented code (a miss: 6;
  a tag passed over because its artifact is for something else, even when
  other families hit: 5, ``corrupt``, nothing installed).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from artifactd.destination import (
    CacheVolume,
    StepHook,
    Swap,
    check_env_text,
    no_hook,
    os_error,
    remove_tree,
)
from artifactd.errors import (
    ArtifactdError,
    CacheMissError,
    ConfigError,
    IntegrityError,
    StoreError,
    UnboundError,
    UsageError,
)
from artifactd.events import EventSink, discard
from artifactd.families import get_family
from artifactd.resolve import FamilyPlan, RestorePlan, noop_plan, plan_restore

if TYPE_CHECKING:
    from collections.abc import Callable

    from artifactd.marker import RestoreMarker
    from artifactd.nodestore import FillResult
    from artifactd.source import RestoreSource
    from artifactd.stores.layout import LayoutStore


_NO_PHASES: Mapping[str, float] = MappingProxyType({})


class RestoreResult(NamedTuple):
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
    :class:`~artifactd.source.RestoreSource` (a store, or a mounted tree), read
    only through :meth:`~artifactd.source.RestoreSource.stage_layer`.
    ``volume`` defaults to the plan's target and env file. Raises
    :class:`ArtifactdError` subclasses only: filesystem errors on the target
    become :class:`NoSpaceError` or :class:`TargetError`.
    """
    start = time.monotonic()
    if volume is None:
        volume = CacheVolume(Path(plan.target), env_file=Path(plan.env_file))

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
        raise os_error(exc, f"restoring into {volume.root}") from None
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
    from artifactd.unpack import check_layer

    t0 = time.monotonic()
    hits = plan.hits
    bounds: dict[str, int] = {}
    for fp in hits:
        assert fp.layer is not None  # noqa: S101 - a hit always carries its layer record
        known = frozenset(get_family(fp.family).restore_dirs(volume.root))
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
        Swap(fp.family, staging / fp.family / comp, Path(fp.dirs[comp]))
        for fp in hits
        for comp in (fp.layer.components if fp.layer else [])
    ]
    volume.install(staging, swaps, _marker(plan))
    phases["install"] = round(time.monotonic() - t2, 4)
    for fp in hits:
        on_event({"stage": "install", "event": "done", "family": fp.family})
    return sum(t[0] for t in totals), sum(t[1] for t in totals)


def _marker(plan: RestorePlan) -> RestoreMarker:
    from artifactd.marker import FamilyMarker, RestoreMarker

    marker = RestoreMarker(
        schema_version=1,
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
                layer=fp.layer.digest,
                scope_key=fp.layer.scope_key,
                dirs={c: fp.dirs[c] for c in fp.layer.components},
                files=fp.files,
                bytes=fp.unpacked,
            )
            for fp in plan.hits
            if fp.layer is not None
        },
        restored_at=round(time.time(), 3),
        env=dict(plan.env),
    )
    for fp in plan.hits:
        if fp.signed_by and fp.family in marker["families"]:
            marker["families"][fp.family]["signed_by"] = fp.signed_by
    return marker


def _stage_all(
    hits: list[FamilyPlan],
    source: RestoreSource,
    staging: Path,
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
            staging / fp.family,
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
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=min(workers, len(hits))) as pool:
            return list(pool.map(stage, hits))


#: How often staging is synced in the background while layers stream in.
FLUSH_EVERY_S = 0.25


class _Flusher:
    """Write staged bytes back to disk while the layers still stream in.

    The install syncs the filesystem before its commit (a marker must never
    describe files the page cache has not written); syncing every
    :data:`FLUSH_EVERY_S` while staging overlaps most of that writeback with
    the download, so the final sync has only the last moments' bytes left.
    """

    def __init__(self, staging: Path) -> None:
        import threading

        self._staging = staging
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="flush", daemon=True)

    def _run(self) -> None:
        from artifactd.fsutil import sync_filesystem

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


# --------------------------------------------------------------------------
# The policy
# --------------------------------------------------------------------------


class RestoreRequest(NamedTuple):
    """Everything the init container is told (flags or ``ARTIFACTD_*`` variables).

    ``store`` None means the default: the store baked into this image for this
    fingerprint, if there is one, else the local one (:func:`default_store`),
    unless ``from_dir`` names a directory to restore from.
    """

    store: str | None
    target: Path
    families: Sequence[str] | None = None
    #: An unpacked artifact or image to restore from instead of a store (:mod:`artifactd.trees`).
    from_dir: Path | None = None
    #: An artifact whose fingerprint gives the software fields (the init image's case).
    software_from: str | None = None
    #: ``oci:PATH`` on the node's disk: restore from it, fetching into it what it lacks.
    node_store: str | None = None
    consumer_user: str | None = None
    env_file: Path | None = None
    require: bool = False
    dry_run: bool = False
    insecure: bool = False
    max_bytes: int | None = None
    lock_timeout: float | None = None
    #: Key specs (``--verify-key``): install only manifests one of these keys signed.
    verify_keys: Sequence[str] = ()


class Failure(NamedTuple):
    """Why a restore changed nothing: the error's class, message and advice."""

    kind: str
    message: str
    hint: str | None
    exit_code: int
    error: BaseException


Status = Literal["restored", "noop", "miss", "failed", "dry_run"]


class RestoreOutcome(NamedTuple):
    """What :func:`run_restore` did, and the exit code the policy gives it."""

    status: Status
    plan: RestorePlan
    result: RestoreResult | None
    failure: Failure | None
    exit_code: int
    #: With ``--node-store``: what the node store held, and what was fetched into it.
    node: FillResult | None = None

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

    ``raw_fingerprint`` is the probe's plain document (:func:`artifactd.probing.probe_raw`),
    so a no-op answers without building a model. Raises only for the caller's
    own mistakes (:class:`UsageError`, :class:`ConfigError`);
    everything else becomes the outcome's failure.
    """
    # Checked before anything is created: each ends up in the env file.
    check_env_text(str(request.target.absolute()), "--target")
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
    from artifactd.nodestore import LOCK_TIMEOUT, node_lock, node_root
    from artifactd.probing import flatten, hashed_view, raw_hash
    from artifactd.stores.layout import LayoutStore

    assert request.node_store is not None  # noqa: S101 - the caller checked
    if request.from_dir is not None:
        raise UsageError("--from-dir and --node-store name two sources", hint="pass one of them")
    root = node_root(request.node_store)
    fp_hash = raw_hash(raw_fingerprint)
    request = _with_source(request, fp_hash)._replace(node_store=None)
    assert request.store is not None  # noqa: S101 - _with_source set the default
    timeout = request.lock_timeout if request.lock_timeout is not None else LOCK_TIMEOUT
    flat = flatten(hashed_view(raw_fingerprint))
    families = list(request.families) if request.families else None

    def fill_node(damaged: RestoreOutcome | None = None) -> FillResult:
        with node_lock(root, timeout=timeout):
            node = LayoutStore(root, create=True)
            dropped = []
            if damaged is not None:
                dropped = _set_aside(node, damaged, fp_hash, flat, families, on_event)
            result = _fill(
                node,
                request,
                fp_hash=fp_hash,
                flat=flat,
                families=families,
                on_event=on_event,
                refresh=damaged is not None,
            )
            result.set_aside = dropped
            return result

    def from_node() -> RestoreOutcome:
        with node_lock(root, shared=True, timeout=timeout):
            direct = request._replace(store=f"oci:{root}")
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
        lookup = outcome.result.phases.get("lookup", 0.0) + filled.seconds
        phases = {**outcome.result.phases, "lookup": round(lookup, 4)}
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
    *,
    fp_hash: str,
    flat: Mapping[str, Any],
    families: list[str] | None,
    on_event: EventSink,
    refresh: bool = False,
) -> FillResult:
    """Fill the node store from the request's registry (nothing when it cannot be opened)."""
    from artifactd.nodestore import fill
    from artifactd.stores import open_store

    assert request.store is not None  # noqa: S101 - _via_node_store set it
    try:
        remote = open_store(request.store, insecure=request.insecure)
    except (UsageError, ConfigError):
        raise
    except ArtifactdError:
        # Unreachable: the node store serves what it has.
        return fill(node, None, fp_hash, flat, families=families, on_event=on_event)
    with remote:
        return fill(
            node,
            remote,
            fp_hash,
            flat,
            families=families,
            on_event=on_event,
            signatures=bool(request.verify_keys),  # a verifying restore needs the signatures too
            refresh=refresh,
        )


def _damaged(outcome: RestoreOutcome) -> bool:
    """Whether a restore from the node store failed on its copy: bytes, or a re-pointed tag."""
    from artifactd.errors import NotFoundError

    if outcome.plan.unbound:
        return True
    failure = outcome.failure
    return failure is not None and isinstance(failure.error, (IntegrityError, NotFoundError))


def _set_aside(  # noqa: PLR0917 - the restore's state, passed on
    node: LayoutStore,
    damaged: RestoreOutcome,
    fp_hash: str,
    flat: Mapping[str, Any],
    families: list[str] | None,
    on_event: EventSink,
) -> list[str]:
    """Drop from the node store what the failed restore read: damaged copies, re-pointed tags."""
    from artifactd.nodestore import restore_tags, set_aside

    # A tag re-pointed on the node is dropped whole; the fill copies the registry's.
    dropped = node.remove_tags(list(damaged.plan.unbound))
    dropped += set_aside(node, restore_tags(fp_hash, flat, families))
    failure = damaged.failure
    why = failure.message if failure else "; ".join(damaged.plan.unbound.values())
    on_event({"stage": "node-store", "event": "set_aside", "tags": dropped, "error": why[:200]})
    return dropped


def _run(  # noqa: PLR0911 - one return per outcome, each with its policy
    request: RestoreRequest,
    raw_fingerprint: dict[str, Any],
    *,
    on_event: EventSink,
    step_hook: StepHook,
) -> RestoreOutcome:
    """:func:`run_restore` once the fingerprint is final."""
    from artifactd.probing import flatten, hashed_view, raw_hash

    started = time.monotonic()
    fp_hash = raw_hash(raw_fingerprint)
    request = _with_source(request, fp_hash)
    kwargs: dict[str, Any] = {"env_file": request.env_file, "step_hook": step_hook}
    if request.lock_timeout is not None:
        kwargs["lock_timeout"] = request.lock_timeout
    volume = CacheVolume(request.target, **kwargs)
    fams = list(request.families) if request.families else None
    plan: RestorePlan | None = None
    trusted = None
    if request.verify_keys:
        from artifactd.keys import verification_key_ids

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
                return RestoreOutcome(status, quick, None, None, 0)
            plan = _plan(store, raw_fingerprint, volume, request)
            lookup = round(time.monotonic() - started, 4)
            if plan.error is not None:  # the store became unreachable while resolving
                return _failed(plan, StoreError(plan.error), request.require)
            if request.dry_run:
                return RestoreOutcome("dry_run", plan, None, None, 0)
            if not plan.hits or (plan.unbound and request.require):
                return _miss(plan, request.require)
            result = restore(plan, store, volume, on_event=on_event, max_bytes=request.max_bytes)
            result = result._replace(phases={"lookup": lookup, **result.phases})
    except (UsageError, ConfigError):
        raise
    except Exception as exc:  # the fail-open policy: nothing escapes as a crash
        if plan is None:
            plan = _unresolved(request, raw_fingerprint, volume, exc)
        return _failed(plan, exc, request.require)
    status = "noop" if result.noop else "restored"
    return RestoreOutcome(status, plan, result, None, 0)


def _adopt_software(raw: dict[str, Any], request: RestoreRequest) -> dict[str, Any]:
    """Return ``raw`` with the software fields of the artifact ``software_from`` names."""
    from artifactd.artifacts import adopt_software_from

    assert request.software_from is not None  # noqa: S101 - the caller checked
    return adopt_software_from(
        raw,
        request.software_from,
        store=request.store,
        verify_keys=request.verify_keys,
        insecure=request.insecure,
    )


def _with_source(request: RestoreRequest, fp_hash: str) -> RestoreRequest:
    """Check the request names one source at most; fill in the default store when it names none."""
    from artifactd.stores import default_store

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
    """Resolve the request against its source (:func:`artifactd.resolve.plan_restore`)."""
    from artifactd.fingerprint import from_raw

    fams = list(request.families) if request.families else None
    local = from_raw(raw)
    options: dict[str, Any] = {
        "families": fams,
        "consumer_user": request.consumer_user,
        "env_file": volume.env_file,
    }
    trust = None
    if request.verify_keys:
        from artifactd.trust import TrustPolicy

        trust = TrustPolicy.from_specs(request.verify_keys)
    return plan_restore(store, local, volume.root, trust=trust, **options)


def _open_source(request: RestoreRequest, fp_hash: str) -> RestoreSource:
    """Open the source the request names: its store, or what its ``from_dir`` holds."""
    from artifactd.stores import open_store

    ref = request.store
    if request.from_dir is not None:
        from artifactd.trees import open_dir

        found = open_dir(request.from_dir, fp_hash)
        if not isinstance(found, str):
            return found
        ref = found
    assert ref is not None  # noqa: S101 - run_restore set the default
    return open_store(ref, insecure=request.insecure)


def _unresolved(
    request: RestoreRequest, raw: dict[str, Any], volume: CacheVolume, exc: BaseException
) -> RestorePlan:
    from artifactd.fingerprint import from_raw

    return plan_restore(
        None,
        from_raw(raw),
        volume.root,
        families=list(request.families) if request.families else None,
        consumer_user=request.consumer_user,
        env_file=volume.env_file,
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
