"""Merge: compose a fan-out build's per-cell artifacts into the fingerprint's whole artifact.

Each worker of a fan-out (a CI matrix job, a Kubernetes Indexed Job's pod)
runs ``artifactd build FILE --cell I --run-id ID`` and publishes one cell's
caches as a partial artifact (``kind: cell``) tagged ``run-<ID>-cell-<I>``;
no restore ever finds those. :func:`merge` reads every cell's partial
artifact of the run (a missing cell fails the merge), checks that all were
built for one fingerprint (:func:`artifactd.build.published.agreed_fingerprint`), and
composes them, family by family:

* a family that one cell alone has, or that every cell has with the same
  layer digest, keeps that layer: it is neither downloaded nor uploaded
  again (the registry already holds the blob; only a new config and
  manifest are written);
* a family several cells have with different layers is downloaded, each
  layer verified and unpacked into staging, the trees merged by the rules
  of :mod:`artifactd.build.treemerge` (a path with different bytes and no family
  rule is a conflict naming both cells, and fails the merge), and packed
  into one new layer.

The result is published like any build: ``fp-<hash>`` and each family's
scope tag. A merge is idempotent: packing is reproducible and the config
holds no time, so merging again writes the same digests and uploads nothing.
The format is unchanged (``registry-schema/FORMAT.md``).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from artifactd import __version__
from artifactd.build.matrix import expand, load_matrix
from artifactd.build.published import agreed_fingerprint
from artifactd.build.run import cell_tag, check_run_id
from artifactd.build.treemerge import merge_family
from artifactd.errors import BuildError
from artifactd.events import EventSink, discard
from artifactd.families import FAMILIES, Located, get_family
from artifactd.format.archive import pack_family
from artifactd.format.config import ArtifactConfig, LayerRecord, Provenance, RootFS
from artifactd.format.unpack import check_layer, unpack_layer
from artifactd.stores.artifacts import publish, read_artifact
from artifactd.trust.provenance import statement
from artifactd.trust.signatures import attest, sign_all, store_identity

if TYPE_CHECKING:
    from artifactd.build.matrix import Cell
    from artifactd.families.base import Family
    from artifactd.format.archive import PackedLayer
    from artifactd.stores import Store
    from artifactd.stores.artifacts import Artifact
    from artifactd.trust.keys import PrivateKey
    from artifactd.trust.signatures import SignResult


@dataclass
class FamilyMerged:
    """How one family of the merged artifact was made."""

    family: str
    cells: list[str]
    #: "reused": one layer, as it was; "repacked": several, merged into a new one.
    how: str
    layer_digest: str
    files: int
    bytes_downloaded: int = 0


@dataclass
class MergeResult:
    """What :func:`merge` published."""

    store: str
    run_id: str
    digest: str
    tags: list[str]
    fingerprint_hash: str
    cells: list[str]
    families: list[FamilyMerged]
    bytes_uploaded: int
    bytes_skipped: int
    seconds: float
    conflicts: list[str] = field(default_factory=list)
    #: What ``--sign-key`` signed and attested.
    signing: SignResult | None = None


def merge(
    matrix_path: Path,
    store: Store,
    run_id: str,
    *,
    on_event: EventSink = discard,
    sign_key: PrivateKey | None = None,
) -> MergeResult:
    """Compose run ``run_id``'s cell artifacts in ``store`` into the whole artifact (module doc).

    With ``sign_key``, the manifests published are signed and the artifact
    gets its provenance (the cells' timings and checks) as an attestation.
    """
    start = time.monotonic()
    check_run_id(run_id)
    matrix = load_matrix(matrix_path)
    cells = expand(matrix, matrix_path)
    parts = _read_parts(store, run_id, cells)
    first = parts[0][1].config
    fingerprint, fingerprint_hash = agreed_fingerprint([(c.id, a.config) for c, a in parts])
    records: list[LayerRecord] = []
    packed: dict[str, PackedLayer] = {}
    report: list[FamilyMerged] = []
    with tempfile.TemporaryDirectory(prefix="artifactd-merge-") as tmp:
        work = Path(tmp)
        for family in _families_in(parts):
            layers = [(c, a.config.layer(family)) for c, a in parts]
            recs = [(c, rec) for c, rec in layers if rec is not None]
            if len({rec.digest for _, rec in recs}) == 1:
                rec = recs[0][1]
                records.append(rec)
                report.append(
                    FamilyMerged(
                        family, [c.id for c, _ in recs], "reused", rec.digest, len(rec.files)
                    )
                )
                on_event({"stage": "merge", "event": "reused", "family": family})
                continue
            rec, layer, merged = _repack(store, family, recs, work / family, on_event)
            records.append(rec)
            packed[family] = layer
            report.append(merged)
        provenance = Provenance(
            builder=__version__,
            source="merge",
            matrix=matrix.name,
            base_image=first.provenance.base_image,
            cells=[c.id for c, _ in parts],
            timings={k: v for _, a in parts for k, v in a.config.provenance.timings.items()},
            run_id=run_id,
            checks={k: v for _, a in parts for k, v in a.config.provenance.checks.items()},
        )
        art = ArtifactConfig(
            architecture=first.architecture,
            rootfs=RootFS(diff_ids=[r.diff_id for r in records]),
            fingerprint=fingerprint,
            fingerprint_hash=fingerprint_hash,
            layers=records,
            provenance=provenance,
            # Each cell's canary, as its part recorded it: the merged artifact carries them all.
            canaries=[can for _, a in parts for can in a.config.canaries],
        )
        pub = publish(store, art, packed, work, on_event=on_event)
    signing = None
    if sign_key is not None:
        signing = sign_all(store, [pub.digest, *pub.family_digests.values()], sign_key)
        doc = statement(store_identity(store), pub.digest, art, matrix=matrix_path)
        signing.attestations.append(attest(store, pub.digest, doc, sign_key))
    return MergeResult(
        store=store.ref,
        run_id=run_id,
        digest=pub.digest,
        tags=pub.tags,
        fingerprint_hash=art.fingerprint_hash,
        cells=[c.id for c, _ in parts],
        families=report,
        bytes_uploaded=pub.bytes_uploaded,
        bytes_skipped=pub.bytes_skipped,
        seconds=round(time.monotonic() - start, 3),
        signing=signing,
    )


def _read_parts(store: Store, run_id: str, cells: list[Cell]) -> list[tuple[Cell, Artifact]]:
    """Every cell's partial artifact of the run, in cell order; fail naming the missing."""
    parts: list[tuple[Cell, Artifact]] = []
    missing: list[int] = []
    for cell in cells:
        art = read_artifact(store, cell_tag(run_id, cell.index))
        if art is None:
            missing.append(cell.index)
            continue
        if art.config.kind != "cell":
            raise BuildError(
                f"{cell_tag(run_id, cell.index)} in {store.ref} is a {art.config.kind} "
                "artifact, not a cell's part"
            )
        parts.append((cell, art))
    if missing:
        raise BuildError(
            f"run {run_id}: no artifact for cell(s) {', '.join(map(str, missing))} "
            f"of {len(cells)} in {store.ref}",
            hint="every cell must finish `artifactd build FILE --cell I --run-id "
            f"{run_id}` before the merge; rerun the missing ones",
        )
    return parts


def _families_in(parts: list[tuple[Cell, Artifact]]) -> list[str]:
    """Return the families any cell has, in artifactd's family order."""
    present = {rec.family for _, a in parts for rec in a.config.layers}
    return [name for name in FAMILIES if name in present]


def _repack(
    store: Store,
    family: str,
    recs: list[tuple[Cell, LayerRecord]],
    work: Path,
    on_event: EventSink,
) -> tuple[LayerRecord, PackedLayer, FamilyMerged]:
    """Download, verify and unpack each cell's layer of ``family``; merge; pack one layer."""
    fam = get_family(family)
    keys = {rec.scope_key for _, rec in recs}
    if len(keys) != 1:  # pragma: no cover - one fingerprint gives one scope key
        raise BuildError(f"the cells' {family} layers have different scope keys")
    downloaded = 0
    sources = []
    for cell, rec in recs:
        sources.append((cell.id, unpack_record(store, fam, rec, work / "cells" / cell.id)))
        downloaded += rec.size
    components = sorted({comp for _, rec in recs for comp in rec.components})
    dest = {comp: work / "merged" / comp for comp in components}
    result = merge_family(fam, sources, dest)
    if result.conflicts:
        first = result.conflicts[0]
        raise BuildError(
            f"{len(result.conflicts)} conflict(s) merging the cells' {family} caches, "
            f"e.g. {first.describe()}",
            hint="two cells wrote one path with different bytes: split them into separate "
            "matrices, or make the family's rule cover it",
        )
    by_name = {c.name: c for c in fam.components}
    located = [Located(by_name[comp], dest[comp]) for comp in components if dest[comp].is_dir()]
    base = recs[0][1]
    layer = pack_family(
        fam, located, work / f"{family}.tar.zst", scope_key=base.scope_key, scope=base.scope
    )
    facts: dict[str, object] = {}
    for _, rec in recs:
        for comp, data in rec.facts.items():
            facts.setdefault(comp, data)
    pinned = sorted({p for _, rec in recs for p in rec.pinned_paths})
    record = layer.record(facts=facts, pinned=pinned)
    on_event({"stage": "merge", "event": "repacked", "family": family, "cells": len(recs)})
    merged = FamilyMerged(
        family, [c.id for c, _ in recs], "repacked", layer.digest, len(layer.files), downloaded
    )
    return record, layer, merged


def unpack_record(store: Store, fam: Family, rec: LayerRecord, stage: Path) -> dict[str, Path]:
    """Download, verify and unpack one format-2 layer into ``stage``; return its component dirs.

    The restore's checks (:func:`~artifactd.format.unpack.check_layer`, then
    :func:`~artifactd.format.unpack.unpack_layer` against the record): what a
    merge or an ``absorb`` reads from another party passes them first.
    """
    dirs = {comp: stage / comp for comp in rec.components}

    def relocate(member: str, data: bytes) -> bytes:
        return fam.relocate(data, str(dirs[member.split("/", 1)[0]]))

    known = frozenset(c.name for c in fam.components)
    bound = check_layer(rec, known, prefix=fam.name)
    tries = 0

    def consume(blob: BinaryIO) -> None:
        nonlocal tries
        tries += 1
        if tries > 1:  # a mirror failed: the next source starts from an empty stage
            shutil.rmtree(stage, ignore_errors=True)
        unpack_layer(
            blob,
            digest=rec.digest,
            size=rec.size,
            entries=rec.files,
            staging=stage,
            components=frozenset(rec.components),
            max_tar_bytes=bound,
            relocate=relocate,
            keep_mtimes=fam.keep_mtimes,
            record=rec,
            prefix=fam.name,
        )

    store.consume_blob(rec.digest, rec.size, consume)
    return dirs
