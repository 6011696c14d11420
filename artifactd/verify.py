"""Verify: the correctness gate between a build and its promotion.

A restored cache is only worth promoting when the engine, running on it,
computes what it computed when the cache was built, and compiles nothing.
:func:`verify` resolves the artifact for this machine's fingerprint (the
matrix's target and workload, as ``build`` probes them), then, for every cell
of the matrix (packed onto the node's GPUs as a build packs them):

1. restores the artifact into fresh roots of the cell's own, as a pod would;
2. runs the cell against them (its command, or its engine and requests);
3. compares the checks the cell prints (``{"checks": {NAME: value}}``; for a
   serve cell, the digest of its responses) with those the build recorded in
   the artifact's config: strings and booleans exactly, numbers within the
   matrix's ``check_tolerance``, relative to the larger magnitude;
4. counts, per family, the files the cell wrote into the restored roots
   anyway: new files, or files whose size or mtime changed. What the family
   itself leaves out of a harvest (lock files, temp and staging dirs) does
   not count.

The gate passes only if every check matches and nothing was compiled. With
``promote``, the artifact's manifest is tagged with that tag only then, so a
CI step can gate promotion on it.
"""

from __future__ import annotations

import math
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from artifactd.errors import VerifyError
from artifactd.events import EventSink, discard
from artifactd.families import select_families

if TYPE_CHECKING:
    from artifactd.families import Family
    from artifactd.fingerprint import Fingerprint
    from artifactd.keys import PrivateKey
    from artifactd.matrix import Cell, Matrix
    from artifactd.stores import Store


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
    #: Per family: files the cell wrote into the restored roots (compiled anyway).
    compiled: dict[str, int]
    seconds: float
    log: str

    @property
    def passed(self) -> bool:
        """Whether every check matched and nothing was compiled."""
        return all(c.ok for c in self.checks) and not any(self.compiled.values())


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


def snapshot(family: Family, root: Path) -> dict[str, tuple[int, int]]:
    """Every file the harvest would see under the family's dirs: path -> (size, mtime_ns)."""
    from artifactd.families.tree import walk_component

    seen: dict[str, tuple[int, int]] = {}
    for comp, path in family.restore_dirs(root).items():
        for entry in walk_component(family, comp, Path(path)):
            if entry.skip is None and not entry.is_dir:
                seen[f"{comp}/{entry.rel}"] = (entry.st.st_size, entry.st.st_mtime_ns)
    return seen


def verify(
    matrix_path: Path,
    store: Store,
    *,
    gpu_arch: str | None = None,
    image_digest: str | None = None,
    overrides: Sequence[str] = (),
    gpus: Sequence[str] | None = None,
    jobs: int = 1,
    promote: str | None = None,
    environ: Mapping[str, str] | None = None,
    keep_roots: Path | None = None,
    on_event: EventSink = discard,
    sign_key: PrivateKey | None = None,
) -> VerifyResult:
    """Restore, re-run every cell, compare (see the module doc); tag ``promote`` if it passes.

    With ``sign_key``, the artifact's provenance is attested again with the
    gate's verdict in it (passed or not), before any promotion. Raises
    :class:`VerifyError` when the store holds no artifact for this
    fingerprint; a gate that ran and failed is a result with ``passed`` false.
    """
    from artifactd.artifacts import read_artifact
    from artifactd.constants import current_environ
    from artifactd.fingerprint import probe
    from artifactd.matrix import expand, load_matrix
    from artifactd.resolve import unbound, whole_want
    from artifactd.schedule import node_devices, run_packed

    start = time.monotonic()
    matrix = load_matrix(matrix_path)
    cells = expand(matrix, matrix_path)
    base = current_environ() if environ is None else environ
    fingerprint = probe(
        gpu_arch=gpu_arch or matrix.target.gpu_arch,
        image_digest=image_digest or matrix.base_image,
        workload=matrix.workload,
        environ=base,
        overrides=overrides,
    )
    tag = whole_want(fingerprint.hash).tag
    art = read_artifact(store, tag)
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
    recorded = art.config.provenance.checks
    roots = keep_roots or Path(tempfile.mkdtemp(prefix=f"artifactd-verify-{matrix.name}-"))
    roots.mkdir(parents=True, exist_ok=True)

    def run_one(cell: Cell, taken: tuple[str, ...]) -> CellVerified:
        return _verify_cell(
            cell,
            taken,
            _Context(store, fingerprint, matrix, roots, base, recorded, on_event),
        )

    try:
        devices = list(gpus) if gpus is not None else node_devices(base)
        results = run_packed(cells, devices, run_one, jobs=jobs, on_event=on_event)
    finally:
        if keep_roots is None:
            shutil.rmtree(roots, ignore_errors=True)
    failures = _failures(results)
    passed = not failures
    promoted = None
    attestation = None
    if sign_key is not None:
        from artifactd.provenance import statement
        from artifactd.trust import attest, store_identity

        verdict = {
            "passed": passed,
            "cells": len(results),
            "tolerance": matrix.check_tolerance,
            "failures": failures,
            "compiled_anyway": {c.id: c.compiled for c in results if any(c.compiled.values())},
        }
        doc = statement(
            store_identity(store), art.digest, art.config, matrix=matrix_path, verify=verdict
        )
        attestation = attest(store, art.digest, doc, sign_key)
    if passed and promote:
        _tag(store, art.digest, promote)
        promoted = promote
        on_event({"stage": "verify", "event": "promoted", "tag": promote})
    return VerifyResult(
        store=store.ref,
        digest=art.digest,
        fingerprint_hash=fingerprint.hash,
        cells=results,
        passed=passed,
        seconds=round(time.monotonic() - start, 3),
        promoted=promoted,
        tolerance=matrix.check_tolerance,
        failures=failures,
        attestation=attestation,
    )


def _failures(results: Sequence[CellVerified]) -> list[str]:
    """One line per check that differs and per family that compiled anyway."""
    return [
        f"{c.id}: check {r.name}: expected {r.expected!r}, got {r.got!r}"
        for c in results
        for r in c.checks
        if not r.ok
    ] + [
        f"{c.id}: {fam} compiled {n} file(s) anyway"
        for c in results
        for fam, n in c.compiled.items()
        if n
    ]


def _tag(store: Store, digest: str, tag: str) -> None:
    """Point ``tag`` at the manifest ``digest`` (already in the store)."""
    from artifactd.oci import MANIFEST_MEDIA_TYPE

    ref = store.get_manifest(digest)
    if ref is None:  # pragma: no cover - read a moment ago
        raise VerifyError(f"{store.ref} lost {digest} during verify")
    store.put_manifest(ref.data, ref.media_type or MANIFEST_MEDIA_TYPE, [tag])


@dataclass(frozen=True)
class _Context:
    """What every cell of one verify run shares."""

    store: Store
    fingerprint: Fingerprint
    matrix: Matrix
    roots: Path
    base: Mapping[str, str]
    recorded: Mapping[str, Mapping[str, Any]]
    on_event: EventSink


def _verify_cell(cell: Cell, taken: tuple[str, ...], ctx: _Context) -> CellVerified:
    """Restore into the cell's own fresh roots, run it there, count and compare."""
    from artifactd.build import CellResult, cell_environ, run_cell, run_serve_cell
    from artifactd.constants import CUDA_VISIBLE_DEVICES
    from artifactd.resolve import plan_restore
    from artifactd.restore import restore

    matrix = ctx.matrix
    target = ctx.roots / "cells" / cell.id
    plan = plan_restore(ctx.store, ctx.fingerprint, target, families=matrix.families or None)
    restore(plan, ctx.store)
    families = select_families(matrix.families or None)
    before = {fam.name: snapshot(fam, target) for fam in families}
    env = cell_environ(target, matrix.families, matrix.env, ctx.base)
    env[CUDA_VISIBLE_DEVICES] = ",".join(taken)
    log = target / ".artifactd" / "verify-cell.log"
    res: CellResult
    if cell.serve is not None:
        res = run_serve_cell(cell, env, log, ctx.on_event)
    else:
        res = run_cell(cell, env, matrix.timeout_s, log)
    compiled = {}
    for fam in families:
        after = snapshot(fam, target)
        compiled[fam.name] = sum(1 for k, v in after.items() if before[fam.name].get(k) != v)
    checks = compare_checks(ctx.recorded.get(cell.id, {}), res.checks, matrix.check_tolerance)
    return CellVerified(cell.id, checks, compiled, res.seconds, res.log)
