"""Harvest: pack the caches a warm-up wrote and publish them as one artifact.

The caches are found exactly where the libraries themselves look (each
family's env var, else its default), so a CI stage can run any warm-up its own
way and harvest right after it.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from artifactd import __version__
from artifactd.constants import current_environ
from artifactd.errors import BuildError
from artifactd.events import EventSink, discard
from artifactd.families import select_families
from artifactd.fingerprint.model import Fingerprint, from_raw
from artifactd.fingerprint.probe import probe_request
from artifactd.format.archive import PackedLayer, pack_family
from artifactd.format.config import ArtifactConfig, LayerRecord, Provenance, RootFS, goarch
from artifactd.stores import Store, open_store
from artifactd.stores.artifacts import PublishResult, publish
from artifactd.trust.signatures import sign_all

if TYPE_CHECKING:
    from artifactd.format.canary import Canary
    from artifactd.trust.keys import PrivateKey
    from artifactd.trust.signatures import SignResult


@dataclass
class FamilyHarvest:
    """One family's part of a harvest."""

    family: str
    found: dict[str, str]
    files: int = 0
    bytes: int = 0
    skipped: int = 0
    layer_digest: str | None = None
    layer_size: int = 0
    scope_key: str | None = None


@dataclass
class HarvestResult:
    """What a harvest packed and published."""

    store: str
    digest: str
    tags: list[str]
    fingerprint_hash: str
    families: list[FamilyHarvest]
    not_found: list[str]
    bytes_uploaded: int
    bytes_skipped: int
    seconds: float
    publish: PublishResult | None = field(default=None, repr=False)
    #: What ``--sign-key`` signed and attested.
    signing: SignResult | None = None


def collect(
    fingerprint: Fingerprint,
    *,
    families: Sequence[str] | None,
    environ: Mapping[str, str],
    work: Path,
) -> tuple[list[LayerRecord], dict[str, PackedLayer], list[FamilyHarvest], list[str]]:
    """Locate and pack every requested family; return records, packed layers and a report."""
    records: list[LayerRecord] = []
    packed: dict[str, PackedLayer] = {}
    report: list[FamilyHarvest] = []
    not_found: list[str] = []
    for fam in select_families(families):
        located = fam.locate(environ)
        if not located:
            not_found.append(fam.name)
            continue
        key = fingerprint.scope_key(fam.name, fam.scope, fam.scope_revision)
        scope = fingerprint.select(fam.scope)
        layer = pack_family(fam, located, work / f"{fam.name}.tar.zst", scope_key=key, scope=scope)
        if not layer.files:
            not_found.append(fam.name)
            continue
        facts = {
            loc.component.name: f
            for loc in located
            if (f := fam.facts(loc.component.name, loc.path))
        }
        records.append(layer.record(facts=facts))
        packed[fam.name] = layer
        report.append(
            FamilyHarvest(
                family=fam.name,
                found={loc.component.name: str(loc.path) for loc in located},
                files=len(layer.files),
                bytes=layer.unpacked_size,
                skipped=len(layer.skipped),
                layer_digest=layer.digest,
                layer_size=layer.size,
                scope_key=key,
            )
        )
    return records, packed, report, not_found


def harvest(
    store: Store,
    fingerprint: Fingerprint,
    *,
    families: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
    provenance: Provenance | None = None,
    on_event: EventSink = discard,
    cell_tag: str | None = None,
    sign_key: PrivateKey | None = None,
    canaries: Sequence[Canary] = (),
) -> HarvestResult:
    """Pack the caches found through ``environ`` and publish them to ``store``.

    With ``cell_tag``, the artifact is one cell's part of a fan-out build
    (``kind: cell``), published under that tag alone, for ``merge``. With
    ``sign_key``, every manifest published (the artifact and each family's)
    is signed (:func:`artifactd.trust.signatures.sign_all`). ``canaries``
    (a build's serve cells recorded them) go into the config, under its signature. Raises
    :class:`BuildError` when no requested family has anything to harvest.
    """
    start = time.monotonic()
    environ = current_environ() if environ is None else environ
    # Probe time would make every harvest of the same caches a new config blob.
    fingerprint = fingerprint.model_copy(
        update={"info": fingerprint.info.model_copy(update={"probed_at": None})}
    )
    with tempfile.TemporaryDirectory(prefix="artifactd-harvest-") as tmp:
        work = Path(tmp)
        records, packed, report, not_found = collect(
            fingerprint, families=families, environ=environ, work=work
        )
        if not records:
            raise BuildError(
                "found no cache to harvest"
                + (f" (looked for: {', '.join(not_found)})" if not_found else ""),
                hint="run the warm-up first, with the same TRITON_CACHE_DIR / "
                "TORCHINDUCTOR_CACHE_DIR / ARTIFACTD_GENERIC_DIR as this command sees",
            )
        art = ArtifactConfig(
            architecture=goarch(fingerprint.platform.machine),
            rootfs=RootFS(diff_ids=[r.diff_id for r in records]),
            fingerprint=fingerprint,
            fingerprint_hash=fingerprint.hash,
            layers=records,
            provenance=provenance or Provenance(builder=__version__),
            kind="cell" if cell_tag else "full",
            canaries=list(canaries),
        )
        tags = [cell_tag] if cell_tag else None
        pub = publish(store, art, packed, work, on_event=on_event, tags=tags)
    signing = None
    if sign_key is not None:
        signing = sign_all(store, [pub.digest, *pub.family_digests.values()], sign_key)
        on_event({"stage": "sign", "event": "done", "signed": len(signing.signed)})
    return HarvestResult(
        store=store.ref,
        digest=pub.digest,
        tags=pub.tags,
        fingerprint_hash=art.fingerprint_hash,
        families=report,
        not_found=not_found,
        bytes_uploaded=pub.bytes_uploaded,
        bytes_skipped=pub.bytes_skipped,
        seconds=round(time.monotonic() - start, 3),
        publish=pub,
        signing=signing,
    )


def harvest_here(
    store_ref: str,
    *,
    insecure: bool = False,
    families: Sequence[str] | None = None,
    gpu_arch: str | None = None,
    image_digest: str | None = None,
    workload: Sequence[str] = (),
    overrides: Sequence[str] = (),
    on_event: EventSink = discard,
    sign_key: PrivateKey | None = None,
) -> HarvestResult:
    """Probe this machine, then harvest its caches into the store ``store_ref``.

    What ``artifactd harvest`` does: ``workload`` holds ``KEY=VALUE`` strings and
    ``overrides`` ``PATH=VALUE`` assignments, as :func:`artifactd.fingerprint.probe.probe_request`
    reads them; the store is created when it does not exist.
    """
    fingerprint = from_raw(
        probe_request(
            gpu_arch=gpu_arch, image_digest=image_digest, workload=workload, overrides=overrides
        )
    )
    with open_store(store_ref, create=True, insecure=insecure) as store:
        return harvest(store, fingerprint, families=families, on_event=on_event, sign_key=sign_key)
