"""Build provenance: an in-toto Statement (v1) with an SLSA provenance (v1) predicate.

``build`` and ``merge`` attach one to the artifact they publish (and
``verify --sign-key`` another, with the gate's verdict), in a DSSE envelope
signed with the publishing key, under
``sha256-<hex>.att`` (:func:`artifactd.trust.signatures.attest`). Where artifactd's facts
go in SLSA's shape:

* ``buildDefinition.buildType``: :data:`BUILD_TYPE`.
* ``externalParameters.matrix``: the warm-up matrix file: its name, sha256 and
  whole text (what a reviewer reads to know what was compiled);
  ``externalParameters.runId`` for fan-out builds.
* ``internalParameters``: the fingerprint (hash and document) the caches are
  valid for, and the families with their scope keys.
* ``resolvedDependencies``: the base image, by digest, when the matrix names it.
* ``runDetails.builder``: ``id`` :data:`BUILDER_ID`, ``version.artifactd``.
* ``runDetails.metadata``: ``invocationId`` (the run id), start and finish.
* ``runDetails.byproducts``: the cells with their timings and checks, the
  hygiene lint's result, and the ``verify`` gate's result when one ran. Each
  is a resource descriptor whose ``annotations`` hold the JSON.

The subject is the artifact's manifest digest, named by its repository.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from artifactd import __version__

if TYPE_CHECKING:
    from artifactd.format.config import ArtifactConfig

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
SLSA_PROVENANCE_V1 = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "https://artifactd.dev/build/v1"
BUILDER_ID = "https://artifactd.dev/builder"
#: A matrix file larger than this is recorded by digest only.
MAX_MATRIX_TEXT = 256 << 10


def _rfc3339(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def matrix_parameters(path: Path | None) -> dict[str, Any] | None:
    """Return the matrix file's name, sha256 and text (text left out past 256 KiB)."""
    if path is None:
        return None
    data = path.read_bytes()
    doc: dict[str, Any] = {
        "path": path.name,
        "digest": {"sha256": hashlib.sha256(data).hexdigest()},
    }
    if len(data) <= MAX_MATRIX_TEXT:
        doc["content"] = data.decode("utf-8", errors="replace")
    return doc


def statement(
    subject_name: str,
    digest: str,
    art: ArtifactConfig,
    *,
    matrix: Path | None = None,
    cells: Sequence[Mapping[str, Any]] = (),
    lint: Mapping[str, Any] | None = None,
    verify: Mapping[str, Any] | None = None,
    started: float | None = None,
    finished: float | None = None,
) -> dict[str, Any]:
    """Return the in-toto Statement about manifest ``digest`` (module doc for the layout).

    ``cells`` are plain documents (id, seconds, returncode, checks...), as the
    build's report has them; ``lint`` and ``verify`` likewise.
    """
    prov = art.provenance
    external: dict[str, Any] = {}
    matrix_doc = matrix_parameters(matrix)
    if matrix_doc is not None:
        external["matrix"] = matrix_doc
    elif prov.matrix:
        external["matrix"] = {"name": prov.matrix}
    if prov.run_id:
        external["runId"] = prov.run_id
    deps = []
    if prov.base_image:
        algo, _, hexdigest = prov.base_image.rpartition("@")[2].partition(":")
        deps.append({"uri": f"oci:{prov.base_image}", "digest": {algo: hexdigest}})
    # A candidate absorbed from pods' deltas: what it extends and which deltas it holds.
    for name, ref in [("extends", prov.extends), *(("delta", d) for d in prov.deltas)]:
        if ref is not None:
            algo, _, hexdigest = ref.partition(":")
            deps.append({"name": name, "digest": {algo: hexdigest}})
    byproducts: list[dict[str, Any]] = [
        {
            "name": "cells",
            "annotations": {
                "cells": list(cells)
                or [
                    {
                        "id": c,
                        "seconds": prov.timings.get(f"cell:{c}"),
                        "checks": prov.checks.get(c),
                    }
                    for c in prov.cells
                ]
            },
        }
    ]
    if prov.contributed:
        byproducts.append({"name": "contributed", "annotations": dict(prov.contributed)})
    if lint is not None:
        byproducts.append({"name": "lint", "annotations": dict(lint)})
    if verify is not None:
        byproducts.append({"name": "verify", "annotations": dict(verify)})
    metadata: dict[str, Any] = {}
    if prov.run_id:
        metadata["invocationId"] = prov.run_id
    if started is not None:
        metadata["startedOn"] = _rfc3339(started)
    if finished is not None:
        metadata["finishedOn"] = _rfc3339(finished)
    algo, _, hexdigest = digest.partition(":")
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": subject_name, "digest": {algo: hexdigest}}],
        "predicateType": SLSA_PROVENANCE_V1,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": external,
                "internalParameters": {
                    "source": prov.source,
                    "fingerprintHash": art.fingerprint_hash,
                    "fingerprint": art.fingerprint.model_dump(mode="json"),
                    "families": {r.family: r.scope_key for r in art.layers},
                },
                "resolvedDependencies": deps,
            },
            "runDetails": {
                "builder": {"id": BUILDER_ID, "version": {"artifactd": __version__}},
                "metadata": metadata,
                "byproducts": byproducts,
            },
        },
    }


def _obj(value: Any) -> dict[str, Any]:
    """``value`` if it is a JSON object, else an empty one (attestations are untrusted input)."""
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def summary(predicate: Mapping[str, Any]) -> dict[str, Any]:
    """Return the few facts ``inspect`` shows of an SLSA predicate artifactd wrote.

    Any shape is accepted (a field of the wrong type reads as absent): this
    runs on whatever a store holds, signed or not.
    """
    build_def = _obj(predicate.get("buildDefinition"))
    run = _obj(predicate.get("runDetails"))
    matrix = _obj(_obj(build_def.get("externalParameters")).get("matrix"))
    out: dict[str, Any] = {
        "build_type": build_def.get("buildType"),
        "builder": _obj(run.get("builder")).get("version"),
        "matrix": matrix.get("path") or matrix.get("name"),
        "matrix_sha256": _obj(matrix.get("digest")).get("sha256"),
        "base_image": [_obj(d).get("uri") for d in _list(build_def.get("resolvedDependencies"))],
    }
    for item in _list(run.get("byproducts")):
        name, ann = _obj(item).get("name"), _obj(item).get("annotations")
        if name == "cells" and isinstance(ann, dict):
            out["cells"] = len(_list(ann.get("cells")))
        elif name in ("lint", "verify") and isinstance(ann, dict):
            out[name] = ann
    return out
