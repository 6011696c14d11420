"""Contribute: publish what a pod compiled after its restore as a quarantined ``kind: delta``.

A pod that served a shape the warm-up never sent compiled it, and ``status``
says "compiled anyway". :func:`contribute` keeps that work: from the restore
marker in the target it takes, per restored family, exactly the files the
verdict counts (:func:`artifactd.pod.verdict.written_since`: written since
the restore, the family's exclusions and load rewrites left out), packs them
per family as the format's layers (:func:`artifactd.format.archive.pack_family`)
and publishes them as one artifact of ``kind: delta`` whose config records
the pod's fingerprint hash, the manifest digest of the artifact it extends
(``provenance.extends``), the families' scope keys and the key that signed
it (``provenance.signer``).

* **Quarantined.** A delta is tagged ``delta-<sha256>`` only: never
  ``fp-<hash>`` nor a family's scope tag, and resolve's binding check
  (:func:`artifactd.restore.resolve.unbound`) refuses ``kind: delta`` behind
  any tag, so no restore installs one. ``artifactd absorb`` alone reads deltas
  (:mod:`artifactd.build.absorb`).
* **Content-addressed.** The tag hashes the artifact it extends and the
  layers' digests (packing is reproducible: fixed mtimes, sorted members), so
  two pods that compiled the same bytes publish one delta, and publishing
  again is a no-op.
* **Bounded.** The written files are sized from one ``lstat`` walk before
  anything is copied: more than ``max_bytes`` publishes nothing, and says so
  (exit 0), as a pod that compiled nothing does. The copy counts what it
  reads against the same cap, so files that grow past it while being copied
  stop the copy and publish nothing either. Each file is opened as input
  (:func:`artifactd.fsutil.open_regular`: a regular file, never a FIFO, the
  very file the walk sized); one that cannot be read is left out with a
  warning (``skipped``), the rest published. The staging copy lives in a
  temp dir (``TMPDIR``); a full one is a :class:`~artifactd.errors.NoSpaceError`
  (exit 9), an unwritable one a :class:`~artifactd.errors.TargetError`
  (exit 10): nothing is published, and the temp dir is emptied.
* **One base.** A delta extends one whole artifact: a pod restored from
  family tags (a partial match) or from several artifacts contributes nothing,
  since ``absorb`` could not say which artifact its entries extend.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, BinaryIO, NamedTuple

from artifactd import __version__
from artifactd.bounds import DELTA_MAX_BYTES
from artifactd.errors import ArtifactdError, NoSpaceError, NotFoundError, TargetError
from artifactd.families import Located, get_family
from artifactd.format.archive import pack_family
from artifactd.format.config import ArtifactConfig, LayerRecord, Provenance, RootFS
from artifactd.format.oci import DELTA_TAG_PREFIX
from artifactd.fsutil import InputFileError, open_regular
from artifactd.pod.verdict import restore_time, written_entries
from artifactd.restore import installed
from artifactd.restore.destination import CacheVolume
from artifactd.stores import open_store
from artifactd.stores.artifacts import publish, read_artifact
from artifactd.trust.signatures import sign

if TYPE_CHECKING:
    from artifactd.families.base import Family
    from artifactd.format.archive import PackedLayer
    from artifactd.restore.installed import Installed
    from artifactd.restore.markertypes import RestoreMarker
    from artifactd.trust.keys import PrivateKey


@dataclass
class FamilyDelta:
    """One family's part of a delta: the files written since the restore."""

    family: str
    files: int
    bytes: int
    layer_digest: str


@dataclass
class ContributeResult:
    """What :func:`contribute` did: published a delta, found it there already, or nothing."""

    target: str
    store: str
    published: bool
    reason: str
    tag: str | None = None
    digest: str | None = None
    extends: str | None = None
    fingerprint_hash: str | None = None
    #: True when the store held this delta already (another pod, or an earlier run).
    existed: bool = False
    signed_by: str | None = None
    families: list[FamilyDelta] = field(default_factory=list)
    bytes_uploaded: int = 0
    #: Written files left out because they could not be read: "family/component/path: why".
    skipped: list[str] = field(default_factory=list)


def delta_tag(extends: str, layer_digests: list[str]) -> str:
    """Return the content-addressed tag of a delta: ``delta-<sha256 of base and layers>``."""
    text = "\n".join([extends, *sorted(layer_digests)])
    return DELTA_TAG_PREFIX + hashlib.sha256(text.encode()).hexdigest()


def contribute(
    target: Path,
    store_ref: str,
    *,
    base_store: str | None = None,
    sign_key: PrivateKey | None = None,
    max_bytes: int = DELTA_MAX_BYTES,
    insecure: bool = False,
) -> ContributeResult:
    """Publish what the engine wrote under ``target`` since its restore (module doc).

    ``store_ref`` is the delta store (created if needed); ``base_store`` the
    store the extended artifact is read from (default: the marker's, the one
    the pod restored from), for its fingerprint and the families' scopes.
    Returns a result with ``published`` false, and the reason, when there is
    nothing to publish (nothing compiled, or over ``max_bytes``); raises when
    a store cannot be read or written, and :class:`NoSpaceError` or
    :class:`TargetError` when the temp dir cannot hold the staging copy.
    """
    volume = CacheVolume(target)
    result = ContributeResult(target=str(volume.root), store=store_ref, published=False, reason="")
    marker = volume.installed()
    if marker is None:
        result.reason = "no complete restore in the target: there is nothing a delta could extend"
        return result
    result.fingerprint_hash = marker["fingerprint_hash"]
    base_digest = _single_base(marker)
    if base_digest is None:
        result.reason = (
            "the restore installed families from family tags or several artifacts "
            f"(match {marker['match']}): a delta extends one whole artifact"
        )
        return result
    result.extends = base_digest
    cutoff = restore_time(volume.marker_path, marker["restored_at"])
    written = _written(marker, cutoff, installed.read(volume.state, marker))
    if not written:
        result.reason = "nothing was compiled since the restore: no delta to publish"
        return result
    total = sum(w.st.st_size for w in written)
    if total > max_bytes:
        result.reason = (
            f"the files written since the restore take {total} B, over the {max_bytes} B "
            "cap (--max-bytes): nothing copied, nothing published"
        )
        return result
    base = _read_base(base_store or marker["store"], base_digest, insecure=insecure)
    try:
        scratch = tempfile.TemporaryDirectory(
            prefix="artifactd-contribute-", ignore_cleanup_errors=True
        )
    except OSError as exc:
        raise _scratch_error(exc) from None
    with scratch as tmp:
        return _stage_and_publish(
            result,
            store_ref,
            written=written,
            max_bytes=max_bytes,
            base=base,
            marker=marker,
            work=Path(tmp),
            sign_key=sign_key,
            insecure=insecure,
        )


def _stage_and_publish(
    result: ContributeResult,
    store_ref: str,
    *,
    written: list[_Written],
    max_bytes: int,
    base: ArtifactConfig,
    marker: RestoreMarker,
    work: Path,
    sign_key: PrivateKey | None,
    insecure: bool,
) -> ContributeResult:
    """Copy the written files into ``work``, pack them, publish: what :func:`contribute` does."""
    assert result.extends is not None  # noqa: S101 - set before staging
    try:
        staged = _stage(written, work / "stage", max_bytes, result.skipped)
        if staged is None:
            result.reason = (
                f"the files written since the restore grew past the {max_bytes} B "
                "cap (--max-bytes) while they were copied: nothing published"
            )
            return result
        if not staged:
            result.reason = "no file written since the restore could be read: nothing published"
            return result
        art, packed = _pack(
            base, result.extends, marker=marker, staged=staged, work=work, sign_key=sign_key
        )
    except OSError as exc:
        raise _scratch_error(exc) from None
    return _publish(
        result,
        store_ref,
        art=art,
        packed=packed,
        work=work,
        sign_key=sign_key,
        insecure=insecure,
    )


def _single_base(marker: RestoreMarker) -> str | None:
    """Return the one whole artifact every restored family came from; None for anything else."""
    fams = marker["families"].values()
    digests = {fam["artifact"] for fam in fams}
    if marker["match"] != "full" or len(digests) != 1 or any(f["source"] != "full" for f in fams):
        return None
    return next(iter(digests))


class _Written(NamedTuple):
    """One file the verdict counts: its family, component, restored root and ``lstat``."""

    family: str
    component: str
    root: Path
    rel: PurePosixPath
    st: os.stat_result


def _written(marker: RestoreMarker, cutoff: float, recorded: Installed) -> list[_Written]:
    """Walk (``lstat`` only) the files the verdict counts, per restored family."""
    found: list[_Written] = []
    for name, fam_marker in sorted(marker["families"].items()):
        fam = get_family(name)
        rec = recorded.get(name, {})
        for component, root in sorted(fam_marker["dirs"].items()):
            for path, st in written_entries(fam, component, Path(root), cutoff, rec):
                rel = PurePosixPath(Path(path).relative_to(root).as_posix())
                found.append(_Written(name, component, Path(root), rel, st))
    return found


class _OverCapError(Exception):
    """The files grew past the cap while they were copied."""


def _stage(
    written: list[_Written], stage: Path, max_bytes: int, skipped: list[str]
) -> dict[str, tuple[dict[str, Path], int, int]] | None:
    """Copy the written files into ``stage``, per family: (dirs, files, bytes); None past the cap.

    At most ``max_bytes`` are read in all, whatever the files grew to since
    the walk. A file that cannot be read (or is not the one the walk saw) is
    left out, and named in ``skipped``.
    """
    staged: dict[str, tuple[dict[str, Path], int, int]] = {}
    budget = max_bytes
    for w in written:
        fam = get_family(w.family)
        dest_root = stage / w.family / w.component
        try:
            size = _copy_one(fam, w, dest_root, budget)
        except _OverCapError:
            return None
        except _UnreadableError as exc:
            skipped.append(f"{w.family}/{w.component}/{w.rel}: {exc}")
            continue
        budget -= size
        dirs, count, total = staged.get(w.family, ({}, 0, 0))
        dirs[w.component] = dest_root
        staged[w.family] = (dirs, count + 1, total + size)
    return staged


class _UnreadableError(Exception):
    """A written file that cannot be read as the regular file the walk saw."""


#: Bytes copied at a time.
_CHUNK = 1 << 20


def _copy_one(fam: Family, w: _Written, dest: Path, budget: int) -> int:
    """Copy one written file, reading at most ``budget`` bytes; return the bytes read.

    A path-bearing file is moved from the pod's root to the stage's. Raises
    :class:`_OverCapError` past the budget and :class:`_UnreadableError` for a source
    that cannot be read; an ``OSError`` is the stage's (writing).
    """
    out = dest / w.rel
    try:
        src = open_regular(w.root / w.rel, expect=w.st)
    except InputFileError as exc:
        raise _UnreadableError(exc.problem) from None
    with src:
        out.parent.mkdir(parents=True, exist_ok=True)
        if fam.path_bearing(w.component, w.rel):
            data = _read_source(src, budget + 1)
            if len(data) > budget:
                raise _OverCapError
            out.write_bytes(fam.relocate(fam.normalize(data, (str(w.root),)), str(dest)))
            read = len(data)
        else:
            read = 0
            with out.open("wb") as sink:
                while chunk := _read_source(src, min(_CHUNK, budget - read + 1)):
                    read += len(chunk)
                    if read > budget:
                        raise _OverCapError
                    sink.write(chunk)
        os.utime(out, ns=(w.st.st_atime_ns, w.st.st_mtime_ns))
        os.chmod(out, stat.S_IMODE(w.st.st_mode))
    return read


def _read_source(src: BinaryIO, n: int) -> bytes:
    """Read up to ``n`` bytes of a written file; a read error makes it unreadable."""
    try:
        return src.read(n)
    except OSError as exc:
        raise _UnreadableError(f"cannot be read ({exc.strerror or exc})") from None


def _scratch_error(exc: OSError) -> ArtifactdError:
    """Map a failure to write the staging copy in the temp dir to the error a user can act on."""
    where = f"{tempfile.gettempdir()} ({exc.strerror or exc})"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return NoSpaceError(
            f"the temp dir is out of space for the staging copy: {where}; nothing published",
            hint="point TMPDIR at a larger directory, or lower --max-bytes below its free space",
        )
    return TargetError(
        f"cannot write the staging copy in the temp dir: {where}; nothing published",
        hint="point TMPDIR at a writable directory",
    )


def _read_base(store_ref: str, digest: str, *, insecure: bool) -> ArtifactConfig:
    with open_store(store_ref, insecure=insecure) as st:
        art = read_artifact(st, digest)
    if art is None:
        raise NotFoundError(
            f"{store_ref} no longer holds {digest}, the artifact the pod restored",
            hint="pass --base-store with a store that holds it (the delta records it as its base)",
        )
    return art.config


def _pack(
    base: ArtifactConfig,
    base_digest: str,
    *,
    marker: RestoreMarker,
    staged: dict[str, tuple[dict[str, Path], int, int]],
    work: Path,
    sign_key: PrivateKey | None,
) -> tuple[ArtifactConfig, dict[str, PackedLayer]]:
    """Pack each family's staged files as its layer; return the delta's config and layers."""
    records: list[LayerRecord] = []
    packed: dict[str, PackedLayer] = {}
    for name, (dirs, _, _) in staged.items():
        fam = get_family(name)
        by_name = {c.name: c for c in fam.components}
        located = [Located(by_name[comp], path) for comp, path in sorted(dirs.items())]
        rec = base.layer(name)
        scope = rec.scope if rec is not None else {}
        scope_key = marker["families"][name]["scope_key"]
        layer = pack_family(
            fam, located, work / f"{name}.tar.zst", scope_key=scope_key, scope=scope
        )
        if not layer.files:
            continue  # only partial entries, which the harvest skips as invalid
        packed[name] = layer
        records.append(layer.record())
    provenance = Provenance(
        builder=__version__,
        source="delta",
        matrix=base.provenance.matrix,
        base_image=base.provenance.base_image,
        extends=base_digest,
        signer=None if sign_key is None else sign_key.id,
    )
    art = ArtifactConfig(
        architecture=base.architecture,
        rootfs=RootFS(diff_ids=[r.diff_id for r in records]),
        kind="delta",
        fingerprint=base.fingerprint,
        fingerprint_hash=marker["fingerprint_hash"],
        layers=records,
        provenance=provenance,
    )
    return art, packed


def _publish(
    result: ContributeResult,
    store_ref: str,
    *,
    art: ArtifactConfig,
    packed: dict[str, PackedLayer],
    work: Path,
    sign_key: PrivateKey | None,
    insecure: bool,
) -> ContributeResult:
    if not art.layers:
        result.reason = "only partial entries were written since the restore: nothing to publish"
        return result
    assert result.extends is not None  # noqa: S101 - set before packing
    tag = delta_tag(result.extends, [rec.digest for rec in art.layers])
    result.tag = tag
    result.families = [
        FamilyDelta(rec.family, len(rec.files), rec.unpacked_size, rec.digest) for rec in art.layers
    ]
    with open_store(store_ref, create=True, insecure=insecure) as st:
        existing = st.tag_digest(tag)
        if existing is not None:
            result.published, result.existed, result.digest = True, True, existing
            result.reason = "this delta is in the store already (another pod compiled the same)"
            return result
        pub = publish(st, art, packed, work, tags=[tag])
        result.digest, result.bytes_uploaded = pub.digest, pub.bytes_uploaded
        if sign_key is not None:
            result.signed_by = sign(st, pub.digest, sign_key).key_id
    result.published = True
    result.reason = f"published {sum(len(r.files) for r in art.layers)} file(s) as {tag}"
    return result


__all__ = [
    "DELTA_TAG_PREFIX",
    "ContributeResult",
    "FamilyDelta",
    "contribute",
    "delta_tag",
]
