"""Gate a candidate that ``absorb`` published: only entries the gate exercised are promoted.

``artifactd verify MATRIX --store REF --candidate TAG [--promote TAG]`` runs
in two passes over the matrix's cells (:func:`artifactd.build.gate.run_cells`,
the gate's own restore, run and verdict per cell). Before any cell runs the
candidate is held to what it says it is (:func:`check_candidate`): under a
policy (``trust``), it and the promoted artifact it extends are signed by one
of the keys; each of its layers is the promoted one exactly, or, for a family
the deltas contributed to, the promoted files unchanged plus the contributed
paths and nothing else; its config is the promoted config plus what ``absorb``
records. A candidate that differs is refused: someone who can push but holds
no key changed it after ``absorb``.

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
   The proof must have run on the promoted artifact the candidate extends:
   a cell restored from anything else (``fp-<hash>`` moved meanwhile) refuses
   the candidate.
2. **Gate.** What is promoted is rebuilt, never taken from the candidate
   (:func:`rebuild`): per family, the promoted layer as it is, or, where an
   entry was vouched for, the promoted layer's files plus exactly the vouched
   entries (bytes from the candidate, checked against its record on unpack),
   repacked and checked to be exactly that; the config is the promoted
   config, its provenance naming the deltas and the vouched paths. That
   artifact is published into a scratch layout and every cell re-runs on it
   exactly as ``verify`` runs them: checks within the matrix's tolerance,
   nothing compiled anyway.

Only when the gate passes, and with ``promote``, is the artifact the gate
ran on published into the store as the fingerprint's artifact (``fp-<hash>``
and each family's scope tag) and tagged ``promote``; with a key, signed and
attested, its provenance naming the artifact it extends and the deltas absorbed.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from artifactd.build.gate import (
    VerifyResult,
    gate_failures,
    preamble,
    run_cells,
    tag_manifest,
)
from artifactd.build.merge import unpack_record
from artifactd.errors import VerifyError
from artifactd.families import Located, get_family
from artifactd.families.tree import root_spellings
from artifactd.format.archive import pack_family
from artifactd.format.config import RootFS
from artifactd.format.oci import full_tag
from artifactd.pod.verdict import restore_time, written_since
from artifactd.restore import installed
from artifactd.restore.destination import CacheVolume
from artifactd.restore.resolve import unbound
from artifactd.stores import open_store
from artifactd.stores.artifacts import publish, read_artifact
from artifactd.trust.policy import UNSAFE_NO_VERIFICATION
from artifactd.trust.provenance import statement
from artifactd.trust.signatures import attest, sign_all, store_identity

if TYPE_CHECKING:
    from artifactd.build.gate import GateSetup
    from artifactd.families import Family
    from artifactd.format.archive import PackedLayer
    from artifactd.format.config import ArtifactConfig, FileEntry, LayerRecord
    from artifactd.stores import Store
    from artifactd.stores.artifacts import Artifact
    from artifactd.trust.keys import PrivateKey
    from artifactd.trust.policy import Basis

#: At most this many differing paths are named when a candidate is refused.
_NAMED = 3


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
    #: Under a policy, the id of the key that signed the candidate.
    signed_by: str | None = None


def verify_candidate(
    matrix_path: Path,
    store: Store,
    candidate: str,
    setup: GateSetup,
    *,
    gpus: Sequence[str] | None = None,
    jobs: int = 1,
    promote: str | None = None,
    sign_key: PrivateKey | None = None,
    keep_roots: Path | None = None,
) -> CandidateVerified:
    """Prove, gate and (with ``promote``) promote the candidate ``candidate`` (module doc).

    The work happens in a temporary directory, removed at the end, or in
    ``keep_roots`` (kept: ``submitted/``, ``proof/``, ``pack/``, ``gate/`` and
    the scratch ``gate-store/``, to read after a failed gate).

    Raises :class:`~artifactd.errors.TrustError` under a
    :class:`~artifactd.trust.policy.TrustPolicy` when the
    candidate or the artifact it extends is not signed by one of its keys,
    and :class:`VerifyError` when the candidate is not the promoted artifact
    plus what its deltas contributed (:func:`check_candidate`): both before
    any cell runs, with nothing published or tagged.
    """
    pre = preamble(matrix_path, setup)
    matrix, cells, fingerprint = pre.matrix, pre.cells, pre.fingerprint
    cand, base = _read_pair(store, candidate, fingerprint.hash, pre.trust)
    check_candidate(candidate, cand.config, base.config)
    roots = keep_roots or Path(tempfile.mkdtemp(prefix=f"artifactd-candidate-{matrix.name}-"))
    try:
        # The restore's checks on what was submitted, before any cell runs.
        submitted = _unpack_contributed(store, cand.config, roots / "submitted")
        proof_ctx = pre.context(
            store,
            roots / "proof",
            base.config.provenance.checks,
            canaries={c.cell: c for c in base.config.canaries},
        )
        proof = run_cells(proof_ctx, cells, gpus=gpus, jobs=jobs)
        _proof_ran_on(roots / "proof", base.digest, candidate)
        evidence = _evidence(roots / "proof", cand.config)
        vouched, dropped = _vouch(cand.config, evidence)
        art, packed = rebuild(
            store, base, cand.config, submitted=submitted, vouched=vouched, work=roots / "pack"
        )
        # What the promoted artifact computes for this matrix's cells (a cell's requests may
        # have changed since the build recorded its checks): the candidate must compute the same.
        recorded = {c.id: {r.name: r.got for r in c.checks if r.got is not None} for c in proof}
        with open_store(f"oci:{roots / 'gate-store'}", create=True) as scratch:
            gated = _publish(store, scratch, art, packed, roots / "pack")
            # The scratch layout holds what this process rebuilt from verified parts, unsigned.
            gate_ctx = pre.context(
                scratch,
                roots / "gate",
                recorded,
                trust=UNSAFE_NO_VERIFICATION,
                canaries={c.cell: c for c in base.config.canaries},
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
        if keep_roots is None:
            shutil.rmtree(roots, ignore_errors=True)
    gate.seconds = round(time.monotonic() - pre.started, 3)
    return CandidateVerified(
        candidate,
        gate,
        list(cand.config.provenance.deltas),
        vouched=vouched,
        dropped=dropped,
        signed_by=cand.signed_by,
    )


def _read_pair(
    store: Store, candidate: str, wanted: str, trust: Basis
) -> tuple[Artifact, Artifact]:
    """Return the candidate and the promoted artifact it extends, each checked against the other.

    Under a policy, each must be signed by one of its keys (checked before its
    config is read): :class:`~artifactd.errors.TrustError` otherwise.
    """
    cand = read_artifact(store, candidate, trust=trust)
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
    tag = full_tag(wanted)
    ref = store.get_manifest(tag)
    if ref is None or ref.digest != prov.extends:
        raise VerifyError(
            f"{full_tag(wanted)} no longer names {prov.extends}, the artifact {candidate} "
            "extends: the promoted artifact moved since the absorb",
            hint="absorb again: the deltas are still in the delta store",
        )
    trust.check(store, ref.digest, what=f"{store.ref}:{tag} (the artifact {candidate} extends)")
    # By digest: the artifact the candidate names, whatever the tag says a moment later.
    base = read_artifact(store, ref.digest)
    if base is None:  # pragma: no cover - listed a moment ago
        raise VerifyError(f"{store.ref} lost {ref.digest} during verify")
    why = unbound(tag, base.config.kind, base.config.fingerprint_hash, wanted)
    if why is not None:
        raise VerifyError(why, hint="re-publish it with `artifactd build` or `merge`")
    return cand, base


def check_candidate(candidate: str, cand: ArtifactConfig, base: ArtifactConfig) -> None:
    """Refuse a candidate that is not ``base`` plus the entries its provenance says it gained.

    ``absorb`` publishes exactly that: the promoted config with its
    provenance's ``source``, ``extends``, ``deltas`` and ``contributed`` set,
    every layer the promoted one except those of families a delta added
    files to, which hold the promoted files unchanged plus the contributed
    paths. Anything else (a file added, changed or removed, a layer or a
    config field swapped) was done after the absorb by someone without its
    key: :class:`VerifyError`, naming the first differences.
    """
    prov = cand.provenance
    expected = base.model_copy(
        update={
            "layers": cand.layers,
            "rootfs": cand.rootfs,
            "provenance": base.provenance.model_copy(
                update={
                    "source": prov.source,
                    "extends": prov.extends,
                    "deltas": prov.deltas,
                    "contributed": prov.contributed,
                }
            ),
        }
    )
    if expected.model_dump(mode="json") != cand.model_dump(mode="json"):
        _refuse(candidate, "its config differs from the promoted artifact's beyond its layers")
    families = [rec.family for rec in cand.layers]
    if families != [rec.family for rec in base.layers]:
        _refuse(candidate, f"its families {families} are not the promoted artifact's")
    unknown = sorted(set(prov.contributed) - set(families))
    if unknown:
        _refuse(candidate, f"its provenance lists contributions to {unknown}, which it lacks")
    for rec, promoted in zip(cand.layers, base.layers, strict=True):  # the same families
        why = _layer_difference(rec, promoted, prov.contributed.get(rec.family, []))
        if why is not None:
            _refuse(candidate, f"{rec.family}: {why}")


def _layer_difference(  # noqa: PLR0911 - one return per difference
    rec: LayerRecord, promoted: LayerRecord, contributed: Sequence[str]
) -> str | None:
    """Why a candidate's layer is not ``promoted`` plus ``contributed``, or None when it is."""
    if not contributed:
        if rec != promoted:
            return "no delta contributed to it, yet its layer is not the promoted one"
        return None
    fields = ("scope_key", "scope", "pinned_paths", "facts")
    changed = [name for name in fields if getattr(rec, name) != getattr(promoted, name)]
    if len(set(contributed)) != len(contributed):
        return "its provenance lists a contributed path twice"
    if changed:
        return f"its {', '.join(changed)} differ from the promoted layer's"
    have = {f.path: f for f in rec.files}
    old = {f.path: f for f in promoted.files}
    claimed = [p for p in contributed if p in old]
    if claimed:
        return f"contributed path(s) the promoted artifact already holds: {_names(claimed)}"
    extra = sorted(set(have) - set(old) - set(contributed))
    if extra:
        return f"file(s) no delta contributed: {_names(extra)}"
    missing = sorted((set(old) | set(contributed)) - set(have))
    if missing:
        return f"file(s) missing: {_names(missing)}"
    changed_files = sorted(p for p, entry in old.items() if have[p] != entry)
    if changed_files:
        return f"promoted file(s) changed: {_names(changed_files)}"
    return None


def _names(paths: Sequence[str]) -> str:
    """Return the first few of ``paths``, and how many more there are."""
    more = f" and {len(paths) - _NAMED} more" if len(paths) > _NAMED else ""
    return ", ".join(paths[:_NAMED]) + more


def _refuse(candidate: str, why: str) -> None:
    raise VerifyError(
        f"{candidate} is not the promoted artifact plus what its deltas contributed: {why}",
        hint="it was changed after `absorb` published it; absorb again (the deltas are still "
        "in the delta store), and sign candidates (`absorb --sign-key`, `verify --verify-key`)",
    )


def _unpack_contributed(
    store: Store, cand: ArtifactConfig, work: Path
) -> dict[str, dict[str, Path]]:
    """Unpack, with the restore's checks, each candidate layer a delta contributed to."""
    out: dict[str, dict[str, Path]] = {}
    for rec in cand.layers:
        if cand.provenance.contributed.get(rec.family):
            fam = get_family(rec.family)
            out[rec.family] = unpack_record(store, fam, rec, work / rec.family)
    return out


def _proof_ran_on(proof_roots: Path, base: str, candidate: str) -> None:
    """Refuse the candidate unless every proof cell restored exactly ``base``, nothing else."""
    cells_dir = proof_roots / "cells"
    for target in sorted(cells_dir.iterdir()) if cells_dir.is_dir() else []:
        marker = CacheVolume(target).read_marker()
        if marker is None:
            continue
        other = sorted({f["artifact"] for f in marker["families"].values()} - {base})
        if other:
            raise VerifyError(
                f"the proof pass for {candidate} restored {other[0]}, not {base}, the "
                "artifact it extends: the promoted artifact moved during the gate",
                hint="absorb again once nothing else is promoting",
            )


def _evidence(proof_roots: Path, cand: ArtifactConfig) -> dict[str, set[str]]:
    """Per family, what the proof pass wrote: ``path@sha256`` of each file, and each file's key.

    Keys are ``key:<component>/<compile key>`` (:meth:`Family.compile_key`).
    """
    found: dict[str, set[str]] = {}
    cells_dir = proof_roots / "cells"
    for target in sorted(cells_dir.iterdir()) if cells_dir.is_dir() else []:
        volume = CacheVolume(target)
        marker = volume.read_marker()
        if marker is None:
            continue
        cutoff = restore_time(volume.marker_path, marker["restored_at"])
        recorded = installed.read(volume.state, marker)
        for name in cand.provenance.contributed:
            fam = get_family(name)
            seen = found.setdefault(name, set())
            for component, root in fam.restore_dirs(target).items():
                for path in written_since(fam, component, root, cutoff, recorded.get(name, {})):
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


def rebuild(
    store: Store,
    base: Artifact,
    cand: ArtifactConfig,
    *,
    submitted: Mapping[str, Mapping[str, Path]],
    vouched: Mapping[str, Sequence[str]],
    work: Path,
) -> tuple[ArtifactConfig, dict[str, PackedLayer]]:
    """Return the promoted artifact plus exactly the ``vouched`` entries, and the layers repacked.

    Built from ``base`` up, never from the candidate down: a family with no
    vouched entry keeps the promoted layer as it is; the others are the
    promoted layer unpacked (the restore's checks), each vouched entry copied
    in from ``submitted`` (the candidate's layer, unpacked and checked against
    its record), repacked, and the result held to be exactly the promoted
    files plus the candidate's records of the vouched paths
    (:class:`VerifyError` otherwise). The config is the promoted one, its
    provenance naming the artifact it extends, the deltas and the vouched paths.
    """
    records = []
    packed: dict[str, PackedLayer] = {}
    for rec in base.config.layers:
        paths = vouched.get(rec.family)
        theirs = cand.layer(rec.family)
        if not paths or theirs is None:
            records.append(rec)
            continue
        fam = get_family(rec.family)
        stage = work / "promoted" / rec.family
        dirs = unpack_record(store, fam, rec, stage)
        for path in paths:
            component, _, rel = path.partition("/")
            dest = dirs.setdefault(component, stage / component)
            _copy_entry(fam, component, PurePosixPath(rel), submitted[rec.family][component], dest)
        by_name = {c.name: c for c in fam.components}
        located = [Located(by_name[c], p) for c, p in sorted(dirs.items()) if p.is_dir()]
        layer = pack_family(
            fam, located, work / f"{rec.family}.tar.zst", scope_key=rec.scope_key, scope=rec.scope
        )
        added = {f.path: f for f in theirs.files if f.path in set(paths)}
        _exactly(rec, layer.files, added)
        packed[rec.family] = layer
        records.append(
            rec.model_copy(
                update={
                    "components": sorted(loc.component.name for loc in located),
                    "files": layer.files,
                    "skipped": layer.skipped,
                    "pinned_paths": sorted({*rec.pinned_paths, *layer.pinned}),
                    "digest": layer.digest,
                    "size": layer.size,
                    "diff_id": layer.diff_id,
                    "unpacked_size": layer.unpacked_size,
                }
            )
        )
    provenance = base.config.provenance.model_copy(
        update={
            "source": "absorb",
            "extends": base.digest,
            "deltas": list(cand.provenance.deltas),
            "contributed": {k: list(v) for k, v in sorted(vouched.items()) if v},
        }
    )
    art = base.config.model_copy(
        update={
            "layers": records,
            "rootfs": RootFS(diff_ids=[r.diff_id for r in records]),
            "provenance": provenance,
        }
    )
    return art, packed


def _copy_entry(fam: Family, component: str, rel: PurePosixPath, src: Path, dest: Path) -> None:
    """Copy one vouched entry from the candidate's staging into the promoted tree's.

    A symlink is recreated; a path-bearing file is moved from the
    candidate's staging root to ``dest`` (normalised, then relocated), as a
    merge moves it; any other file is copied with its mode and mtime. Never
    over an existing path (:func:`check_candidate` saw none).
    """
    source, target = src / rel, dest / rel
    if target.exists() or target.is_symlink():
        raise VerifyError(f"{fam.name}/{component}/{rel} is promoted already: not added")
    target.parent.mkdir(parents=True, exist_ok=True)
    if source.is_symlink():
        os.symlink(os.readlink(source), target)
        return
    if not fam.path_bearing(component, rel):
        shutil.copy2(source, target)
        return
    data = source.read_bytes()
    with contextlib.suppress(ValueError):  # not UTF-8: stored as it is, as the packer stores it
        data = fam.relocate(fam.normalize(data, root_spellings(src)), str(dest))
    target.write_bytes(data)
    shutil.copystat(source, target)


def _exactly(rec: LayerRecord, files: Sequence[FileEntry], added: Mapping[str, FileEntry]) -> None:
    """Raise unless ``files`` are ``rec``'s plus ``added``, entry for entry."""
    want = {f.path: f for f in rec.files} | dict(added)
    got = {f.path: f for f in files}
    if got != want:
        diff = sorted(p for p in set(got) | set(want) if got.get(p) != want.get(p))
        raise VerifyError(
            f"the {rec.family} layer rebuilt for promotion is not the promoted one plus the "
            f"vouched entries: {_names(diff)} differ",
            hint="nothing was promoted; report this with the candidate's tag",
        )


def _publish(
    src: Store, dst: Store, art: ArtifactConfig, packed: dict[str, PackedLayer], work: Path
) -> str:
    """Publish ``art`` into ``dst`` as the fingerprint's artifact, reused layers from ``src``."""
    for rec in art.layers:
        if rec.family not in packed and not dst.has_blob(rec.digest):
            src.copy_blob(dst, rec.digest, rec.size, work)
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
    if not gate.passed or promote is None:
        return
    pub = publish(store, art, packed, work)
    if sign_key is not None:
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
