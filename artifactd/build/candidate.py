"""Gate a candidate that ``absorb`` published: only entries the gate exercised are promoted.

``artifactd verify MATRIX --store REF --candidate TAG [--promote TAG]`` runs
in two passes over the matrix's cells (:func:`artifactd.build.gate.run_cells`,
the gate's own restore, run and verdict per cell):

1. **Proof.** Every cell runs on the promoted artifact the candidate extends
   (``fp-<hash>`` must still name it). What a cell writes there since the
   restore is what it compiles: an entry the deltas contributed is *vouched
   for* when a cell wrote the same path with equal bytes (compared in the
   normalised form the layer stores, :meth:`Family.normalize` for
   path-bearing files), or a file with the same compile key
   (:meth:`Family.compile_key`: a keyed path itself, such as Inductor's
   kernels, named by a hash of what was compiled; for Inductor's
   ``fxgraph/`` and ``aotautograd/`` entries, their key directory). Every
   other contributed entry is *dropped* and listed: the gate cannot say it is
   what its path claims. (A library's own hit evidence naming
   an entry is not used yet: only a re-compile vouches.) The proof pass's
   checks are what the gate compares with: what the promoted artifact
   computes for the matrix's cells as they are now (a cell's requests may
   have changed since the build recorded its checks).
2. **Gate.** The promoted artifact plus the vouched entries (the candidate,
   repacked without the dropped ones when there are any) is published into a
   scratch layout and every cell re-runs on it exactly as ``verify`` runs
   them: checks within the matrix's tolerance, nothing compiled anyway.

Only when the gate passes, and with ``promote``, is that artifact published
into the store as the fingerprint's artifact (``fp-<hash>`` and each family's
scope tag) and tagged ``promote``; with a key, signed and attested, its
provenance naming the artifact it extends and the deltas absorbed.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from artifactd.errors import VerifyError
from artifactd.events import EventSink, discard

if TYPE_CHECKING:
    from artifactd.build.gate import VerifyResult
    from artifactd.format.archive import PackedLayer
    from artifactd.format.config import ArtifactConfig
    from artifactd.stores import Store
    from artifactd.stores.artifacts import Artifact
    from artifactd.trust.keys import PrivateKey


@dataclass
class CandidateVerified:
    """What gating a candidate did: the gate's result, and the entries vouched for or dropped."""

    candidate: str
    gate: VerifyResult
    deltas: list[str]
    #: Per family, contributed paths a cell re-compiled (equal bytes, or the same key).
    vouched: dict[str, list[str]] = field(default_factory=dict)
    #: Per family, contributed paths no cell re-compiled: left out of what is promoted.
    dropped: dict[str, list[str]] = field(default_factory=dict)


def verify_candidate(
    matrix_path: Path,
    store: Store,
    candidate: str,
    *,
    gpu_arch: str | None = None,
    image_digest: str | None = None,
    overrides: Sequence[str] = (),
    gpus: Sequence[str] | None = None,
    jobs: int = 1,
    promote: str | None = None,
    environ: Mapping[str, str] | None = None,
    on_event: EventSink = discard,
    sign_key: PrivateKey | None = None,
) -> CandidateVerified:
    """Prove, gate and (with ``promote``) promote the candidate ``candidate`` (module doc)."""
    from artifactd.build.gate import Context, VerifyResult, gate_failures, run_cells
    from artifactd.build.matrix import expand, load_matrix
    from artifactd.build.published import published_fingerprint
    from artifactd.constants import current_environ
    from artifactd.stores import open_store

    start = time.monotonic()
    matrix = load_matrix(matrix_path)
    cells = expand(matrix, matrix_path)
    env = current_environ() if environ is None else environ
    fingerprint = published_fingerprint(
        matrix, gpu_arch=gpu_arch, image_digest=image_digest, overrides=overrides, environ=env
    )
    cand, base = _read_pair(store, candidate, fingerprint.hash)
    roots = Path(tempfile.mkdtemp(prefix=f"artifactd-candidate-{matrix.name}-"))
    try:
        proof_ctx = Context(
            store,
            fingerprint,
            matrix,
            roots / "proof",
            env,
            base.config.provenance.checks,
            on_event,
        )
        proof = run_cells(proof_ctx, cells, gpus=gpus, jobs=jobs)
        evidence = _evidence(roots / "proof", cand.config)
        vouched, dropped = _vouch(cand.config, evidence)
        art, packed = _without(store, cand.config, dropped, roots / "pack")
        # What the promoted artifact computes for this matrix's cells (a cell's requests may
        # have changed since the build recorded its checks): the candidate must compute the same.
        recorded = {c.id: {r.name: r.got for r in c.checks if r.got is not None} for c in proof}
        with open_store(f"oci:{roots / 'gate-store'}", create=True) as scratch:
            gated = _publish(store, scratch, art, packed, roots / "pack")
            gate_ctx = Context(
                scratch, fingerprint, matrix, roots / "gate", env, recorded, on_event
            )
            results = run_cells(gate_ctx, cells, gpus=gpus, jobs=jobs)
        failures = gate_failures(results)
        gate = VerifyResult(
            store=store.ref,
            digest=gated,
            fingerprint_hash=fingerprint.hash,
            cells=results,
            passed=not failures,
            seconds=0.0,
            tolerance=matrix.check_tolerance,
            failures=failures,
        )
        _promote(
            store,
            art,
            packed,
            roots / "pack",
            gate,
            promote=promote,
            sign_key=sign_key,
            matrix_path=matrix_path,
            dropped=dropped,
        )
    finally:
        shutil.rmtree(roots, ignore_errors=True)
    gate.seconds = round(time.monotonic() - start, 3)
    return CandidateVerified(
        candidate, gate, list(cand.config.provenance.deltas), vouched=vouched, dropped=dropped
    )


def _read_pair(store: Store, candidate: str, wanted: str) -> tuple[Artifact, Artifact]:
    """Return the candidate and the promoted artifact it extends, each checked against the other."""
    from artifactd.format.oci import full_tag
    from artifactd.stores.artifacts import read_artifact

    cand = read_artifact(store, candidate)
    if cand is None:
        raise VerifyError(
            f"{store.ref} has no candidate {candidate}",
            hint="`artifactd absorb MATRIX --store REF --deltas REF` prints the tag",
        )
    prov = cand.config.provenance
    if cand.config.kind != "full" or prov.source != "absorb" or prov.extends is None:
        raise VerifyError(
            f"{candidate} is not a candidate absorb published (kind {cand.config.kind}, "
            f"source {prov.source})",
            hint="gate a build's artifact with `artifactd verify MATRIX` alone",
        )
    if cand.config.fingerprint_hash != wanted:
        raise VerifyError(
            f"{candidate} was absorbed for another fingerprint "
            f"({cand.config.fingerprint_hash[:12]}..., not {wanted[:12]}...)",
            hint="absorb and verify with the same matrix, image and target",
        )
    base = read_artifact(store, full_tag(wanted))
    if base is None or base.digest != prov.extends:
        raise VerifyError(
            f"{full_tag(wanted)} no longer names {prov.extends}, the artifact {candidate} "
            "extends: the promoted artifact moved since the absorb",
            hint="absorb again: the deltas are still in the delta store",
        )
    return cand, base


def _evidence(proof_roots: Path, cand: ArtifactConfig) -> dict[str, set[str]]:
    """Per family, what the proof pass wrote: ``path@sha256`` of each file, and each file's key.

    Keys are ``key:<component>/<compile key>`` (:meth:`Family.compile_key`).
    """
    from artifactd.families import get_family
    from artifactd.pod.verdict import restore_time, written_since
    from artifactd.restore.destination import CacheVolume

    found: dict[str, set[str]] = {}
    cells_dir = proof_roots / "cells"
    for target in sorted(cells_dir.iterdir()) if cells_dir.is_dir() else []:
        volume = CacheVolume(target)
        marker = volume.read_marker()
        if marker is None:
            continue
        cutoff = restore_time(volume.marker_path, marker["restored_at"])
        for name in cand.provenance.contributed:
            fam = get_family(name)
            seen = found.setdefault(name, set())
            for component, root in fam.restore_dirs(target).items():
                for path in written_since(fam, component, root, cutoff):
                    rel = PurePosixPath(Path(path).relative_to(root).as_posix())
                    data = Path(path).read_bytes()
                    if fam.path_bearing(component, rel):
                        data = fam.normalize(data, (str(root),))
                    seen.add(f"{component}/{rel}@{hashlib.sha256(data).hexdigest()}")
                    key = fam.compile_key(component, rel)
                    if key is not None:
                        seen.add(f"key:{component}/{key}")
    return found


def _vouch(
    cand: ArtifactConfig, evidence: Mapping[str, set[str]]
) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Split the contributed paths into those the proof pass re-compiled and the rest."""
    from artifactd.families import get_family

    vouched: dict[str, list[str]] = {}
    dropped: dict[str, list[str]] = {}
    for name, paths in sorted(cand.provenance.contributed.items()):
        fam = get_family(name)
        rec = cand.layer(name)
        entries = {f.path: f for f in rec.files} if rec is not None else {}
        seen = evidence.get(name, set())
        for path in paths:
            entry = entries.get(path)
            component, _, rel = path.partition("/")
            key = fam.compile_key(component, PurePosixPath(rel))
            ok = entry is not None and (
                f"{path}@{entry.sha256}" in seen
                or (key is not None and f"key:{component}/{key}" in seen)
            )
            (vouched if ok else dropped).setdefault(name, []).append(path)
    return vouched, dropped


def _without(
    store: Store, cand: ArtifactConfig, dropped: Mapping[str, list[str]], work: Path
) -> tuple[ArtifactConfig, dict[str, PackedLayer]]:
    """Return the candidate less the dropped entries: each family that lost some, repacked."""
    from artifactd.build.merge import unpack_record
    from artifactd.families import Located, get_family
    from artifactd.format.archive import pack_family
    from artifactd.format.config import RootFS

    work.mkdir(parents=True, exist_ok=True)
    records = []
    packed: dict[str, PackedLayer] = {}
    for rec in cand.layers:
        gone = dropped.get(rec.family)
        if not gone:
            records.append(rec)
            continue
        fam = get_family(rec.family)
        dirs = unpack_record(store, fam, rec, work / "unpacked" / rec.family)
        for path in gone:
            component, _, rel = path.partition("/")
            _remove(dirs[component], PurePosixPath(rel))
        by_name = {c.name: c for c in fam.components}
        located = [Located(by_name[c], p) for c, p in sorted(dirs.items()) if p.is_dir()]
        layer = pack_family(
            fam, located, work / f"{rec.family}.tar.zst", scope_key=rec.scope_key, scope=rec.scope
        )
        packed[rec.family] = layer
        records.append(
            rec.model_copy(
                update={
                    "files": layer.files,
                    "skipped": layer.skipped,
                    "digest": layer.digest,
                    "size": layer.size,
                    "diff_id": layer.diff_id,
                    "unpacked_size": layer.unpacked_size,
                }
            )
        )
    contributed = {
        name: [p for p in paths if p not in dropped.get(name, [])]
        for name, paths in cand.provenance.contributed.items()
    }
    provenance = cand.provenance.model_copy(
        update={"contributed": {k: v for k, v in contributed.items() if v}}
    )
    art = cand.model_copy(
        update={
            "layers": records,
            "rootfs": RootFS(diff_ids=[r.diff_id for r in records]),
            "provenance": provenance,
        }
    )
    return art, packed


def _remove(root: Path, rel: PurePosixPath) -> None:
    """Remove a dropped file, and the dirs it leaves empty (a dropped entry leaves no trace)."""
    (root / rel).unlink(missing_ok=True)
    for parent in rel.parents:
        if parent == PurePosixPath("."):
            break
        try:
            (root / parent).rmdir()
        except OSError:
            break


def _publish(
    src: Store, dst: Store, art: ArtifactConfig, packed: dict[str, PackedLayer], work: Path
) -> str:
    """Publish ``art`` into ``dst`` as the fingerprint's artifact, reused layers from ``src``."""
    from artifactd.stores.artifacts import copy_blob, publish

    for rec in art.layers:
        if rec.family not in packed and not dst.has_blob(rec.digest):
            copy_blob(src, dst, rec.digest, rec.size, work)
    return publish(dst, art, packed, work).digest


def _promote(
    store: Store,
    art: ArtifactConfig,
    packed: dict[str, PackedLayer],
    work: Path,
    gate: VerifyResult,
    *,
    promote: str | None,
    sign_key: PrivateKey | None,
    matrix_path: Path,
    dropped: Mapping[str, list[str]],
) -> None:
    """Publish what passed as the fingerprint's artifact, sign it, tag it ``promote``."""
    from artifactd.build.gate import tag_manifest
    from artifactd.stores.artifacts import publish

    if not gate.passed or promote is None:
        return
    pub = publish(store, art, packed, work)
    if sign_key is not None:
        from artifactd.trust.provenance import statement
        from artifactd.trust.signatures import attest, sign_all, store_identity

        sign_all(store, [pub.digest, *pub.family_digests.values()], sign_key)
        verdict: dict[str, Any] = {
            "passed": True,
            "cells": len(gate.cells),
            "tolerance": gate.tolerance,
            "dropped": dict(dropped),
        }
        doc = statement(store_identity(store), pub.digest, art, matrix=matrix_path, verify=verdict)
        gate.attestation = attest(store, pub.digest, doc, sign_key)
    tag_manifest(store, pub.digest, promote)
    gate.promoted = promote


__all__ = ["CandidateVerified", "verify_candidate"]
