"""Verify: the correctness gate between a build and its promotion.

A restored cache is only worth promoting when the engine, running on it,
computes what it computed when the cache was built, and compiles nothing.
:func:`verify` resolves the artifact for this machine's fingerprint (the
one ``build`` publishes:
:func:`artifactd.build.published.published_fingerprint`), then, for every cell
of the matrix (packed onto the node's GPUs as a build packs them):

1. restores the artifact into fresh roots of the cell's own, as a pod would;
2. runs the cell against them (its command, or its engine and requests);
3. compares the checks the cell prints (``{"checks": {NAME: value}}``; for a
   serve cell, the digest of its responses) with those the build recorded in
   the artifact's config: strings and booleans exactly, numbers within the
   matrix's ``check_tolerance``, relative to the larger magnitude;
4. replays the canary the build recorded for a serve cell
   (:mod:`artifactd.pod.canary`) on the cell's engine: any difference (other
   tokens, NaN, other logprobs, or only a tolerance check possible) fails the
   gate, naming the prompt and the first differing token;
5. judges, per family, whether the cell used the restored caches or compiled
   anyway (:func:`judge_cell`): exactly the verdict ``artifactd status`` gives
   on that tree with the cell's output as the engine log, decided by
   :mod:`artifactd.pod.verdict` (the one owner of the rule: files written since
   the restore, what the family leaves out of a harvest and its load rewrites
   not counted).

The gate passes only if every check matches, every canary replays exactly,
and every family is ``used``, or
``not restored`` because the artifact lacks it and the cell wrote nothing
into its dirs (:func:`family_failures`). With
``promote``, the artifact's manifest is tagged with that tag only then, so a
CI step can gate promotion on it.
"""

from __future__ import annotations

import math
import shutil
import tempfile
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from artifactd.build.matrix import expand, load_matrix
from artifactd.build.published import published_fingerprint
from artifactd.build.run import CellResult, cell_environ, run_cell, run_serve_cell
from artifactd.build.schedule import node_devices, run_packed
from artifactd.constants import CUDA_VISIBLE_DEVICES, current_environ
from artifactd.errors import VerifyError
from artifactd.events import EventSink, discard
from artifactd.families import select_families
from artifactd.format.oci import MANIFEST_MEDIA_TYPE
from artifactd.pod.status import target_status
from artifactd.pod.verdict import not_restored, restore_time, wait_past, written_files
from artifactd.restore.destination import CacheVolume
from artifactd.restore.install import restore
from artifactd.restore.resolve import plan_restore, unbound, whole_want
from artifactd.restore.source import StoreSource
from artifactd.stores.artifacts import read_artifact
from artifactd.trust.policy import checked_basis
from artifactd.trust.provenance import statement
from artifactd.trust.signatures import attest, store_identity

if TYPE_CHECKING:
    from artifactd.build.matrix import Cell, Matrix
    from artifactd.families import Family
    from artifactd.fingerprint.model import Fingerprint
    from artifactd.format.canary import Canary
    from artifactd.pod.canary import CanaryResult
    from artifactd.pod.verdict import FamilyVerdict
    from artifactd.stores import Store
    from artifactd.trust.keys import PrivateKey
    from artifactd.trust.policy import Basis


@dataclass(frozen=True)
class CheckResult:
    """One check of one cell: what the build recorded, what the verify run printed."""

    name: str
    expected: Any
    got: Any
    ok: bool


@dataclass
class CellVerified:
    """One cell re-run on the restored caches."""

    id: str
    checks: list[CheckResult]
    #: Per family: files the cell wrote into the restored roots since the restore.
    compiled: dict[str, int]
    seconds: float
    log: str
    #: Per family: its verdict on the cell's roots (``used``, ``compiled anyway``...).
    verdicts: dict[str, str] = field(default_factory=dict)
    #: Why a family fails the gate, one line each (:func:`family_failures`).
    family_failures: list[str] = field(default_factory=list)
    #: The replay of the canary the build recorded for this cell (None: it recorded none).
    canary: CanaryResult | None = None

    @property
    def canary_failure(self) -> str | None:
        """Why the canary fails the gate: any difference from the recording, drift included."""
        if self.canary is None or (self.canary.outcome == "verified" and self.canary.why is None):
            return None
        if self.canary.outcome == "verified":  # a tolerance check passed: the gate wants equality
            return f"{self.id}: canary not replayed exactly: {self.canary.why}"
        return f"{self.id}: canary {self.canary.outcome}: {self.canary.why}"

    @property
    def passed(self) -> bool:
        """Whether every check matched, the canary replayed exactly and no family failed."""
        return (
            all(c.ok for c in self.checks)
            and not self.family_failures
            and self.canary_failure is None
        )


@dataclass
class VerifyResult:
    """The gate's verdict over every cell."""

    store: str
    digest: str
    fingerprint_hash: str
    cells: list[CellVerified]
    passed: bool
    seconds: float
    promoted: str | None = None
    tolerance: float = 0.0
    failures: list[str] = field(default_factory=list)
    #: The attestation layer ``--sign-key`` attached (the provenance with this verdict).
    attestation: str | None = None


def same(expected: Any, got: Any, tolerance: float) -> bool:
    """Compare one check: strings and booleans exactly, numbers within ``tolerance`` (relative)."""
    if isinstance(expected, bool) or isinstance(got, bool):
        return expected is got
    if isinstance(expected, (int, float)) and isinstance(got, (int, float)):
        if not (math.isfinite(expected) and math.isfinite(got)):
            return expected == got
        return abs(expected - got) <= tolerance * max(abs(expected), abs(got))
    return isinstance(expected, str) and isinstance(got, str) and expected == got


def compare_checks(
    expected: Mapping[str, Any], got: Mapping[str, Any], tolerance: float
) -> list[CheckResult]:
    """Every check either side has, compared; one side missing a check is a mismatch."""
    return [
        CheckResult(
            name,
            expected.get(name),
            got.get(name),
            name in expected and name in got and same(expected[name], got[name], tolerance),
        )
        for name in sorted(set(expected) | set(got))
    ]


def judge_cell(
    target: Path, families: Sequence[Family], log: Path | None = None
) -> dict[str, FamilyVerdict]:
    """Return, per family, the verdict on a cell's restored ``target`` after the cell ran.

    ``artifactd status``'s verdict on that tree (:mod:`artifactd.pod.verdict`),
    with ``log`` (the cell's output) as the engine log. A family the restore
    missed stays ``not restored``, with the files the cell wrote under its
    dirs since the restore counted by the same rule.
    """
    status = target_status(target, engine_log=log)
    volume = CacheVolume(target)
    cutoff = None
    if status.restored_at is not None:
        cutoff = restore_time(volume.marker_path, status.restored_at)
    elif (marker := volume.read_marker()) is not None:
        cutoff = restore_time(volume.marker_path, marker["restored_at"])
    judged: dict[str, FamilyVerdict] = {f.family: f for f in status.families}
    out: dict[str, FamilyVerdict] = {}
    for fam in families:
        verdict: FamilyVerdict | None = judged.get(fam.name)
        if verdict is None or (verdict.verdict == "not restored" and cutoff is not None):
            dirs = {c: str(p) for c, p in fam.restore_dirs(target).items()}
            written = written_files(fam, dirs, cutoff) if cutoff is not None else []
            why = verdict.why if verdict is not None else "not in the restore marker"
            verdict = not_restored(
                fam.name, why, None if verdict is None else verdict.engine, written
            )
        out[fam.name] = verdict
    return out


def family_failures(
    cell_id: str, verdicts: Mapping[str, FamilyVerdict], installed: Collection[str]
) -> list[str]:
    """One line per family that fails the gate: compiled anyway, or lost or filled after a miss.

    ``installed`` names the families the cell's restore installed: one of them
    ``not restored`` after the run lost its restored dirs; one the artifact
    lacks fails only if the cell wrote into its dirs (the artifact is all a pod
    would get).
    """
    lines = []
    for name, v in sorted(verdicts.items()):
        if v.verdict == "compiled anyway":
            lines.append(f"{cell_id}: {name} compiled anyway: {v.why}")
        elif v.verdict == "not restored" and name in installed:
            lines.append(f"{cell_id}: {name} is no longer restored after the run: {v.why}")
        elif v.verdict == "not restored" and v.files_written:
            lines.append(
                f"{cell_id}: {name} is not in the artifact, and the cell compiled "
                f"{v.files_written} file(s) into its dirs"
            )
    return lines


def verify(
    matrix_path: Path,
    store: Store,
    setup: GateSetup,
    *,
    gpus: Sequence[str] | None = None,
    jobs: int = 1,
    promote: str | None = None,
    keep_roots: Path | None = None,
    sign_key: PrivateKey | None = None,
) -> VerifyResult:
    """Restore, re-run every cell, compare (see the module doc); tag ``promote`` if it passes.

    With ``sign_key``, the artifact's provenance is attested again with the
    gate's verdict in it (passed or not), before any promotion. Raises
    :class:`VerifyError` when the store holds no artifact for this
    fingerprint, and, under a :class:`~artifactd.trust.policy.TrustPolicy`,
    :class:`~artifactd.errors.TrustError` before any cell runs when no key of
    the policy signed it (each cell's restore verifies it again); a gate that
    ran and failed is a result with ``passed`` false.
    """
    pre = preamble(matrix_path, setup)
    matrix, fingerprint = pre.matrix, pre.fingerprint
    tag = whole_want(fingerprint.hash).tag
    art = read_artifact(store, tag, trust=pre.trust)
    if art is not None:
        # The gate promotes what the tag names: only if it is for this fingerprint.
        why = unbound(tag, art.config.kind, art.config.fingerprint_hash, fingerprint.hash)
        if why is not None:
            raise VerifyError(why, hint="re-publish it with `artifactd build` or `merge`")
    if art is None:
        raise VerifyError(
            f"{store.ref} has no artifact for this machine's fingerprint "
            f"{fingerprint.hash[:12]}... (fp-{fingerprint.hash})",
            hint="build (or merge) it first, on the same image and target; "
            "`artifactd diff` compares two fingerprints",
        )
    roots = keep_roots or Path(tempfile.mkdtemp(prefix=f"artifactd-verify-{matrix.name}-"))
    try:
        ctx = pre.context(
            store,
            roots,
            art.config.provenance.checks,
            canaries={c.cell: c for c in art.config.canaries},
        )
        results = run_cells(ctx, pre.cells, gpus=gpus, jobs=jobs)
    finally:
        if keep_roots is None:
            shutil.rmtree(roots, ignore_errors=True)
    failures = gate_failures(results)
    passed = not failures
    promoted = None
    attestation = None
    if sign_key is not None:
        verdict = {
            "passed": passed,
            "cells": len(results),
            "tolerance": matrix.check_tolerance,
            "failures": failures,
            "compiled_anyway": {c.id: c.compiled for c in results if c.family_failures},
        }
        doc = statement(
            store_identity(store), art.digest, art.config, matrix=matrix_path, verify=verdict
        )
        attestation = attest(store, art.digest, doc, sign_key)
    if passed and promote:
        tag_manifest(store, art.digest, promote)
        promoted = promote
        pre.on_event({"stage": "verify", "event": "promoted", "tag": promote})
    return VerifyResult(
        store=store.ref,
        digest=art.digest,
        fingerprint_hash=fingerprint.hash,
        cells=results,
        passed=passed,
        seconds=round(time.monotonic() - pre.started, 3),
        promoted=promoted,
        tolerance=matrix.check_tolerance,
        failures=failures,
        attestation=attestation,
    )


def run_cells(
    ctx: Context, cells: Sequence[Cell], *, gpus: Sequence[str] | None, jobs: int
) -> list[CellVerified]:
    """Restore ``ctx.store``'s artifact for the fingerprint per cell, run each, judge each.

    Each cell's roots are ``ctx.roots/cells/<cell id>`` (left in place: the
    caller removes them); packed onto the node's GPUs as a build packs them.
    """
    ctx.roots.mkdir(parents=True, exist_ok=True)

    def run_one(cell: Cell, taken: tuple[str, ...]) -> CellVerified:
        return _verify_cell(cell, taken, ctx)

    devices = list(gpus) if gpus is not None else node_devices(ctx.base)
    return run_packed(list(cells), devices, run_one, jobs=jobs, on_event=ctx.on_event)


def gate_failures(results: Sequence[CellVerified]) -> list[str]:
    """Return one line per check that differs, per canary and per family that fails the gate."""
    return (
        [
            f"{c.id}: check {r.name}: expected {r.expected!r}, got {r.got!r}"
            for c in results
            for r in c.checks
            if not r.ok
        ]
        + [line for c in results if (line := c.canary_failure) is not None]
        + [line for c in results for line in c.family_failures]
    )


def tag_manifest(store: Store, digest: str, tag: str) -> None:
    """Point ``tag`` at the manifest ``digest`` (already in the store)."""
    ref = store.get_manifest(digest)
    if ref is None:  # pragma: no cover - read a moment ago
        raise VerifyError(f"{store.ref} lost {digest} during verify")
    store.put_manifest(ref.data, ref.media_type or MANIFEST_MEDIA_TYPE, [tag])


class GateSetup(NamedTuple):
    """What a gate runs for, ``verify`` and ``verify --candidate`` alike (:func:`preamble`)."""

    #: What the artifacts read and every cell's restore verify under:
    #: a :class:`~artifactd.trust.policy.TrustPolicy` or ``UNSAFE_NO_VERIFICATION``.
    trust: Basis
    #: The target to declare instead of probing (``sm_90a``), and the base image digest.
    gpu_arch: str | None = None
    image_digest: str | None = None
    #: ``--set`` overrides of the matrix's fingerprint fields.
    overrides: Sequence[str] = ()
    #: The environment the cells run in; None for this process's.
    environ: Mapping[str, str] | None = None
    on_event: EventSink = discard


@dataclass(frozen=True)
class Preamble:
    """What ``verify`` and ``verify --candidate`` set up before reading any artifact.

    :func:`preamble` builds it, once for either: the matrix and its cells, the
    environment the cells run in, the fingerprint the artifact is looked up
    by (the one ``build`` publishes), and what every cell's restore verifies
    under.
    """

    matrix: Matrix
    cells: list[Cell]
    environ: Mapping[str, str]
    fingerprint: Fingerprint
    trust: Basis
    on_event: EventSink
    started: float

    def context(
        self,
        store: Store,
        roots: Path,
        recorded: Mapping[str, Mapping[str, Any]],
        *,
        trust: Basis | None = None,
        canaries: Mapping[str, Canary] | None = None,
    ) -> Context:
        """Return the context of one pass of cells: restoring from ``store`` into ``roots``.

        ``trust`` replaces the run's own basis for a store this process
        filled itself (the candidate's scratch layout); ``canaries`` are the
        artifact's, per serve cell id, replayed on the re-run.
        """
        basis = self.trust if trust is None else trust
        return Context(
            store,
            self.fingerprint,
            self.matrix,
            roots,
            self.environ,
            recorded,
            self.on_event,
            basis,
            dict(canaries or {}),
        )


def preamble(matrix_path: Path, setup: GateSetup) -> Preamble:
    """Load and expand the matrix and compute its published fingerprint: every gate's first step.

    Raises what loading the matrix raises (:class:`~artifactd.errors.ConfigError`)
    and :class:`TypeError` for a ``setup.trust`` that is not a basis (``None``).
    """
    started = time.monotonic()
    trust = checked_basis(setup.trust, "verify")
    matrix = load_matrix(matrix_path)
    cells = expand(matrix, matrix_path)
    base = current_environ() if setup.environ is None else setup.environ
    fingerprint = published_fingerprint(
        matrix,
        gpu_arch=setup.gpu_arch,
        image_digest=setup.image_digest,
        overrides=setup.overrides,
        environ=base,
    )
    return Preamble(matrix, cells, base, fingerprint, trust, setup.on_event, started)


@dataclass(frozen=True)
class Context:
    """What every cell of one verify run shares."""

    store: Store
    fingerprint: Fingerprint
    matrix: Matrix
    roots: Path
    base: Mapping[str, str]
    recorded: Mapping[str, Mapping[str, Any]]
    on_event: EventSink
    #: What each cell's restore verifies under.
    trust: Basis
    #: The canary the artifact carries, per serve cell id: replayed on the re-run.
    canaries: Mapping[str, Canary] = field(default_factory=dict)


def _verify_cell(cell: Cell, taken: tuple[str, ...], ctx: Context) -> CellVerified:
    """Restore into the cell's own fresh roots, run it there, count and compare."""
    matrix = ctx.matrix
    target = ctx.roots / "cells" / cell.id
    plan = plan_restore(
        StoreSource(ctx.store),
        ctx.fingerprint,
        target,
        trust=ctx.trust,
        families=matrix.families or None,
    )
    restore(plan, StoreSource(ctx.store))
    families = select_families(matrix.families or None)
    installed = {f.family for f in plan.families if f.verdict == "hit"}
    volume = CacheVolume(target)
    if (marker := volume.read_marker()) is not None:
        # Whatever the cell writes must be later than the restore, to the file clock.
        wait_past(volume.state, restore_time(volume.marker_path, marker["restored_at"]))
    env = cell_environ(target, matrix.families, matrix.env, ctx.base)
    env[CUDA_VISIBLE_DEVICES] = ",".join(taken)
    log = target / ".artifactd" / "verify-cell.log"
    res: CellResult
    if cell.serve is not None:
        res = run_serve_cell(cell, env, log, ctx.on_event, ctx.canaries.get(cell.id))
    else:
        res = run_cell(cell, env, matrix.timeout_s, log)
    verdicts = judge_cell(target, families, log if log.is_file() else None)
    checks = compare_checks(ctx.recorded.get(cell.id, {}), res.checks, matrix.check_tolerance)
    return CellVerified(
        cell.id,
        checks,
        {name: v.files_written for name, v in verdicts.items()},
        res.seconds,
        res.log,
        {name: v.verdict for name, v in verdicts.items()},
        family_failures(cell.id, verdicts, installed),
        res.canary_replay,
    )
