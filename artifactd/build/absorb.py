"""Absorb: screen the deltas pods contributed and publish a candidate artifact.

``artifactd absorb MATRIX --store REF --deltas REF`` reads every ``delta-*``
artifact in the delta store (:mod:`artifactd.pod.contribute`) as hostile input,
and judges each one whole, accepted or refused with the reason:

* **trust**: under a policy (``--verify-key``) its manifest must be signed by
  one of the keys (:meth:`artifactd.trust.policy.TrustPolicy.check`), or it
  is refused as unsigned or signed by an unknown key;
* **kind and fingerprint**: it must be a ``kind: delta`` built for the
  fingerprint the matrix publishes on this machine
  (:func:`artifactd.build.published.published_fingerprint`), each family's
  scope key that of the promoted artifact's layer (a family the promoted
  artifact lacks is refused: nothing would vouch for its scope);
* **size**: at most ``max_bytes`` of files;
* **no change to what is promoted**: a file at a path the promoted artifact
  holds must have the same bytes, mode and link target, or it is a conflict;
* **the restore's checks**: each layer is downloaded, verified and unpacked
  into staging exactly as a merge unpacks a cell's layer
  (:func:`artifactd.build.merge.unpack_record`: escaping or forbidden members,
  files that do not match the record, a lying tree document are refused);
* **the family's merge rules**: the promoted tree and the accepted deltas
  are merged per family by :func:`artifactd.build.treemerge.merge_family`,
  promoted first; a delta named in a conflict (with the promoted tree or
  with an earlier delta) is refused and the merge redone without it.

The candidate is the promoted artifact plus the accepted deltas' entries:
families no delta touched keep their layer as it is, the others are repacked.
Its provenance says ``source: absorb``, the artifact it ``extends``, the
``deltas`` absorbed and, per family, the paths they ``contributed``. It is
published under ``candidate-<hash of the base and the deltas>`` only (no
``fp-`` nor scope tag: no restore finds it) for ``verify --candidate`` to
gate; with ``sign_key``, its manifest is signed, so that ``verify --candidate``
under a policy gates only what ``absorb`` published (anyone who can push could
re-point the tag). Nothing accepted: nothing published, nothing signed.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from artifactd.bounds import DELTA_MAX_BYTES
from artifactd.build.matrix import load_matrix
from artifactd.build.merge import unpack_record
from artifactd.build.published import published_fingerprint
from artifactd.build.treemerge import merge_family
from artifactd.constants import current_environ
from artifactd.errors import ArtifactdError, BuildError, TrustError
from artifactd.events import EventSink, discard
from artifactd.families import FAMILIES, Located, get_family
from artifactd.format.archive import pack_family
from artifactd.format.config import RootFS
from artifactd.format.oci import CANDIDATE_TAG_PREFIX
from artifactd.pod.contribute import DELTA_TAG_PREFIX
from artifactd.restore.resolve import unbound, whole_want
from artifactd.stores.artifacts import publish, read_artifact
from artifactd.trust.policy import checked_basis
from artifactd.trust.signatures import sign_all

if TYPE_CHECKING:
    from artifactd.format.archive import PackedLayer
    from artifactd.format.config import ArtifactConfig, LayerRecord
    from artifactd.stores import Store
    from artifactd.stores.artifacts import Artifact
    from artifactd.trust.keys import PrivateKey
    from artifactd.trust.policy import Basis
    from artifactd.trust.signatures import SignResult


@dataclass
class DeltaJudged:
    """One delta and the verdict on it."""

    tag: str
    accepted: bool
    reason: str
    digest: str | None = None
    files: int = 0
    signed_by: str | None = None


@dataclass
class AbsorbResult:
    """What :func:`absorb` judged and published."""

    store: str
    deltas_store: str
    fingerprint_hash: str
    extends: str
    deltas: list[DeltaJudged]
    candidate: str | None = None
    digest: str | None = None
    #: Per family, the paths the accepted deltas added.
    contributed: dict[str, list[str]] = field(default_factory=dict)
    bytes_uploaded: int = 0
    #: What ``sign_key`` signed: the candidate's manifest.
    signing: SignResult | None = None

    @property
    def accepted(self) -> list[DeltaJudged]:
        """The deltas whose entries the candidate holds."""
        return [d for d in self.deltas if d.accepted]


def candidate_tag(extends: str, deltas: Sequence[str]) -> str:
    """Return the candidate's tag: ``candidate-`` and a hash of its base and deltas."""
    text = "\n".join([extends, *sorted(deltas)])
    return CANDIDATE_TAG_PREFIX + hashlib.sha256(text.encode()).hexdigest()[:32]


def absorb(
    matrix_path: Path,
    store: Store,
    deltas: Store,
    *,
    trust: Basis,
    max_bytes: int = DELTA_MAX_BYTES,
    gpu_arch: str | None = None,
    image_digest: str | None = None,
    overrides: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
    on_event: EventSink = discard,
    sign_key: PrivateKey | None = None,
) -> AbsorbResult:
    """Judge every delta in ``deltas``; publish the candidate in ``store`` (module doc).

    With ``sign_key``, the candidate's manifest is signed once it is published.
    """
    trust = checked_basis(trust, "absorb")
    matrix = load_matrix(matrix_path)
    fingerprint = published_fingerprint(
        matrix,
        gpu_arch=gpu_arch,
        image_digest=image_digest,
        overrides=overrides,
        environ=current_environ() if environ is None else environ,
    )
    tag = whole_want(fingerprint.hash).tag
    base = read_artifact(store, tag)
    why = (
        None
        if base is None
        else unbound(tag, base.config.kind, base.config.fingerprint_hash, fingerprint.hash)
    )
    if base is None or why is not None:
        raise BuildError(
            why or f"{store.ref} has no promoted artifact {tag} for the matrix's fingerprint",
            hint="absorb extends the artifact `build` (or `merge`) published for this matrix",
        )
    result = AbsorbResult(store.ref, deltas.ref, fingerprint.hash, base.digest, [])
    tags = sorted(t for t in deltas.list_tags() if t.startswith(DELTA_TAG_PREFIX))
    with tempfile.TemporaryDirectory(prefix="artifactd-absorb-") as tmp:
        work = Path(tmp)
        staged: dict[str, dict[str, dict[str, Path]]] = {}
        for i, delta in enumerate(tags):
            judged, dirs = _screen(
                deltas,
                delta,
                base=base,
                wanted=fingerprint.hash,
                trust=trust,
                max_bytes=max_bytes,
                work=work / "d" / str(i),
            )
            result.deltas.append(judged)
            if judged.accepted:
                staged[delta] = dirs
            on_event(
                {
                    "stage": "absorb",
                    "event": "accepted" if judged.accepted else "refused",
                    "tag": delta,
                    "reason": judged.reason,
                }
            )
        records, packed = _merge_all(store, base, result, staged, work)
        if not result.accepted:
            return result
        _publish_candidate(store, base, result, records=records, packed=packed, work=work)
    if sign_key is not None and result.digest is not None:
        result.signing = sign_all(store, [result.digest], sign_key)
    return result


def _screen(  # noqa: PLR0911 - one return per refusal
    deltas: Store,
    tag: str,
    *,
    base: Artifact,
    wanted: str,
    trust: Basis,
    max_bytes: int,
    work: Path,
) -> tuple[DeltaJudged, dict[str, dict[str, Path]]]:
    """Judge one delta before any merge; unpack its layers into ``work`` if it passes."""
    try:
        art = read_artifact(deltas, tag, trust=trust)
    except TrustError as exc:
        return DeltaJudged(tag, False, f"untrusted: {exc.message}"), {}
    except ArtifactdError as exc:
        return DeltaJudged(tag, False, f"unreadable: {exc.message}"), {}
    if art is None:  # pragma: no cover - listed a moment ago
        return DeltaJudged(tag, False, "gone from the delta store"), {}
    cfg = art.config
    judged = DeltaJudged(
        tag, False, "", art.digest, sum(len(r.files) for r in cfg.layers), art.signed_by
    )
    refusal = _refusal(cfg, base.config, wanted, max_bytes)
    if refusal is not None:
        judged.reason = refusal
        return judged, {}
    dirs: dict[str, dict[str, Path]] = {}
    for rec in cfg.layers:
        try:
            dirs[rec.family] = unpack_record(deltas, get_family(rec.family), rec, work / rec.family)
        except ArtifactdError as exc:
            judged.reason = f"refused by the restore's checks ({rec.family}): {exc.message}"
            return judged, {}
        except OSError as exc:
            judged.reason = f"could not be unpacked ({rec.family}): {exc}"
            return judged, {}
    judged.accepted, judged.reason = True, "accepted"
    return judged, dirs


def _refusal(  # noqa: PLR0911 - one return per refusal
    cfg: ArtifactConfig, base: ArtifactConfig, wanted: str, max_bytes: int
) -> str | None:
    """Why a delta's config alone refuses it (kind, fingerprint, scope, size, changed entry)."""
    if cfg.kind != "delta":
        return f"not a delta (kind {cfg.kind})"
    if cfg.fingerprint_hash != wanted:
        return (
            f"built for another fingerprint ({cfg.fingerprint_hash[:12]}..., "
            f"the matrix publishes {wanted[:12]}...)"
        )
    total = sum(rec.unpacked_size for rec in cfg.layers)
    if total > max_bytes:
        return f"size: {total} B of files, over the {max_bytes} B cap"
    for rec in cfg.layers:
        if rec.family not in FAMILIES:
            return f"unknown family {rec.family!r}"
        promoted = base.layer(rec.family)
        if promoted is None:
            return f"the promoted artifact has no {rec.family} layer whose scope could vouch for it"
        if rec.scope_key != promoted.scope_key:
            return f"{rec.family}: another scope key ({rec.scope_key[:12]}...)"
        have = {f.path: f for f in promoted.files}
        for entry in rec.files:
            old = have.get(entry.path)
            if old is not None and (old.sha256, old.mode, old.link) != (
                entry.sha256,
                entry.mode,
                entry.link,
            ):
                return f"conflict: it would change {rec.family}/{entry.path}, which is promoted"
    return None


def _merge_all(
    store: Store,
    base: Artifact,
    result: AbsorbResult,
    staged: dict[str, dict[str, dict[str, Path]]],
    work: Path,
) -> tuple[list[LayerRecord], dict[str, PackedLayer]]:
    """Merge the promoted trees and the accepted deltas per family; refuse deltas in conflict."""
    judged = {d.tag: d for d in result.deltas}
    touched = sorted({fam for dirs in staged.values() for fam in dirs})
    base_dirs = {
        fam: unpack_record(store, get_family(fam), rec, work / "base" / fam)
        for fam in touched
        if (rec := base.config.layer(fam)) is not None
    }
    attempt = 0
    while True:
        attempt += 1
        merged: dict[str, dict[str, Path]] = {}
        refused: dict[str, str] = {}
        for fam_name in touched:
            fam = get_family(fam_name)
            sources = [("promoted", base_dirs[fam_name])]
            sources += [(t, dirs[fam_name]) for t, dirs in staged.items() if fam_name in dirs]
            comps = sorted({c for _, roots in sources for c in roots})
            dest = {c: work / "merged" / str(attempt) / fam_name / c for c in comps}
            merge = merge_family(fam, sources, dest)
            for conflict in merge.conflicts:
                refused.setdefault(conflict.other, f"conflict: {conflict.describe()}")
            merged[fam_name] = dest
        if not refused:
            break
        for t, why in refused.items():
            judged[t].accepted, judged[t].reason = False, why
            staged.pop(t, None)
        touched = sorted({fam for dirs in staged.values() for fam in dirs})
    return _repack(base.config, merged, result)


def _repack(
    base: ArtifactConfig, merged: dict[str, dict[str, Path]], result: AbsorbResult
) -> tuple[list[LayerRecord], dict[str, PackedLayer]]:
    """Pack each merged family; keep the promoted layer of every other."""
    records: list[LayerRecord] = []
    packed: dict[str, PackedLayer] = {}
    for rec in base.layers:
        dest = merged.get(rec.family)
        if dest is None:
            records.append(rec)
            continue
        fam = get_family(rec.family)
        by_name = {c.name: c for c in fam.components}
        located = [Located(by_name[c], p) for c, p in sorted(dest.items()) if p.is_dir()]
        out = next(iter(dest.values())).parent.parent / f"{rec.family}.tar.zst"
        layer = pack_family(fam, located, out, scope_key=rec.scope_key, scope=rec.scope)
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
        had = {f.path for f in rec.files}
        added = sorted(f.path for f in layer.files if f.path not in had)
        if added:
            result.contributed[rec.family] = added
    return records, packed


def _publish_candidate(
    store: Store,
    base: Artifact,
    result: AbsorbResult,
    *,
    records: list[LayerRecord],
    packed: dict[str, PackedLayer],
    work: Path,
) -> None:
    digests = [d.digest for d in result.accepted if d.digest is not None]
    provenance = base.config.provenance.model_copy(
        update={
            "source": "absorb",
            "extends": base.digest,
            "deltas": sorted(digests),
            "contributed": result.contributed,
        }
    )
    art = base.config.model_copy(
        update={
            "kind": "full",
            "layers": records,
            "rootfs": RootFS(diff_ids=[r.diff_id for r in records]),
            "provenance": provenance,
        }
    )
    tag = candidate_tag(base.digest, digests)
    pub = publish(store, art, packed, work, tags=[tag])
    result.candidate, result.digest, result.bytes_uploaded = tag, pub.digest, pub.bytes_uploaded


__all__ = [
    "CANDIDATE_TAG_PREFIX",
    "AbsorbResult",
    "DeltaJudged",
    "absorb",
    "candidate_tag",
]
